// Charts drawn with uPlot (vendored, static/uPlot.iife.min.js) from the JSON a page embeds in
// <div data-chart="memory|curves"><script type="application/json">…</script></div>.
// What a reader picked (zoom, metric, smoothing, log scale, bands) is kept per chart across the
// live page's redraws.
(function(){
  var kept = {};  // chart key -> {xmin, xmax, metric, smooth, log, band}
  var MiB_PER_GiB = 1024;
  function utc(ts){ return uPlot.tzDate(new Date(ts * 1e3), 'Etc/UTC'); }
  function width(el){ return Math.max(280, Math.floor(el.getBoundingClientRect().width || el.clientWidth || 600)); }
  function el(tag, attrs, text){
    var e = document.createElement(tag);
    for (var k in attrs) if (Object.prototype.hasOwnProperty.call(attrs, k)) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function keepZoom(key){
    return {
      setSelect: [function(u){
        if (u.select.width < 3) return;
        var st = kept[key] = kept[key] || {};
        st.xmin = u.posToVal(u.select.left, 'x'); st.xmax = u.posToVal(u.select.left + u.select.width, 'x');
      }],
      ready: [function(u){
        u.over.addEventListener('dblclick', function(){
          if (kept[key]) { delete kept[key].xmin; delete kept[key].xmax; }
        });
      }]
    };
  }
  // The axes' font, set on them and used to measure their labels.
  var AXIS_FONT = '12px system-ui, -apple-system, "Segoe UI", Roboto, sans-serif';
  var measurer = null;
  function textPx(text){
    measurer = measurer || document.createElement('canvas').getContext('2d');
    measurer.font = AXIS_FONT;
    return measurer.measureText(text).width;
  }
  // what uPlot drew on each axis (it draws on a canvas): its labels, where they sit (CSS px from
  // the plot's left or top) and the widest label's width, for readers of the page's DOM and its tests
  function noteAxes(box){
    return function(u){ box.dataset.axes = JSON.stringify(u.axes.map(function(a){
      var ticks = a._values || [];
      return {label: a.label, ticks: ticks, label_px: Math.ceil(Math.max.apply(null, [0].concat(ticks.map(textPx)))),
              pos: (a._splits || []).map(function(v){ return Math.round(u.valToPos(v, a.scale)); })};
    })); };
  }
  function restoreZoom(u, key, box){
    var st = kept[key], zoomed = !!(st && st.xmin !== undefined);
    if (zoomed) u.setScale('x', {min: st.xmin, max: st.xmax});
    box.dataset.zoomed = zoomed ? 'yes' : 'no';
  }
  function fit(u, box){
    if (!window.ResizeObserver) return;
    box._observer = new ResizeObserver(function(){
      var p = box._plot; if (p && Math.abs(width(box) - p.width) > 4) p.setSize({width: width(box), height: p.height});
    });
    box._observer.observe(box);
  }
  // 24-hour UTC times on the time axis; the date too when the chart spans more than a day
  function timeFormat(span){
    return span > 86400 ? '{MM}-{DD} {HH}:{mm}' : span > 600 ? '{HH}:{mm}' : '{HH}:{mm}:{ss}';
  }
  function timeLabels(u, splits){
    var fmt = uPlot.fmtDate(timeFormat(u.scales.x.max - u.scales.x.min));
    return splits.map(function(v){ return fmt(utc(v)); });
  }
  // Ticks no closer than the widest label this span's format draws, plus a gap: whatever the
  // chart's width in pixels, the labels never run together ("10:17:4510:18:00").
  function timeSpace(u, axisIdx, min, max){
    var widest = uPlot.fmtDate(timeFormat(max - min))(utc(Date.UTC(2000, 11, 28, 20, 58, 58) / 1e3));
    return Math.ceil(textPx(widest)) + 24;
  }
  function gib(v){ return v == null ? '-' : (v / MiB_PER_GiB).toFixed(1) + ' GiB'; }

  // ---------------------------------------------------------------- memory: stacked bands per GPU
  function memory(box, spec){
    var key = 'memory-' + spec.gpu, n = spec.ts.length, bands = spec.bands;
    // stacked from the bottom: series k draws the sum of bands 0..k, and is drawn top first so
    // each lower sum paints over the one above it
    var sums = [], acc = new Array(n).fill(0);
    bands.forEach(function(b){ acc = acc.map(function(a, i){ return a + b.mib[i]; }); sums.push(acc.slice()); });
    var stamp = uPlot.fmtDate('{YYYY}-{MM}-{DD} {HH}:{mm}:{ss}');
    var data = [spec.ts];
    var series = [{label: 'time (UTC)', value: function(u, v){ return v == null ? '-' : stamp(utc(v)); }}];
    for (var k = bands.length - 1; k >= 0; k--) {
      (function(k){
        var b = bands[k];
        data.push(sums[k].map(function(v){ return v / MiB_PER_GiB; }));
        series.push({label: b.label, stroke: b.colour, fill: b.colour, width: 0.5, points: {show: false},
                     value: function(u, v, si, i){ return i == null ? '-' : gib(b.mib[i]); }});
      })(k);
    }
    var ooms = spec.ooms || [];
    var opts = {
      width: width(box), height: 200, tzDate: utc, cursor: {drag: {x: true, y: false}},
      scales: {x: {time: true}, y: {range: [0, Math.max(spec.total_mib / MiB_PER_GiB, 0.001)]}},
      axes: [{label: 'time (UTC)', labelSize: 18, font: AXIS_FONT, values: timeLabels, space: timeSpace},
             {label: 'GPU memory (GiB)', labelSize: 18, size: 56, font: AXIS_FONT,
              values: function(u, vals){ return vals.map(function(v){ return v + ' GiB'; }); }}],
      series: series,
      hooks: Object.assign(keepZoom(key), {
        draw: [noteAxes(box), function(u){
          var ctx = u.ctx; ctx.save();
          ooms.forEach(function(o){
            var x = u.valToPos(o.ts, 'x', true);
            if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) return;
            ctx.strokeStyle = '#d64545'; ctx.fillStyle = '#d64545'; ctx.lineWidth = 1.5 * devicePixelRatio;
            ctx.setLineDash([4 * devicePixelRatio, 3 * devicePixelRatio]);
            ctx.beginPath(); ctx.moveTo(x, u.bbox.top); ctx.lineTo(x, u.bbox.top + u.bbox.height); ctx.stroke();
            ctx.setLineDash([]); var s = 6 * devicePixelRatio;
            ctx.beginPath(); ctx.moveTo(x - s, u.bbox.top); ctx.lineTo(x + s, u.bbox.top);
            ctx.lineTo(x, u.bbox.top + 1.6 * s); ctx.closePath(); ctx.fill();
          });
          ctx.restore();
        }]
      })
    };
    var u = box._plot = new uPlot(opts, data, box.querySelector('.plot'));
    restoreZoom(u, key, box); fit(u, box);
    box.dataset.drawn = 'yes';
  }

  // ---------------------------------------------------------------- curves: runs overlaid
  function smooth(values, w){
    if (!w) return values;
    var out = [], last = 0, debias = 0;
    for (var i = 0; i < values.length; i++) {
      var v = values[i];
      if (v == null || !isFinite(v)) { out.push(null); continue; }
      last = last * w + (1 - w) * v; debias = debias * w + (1 - w);
      out.push(last / debias);
    }
    return out;
  }
  function align(lines){
    // lines: [{steps, values}] -> [xs, ys1, ys2, ...] on the union of steps (null where a line has none)
    var xs = {}; lines.forEach(function(l){ l.steps.forEach(function(s){ xs[s] = true; }); });
    var x = Object.keys(xs).map(Number).sort(function(a, b){ return a - b; });
    var at = {}; x.forEach(function(s, i){ at[s] = i; });
    var out = [x];
    lines.forEach(function(l){
      var y = new Array(x.length).fill(null);
      l.steps.forEach(function(s, i){ y[at[s]] = l.values[i]; });
      out.push(y);
    });
    return out;
  }
  // where a later attempt took over a stitched curve (a resume): a dashed tick in the run's colour
  function resumeMarks(u, marks){
    var ctx = u.ctx; ctx.save();
    marks.forEach(function(m){
      var x = u.valToPos(m.step, 'x', true);
      if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) return;
      ctx.strokeStyle = m.colour; ctx.lineWidth = 1 * devicePixelRatio;
      ctx.setLineDash([3 * devicePixelRatio, 3 * devicePixelRatio]);
      ctx.beginPath(); ctx.moveTo(x, u.bbox.top); ctx.lineTo(x, u.bbox.top + u.bbox.height); ctx.stroke();
      ctx.setLineDash([]); ctx.fillStyle = m.colour; ctx.font = (10 * devicePixelRatio) + 'px sans-serif';
      ctx.fillText('resumed', x + 3 * devicePixelRatio, u.bbox.top + 10 * devicePixelRatio);
    });
    ctx.restore();
  }
  // where early stopping stopped a run: a ✕ in its colour at the last point drawn, its title (the
  // tooltip) the prune's words; elements over the plot, so a pointer and a test can find them
  function prunedMarks(u, list){
    u.over.querySelectorAll('.pruned-mark').forEach(function(e){ e.remove(); });
    var w = u.over.clientWidth, h = u.over.clientHeight;
    list.forEach(function(p){
      var x = u.valToPos(p.step, 'x'), y = u.valToPos(p.value, 'y');
      if (!isFinite(x) || !isFinite(y) || x < 0 || x > w || y < 0 || y > h) return;  // zoomed out of view
      u.over.appendChild(el('span', {'class': 'pruned-mark', title: p.why, 'data-run': p.run,
                                     style: 'left:' + x + 'px;top:' + y + 'px;color:' + p.colour}, '\u2715'));
    });
  }
  // The curves page's address names the metric drawn (`&metric=eval_accuracy`): a copied link shows it.
  function linkMetric(key, metric){
    if (key !== 'curves' || !window.history || !history.replaceState) return;
    var url = new URL(window.location.href);
    url.searchParams.set('metric', metric);
    history.replaceState(history.state, '', url.toString());
    var hidden = document.querySelector('form.filters input[name="metric"]');
    if (hidden) hidden.value = metric;
  }
  function curves(box, spec){
    var key = spec.key || 'curves', st = kept[key] = kept[key] || {};
    var metrics = spec.metrics || [], labels = spec.labels || {};
    // a metric's name as a person reads it (escaped as the page's text is); the name itself is
    // what the address and the hidden field carry
    var shownName = function(m){ return labels[m] !== undefined ? labels[m] : m; };
    if (st.metric === undefined || metrics.indexOf(st.metric) < 0) {
      st.metric = metrics.indexOf(spec.metric) >= 0 ? spec.metric : metrics[0];
    }
    if (st.smooth === undefined) st.smooth = spec.smooth || 0;
    if (st.log === undefined) st.log = !!spec.log;
    if (st.band === undefined) st.band = !!spec.band;
    var controls = box.querySelector('.controls'), plot = box.querySelector('.plot'), note = box.querySelector('.note');
    controls.textContent = '';
    if (!metrics.length) {
      plot.textContent = ''; note.textContent = spec.empty || 'no curve reported yet'; box.dataset.drawn = 'yes';
      return;
    }
    var pick = el('select', {'class': 'metric', 'aria-label': 'metric'});
    metrics.forEach(function(m){
      var o = el('option', {value: m}, shownName(m)); if (m === st.metric) o.selected = true; pick.appendChild(o);
    });
    var sm = el('input', {type: 'range', min: '0', max: '0.99', step: '0.01', value: String(st.smooth),
                          'class': 'smooth', 'aria-label': 'smoothing'});
    var smv = el('span', {'class': 'muted'}, String(st.smooth));
    var lg = el('input', {type: 'checkbox', 'class': 'log'}); lg.checked = st.log;
    var lbl = function(text, input){
      var l = el('label'); l.appendChild(document.createTextNode(text + ' ')); l.appendChild(input); return l;
    };
    controls.appendChild(lbl('metric', pick));
    var sl = lbl('smoothing', sm); sl.appendChild(smv); controls.appendChild(sl);
    controls.appendChild(lbl('log scale', lg));
    var bd = null;
    if (spec.bands) {
      bd = el('input', {type: 'checkbox', 'class': 'band'}); bd.checked = st.band;
      controls.appendChild(lbl('seeds of a config as a band', bd));
    }
    var u = null;
    st.hidden = st.hidden || {};
    // the legend: a compact table, a row per run with a toggle, its colour and its columns
    function legend(){
      var box2 = box.querySelector('.legend'); if (!box2) return;
      box2.textContent = '';
      var cols = spec.columns || [];
      var t = el('table', {'class': 'curve-legend'}), head = el('tr');
      var all = el('input', {type: 'checkbox', 'class': 'toggle-all', 'aria-label': 'all runs'});
      all.checked = spec.runs.every(function(r){ return !st.hidden[r.key]; });
      var th0 = el('th'); th0.appendChild(all); head.appendChild(th0); head.appendChild(el('th', {}, ''));
      (cols.length ? cols : ['run']).forEach(function(c){ head.appendChild(el('th', {}, c)); });
      var thead = el('thead'); thead.appendChild(head); t.appendChild(thead);
      var body = el('tbody');
      spec.runs.forEach(function(r){
        var tr = el('tr', {'data-run': r.key, 'class': (st.hidden[r.key] ? 'off' : '') + (r.pruned ? ' pruned' : '')});
        if (r.pruned) tr.title = r.pruned.why;
        var cb = el('input', {type: 'checkbox', 'class': 'toggle', 'aria-label': r.label});
        cb.checked = !st.hidden[r.key];
        cb.addEventListener('change', function(){
          if (cb.checked) delete st.hidden[r.key]; else st.hidden[r.key] = true;
          legend(); draw();
        });
        var td0 = el('td'); td0.appendChild(cb); tr.appendChild(td0);
        var sw = el('td'), i = el('i', {'class': 'swatch', style: 'background:' + r.colour});
        sw.appendChild(i); tr.appendChild(sw);
        (cols.length ? r.cells : [r.label]).forEach(function(v, k){
          var td = el('td');
          if (k === 0 && r.href) { var a = el('a', {href: r.href}, v); td.appendChild(a); } else td.textContent = v;
          tr.appendChild(td);
        });
        body.appendChild(tr);
      });
      all.addEventListener('change', function(){
        spec.runs.forEach(function(r){ if (all.checked) delete st.hidden[r.key]; else st.hidden[r.key] = true; });
        legend(); draw();
      });
      t.appendChild(body); box2.appendChild(t);
    }
    function draw(){
      if (u) { u.destroy(); u = null; }
      var lines = [], series = [{label: 'step'}], bandsOpt = [], bad = false, without = null, marks = [], pruned = [];
      if (st.band && spec.bands) {
        (spec.bands[st.metric] || []).forEach(function(b){
          var lo = smooth(b.lo, st.smooth), hi = smooth(b.hi, st.smooth), mean = smooth(b.mean, st.smooth);
          var base = lines.length + 1;
          lines.push({steps: b.steps, values: hi}, {steps: b.steps, values: lo}, {steps: b.steps, values: mean});
          var edge = {stroke: b.colour, width: 0.5, alpha: 0.6, points: {show: false}, spanGaps: true};
          series.push(Object.assign({label: b.label + ' max'}, edge), Object.assign({label: b.label + ' min'}, edge),
                      {label: b.label + ' mean (n=' + b.n + ' seeds)', stroke: b.colour, width: 2,
                       points: {show: false}, spanGaps: true});
          bandsOpt.push({series: [base, base + 1], fill: b.colour + '33'});
        });
      } else {
        without = [];
        spec.runs.forEach(function(r){
          if (st.hidden[r.key]) return;
          var c = r.curves[st.metric]; if (!c) { without.push(r.label); return; }
          var ys = smooth(c[1], st.smooth);
          lines.push({steps: c[0], values: ys});
          series.push({label: r.label, stroke: r.colour, width: 1.6, dash: r.dash || undefined,
                       points: {show: false}, spanGaps: true});
          (r.marks || []).forEach(function(m){ marks.push({step: m, colour: r.colour}); });
          for (var i = ys.length - 1; r.pruned && i >= 0; i--) {
            if (ys[i] != null) {
              pruned.push({step: c[0][i], value: ys[i], colour: r.colour, why: r.pruned.why, run: r.key});
              break;
            }
          }
        });
      }
      var data = align(lines);
      if (st.log) data.slice(1).forEach(function(y){ y.forEach(function(v){ if (v != null && v <= 0) bad = true; }); });
      var notes = [];
      if (bad) notes.push('log scale needs values above 0: shown on a linear scale');
      if (without && without.length) notes.push('no ' + shownName(st.metric) + ' reported by: ' + without.join('; '));
      note.textContent = notes.join(' · ');
      var opts = {
        width: width(box), height: 260, cursor: {drag: {x: true, y: false}},
        scales: {x: {time: false}, y: {distr: st.log && !bad ? 3 : 1}},
        axes: [{label: 'step', labelSize: 18},
               {label: shownName(st.metric) + (st.smooth ? ' (smoothed ' + st.smooth + ')' : ''),
                labelSize: 18, size: 60}],
        legend: {show: !!(st.band && spec.bands)}, series: series, bands: bandsOpt,  // runs: the table below
        hooks: Object.assign(keepZoom(key), {
          draw: [noteAxes(box), function(u){ resumeMarks(u, marks); prunedMarks(u, pruned); }]
        })
      };
      u = box._plot = new uPlot(opts, data, plot);
      restoreZoom(u, key, box);
      box.dataset.drawn = 'yes'; box.dataset.series = String(series.length - 1);
      box.dataset.marks = String(marks.length);
      box.dataset.pruned = String(pruned.length);
      box.dataset.metric = st.metric; box.dataset.log = st.log && !bad ? 'yes' : 'no';
    }
    pick.addEventListener('change', function(){
      st.metric = pick.value; delete st.xmin; delete st.xmax; draw(); linkMetric(key, st.metric);
    });
    sm.addEventListener('input', function(){ st.smooth = +sm.value; smv.textContent = sm.value; draw(); });
    lg.addEventListener('change', function(){ st.log = lg.checked; draw(); });
    if (bd) bd.addEventListener('change', function(){ st.band = bd.checked; draw(); });
    legend();
    draw();
    fit(u, box);
  }

  var kinds = {memory: memory, curves: curves};
  // before a live redraw replaces them: uPlot listens on the window until destroyed
  window.orchChartsDestroy = function(root){
    (root || document).querySelectorAll('[data-chart]').forEach(function(box){
      if (box._observer) box._observer.disconnect();
      if (box._plot) box._plot.destroy();
      box._plot = box._observer = null;
    });
  };
  window.orchCharts = function(root){
    if (!window.uPlot) return;
    (root || document).querySelectorAll('[data-chart]').forEach(function(box){
      var data = box.querySelector('script[type="application/json"]');
      var draw = kinds[box.dataset.chart];
      if (!data || !draw) return;
      try { draw(box, JSON.parse(data.textContent)); } catch (e) { box.dataset.error = String(e); }
    });
  };
})();
