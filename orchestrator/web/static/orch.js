(function(){
  var q = new URLSearchParams(location.search), token = q.get('token');
  try {
    if (token) sessionStorage.setItem('orch-token', token); else token = sessionStorage.getItem('orch-token');
  } catch (e) {}
  if (q.has('token')) {  // kept for this tab; out of the address bar, history and shared links
    q.delete('token'); var rest = q.toString();
    history.replaceState(null, '', location.pathname + (rest ? '?' + rest : ''));
  }
  var live = document.getElementById('live'), busy = false, again = false, sort = null, picking = false;
  document.addEventListener('change', function(ev){
    var form = ev.target.closest && ev.target.closest('#live form');
    if (form && !form.classList.contains('action') && !ev.target.closest('[data-chart]')) picking = true;
  });
  function applySort(){
    if (!sort) return;
    var table = document.querySelector('table.sortable'); if (!table) return;
    var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
    rows.sort(function(a, b){
      var x = a.cells[sort.col], y = b.cells[sort.col];
      var xv = x.dataset.v !== undefined ? parseFloat(x.dataset.v) : x.textContent;
      var yv = y.dataset.v !== undefined ? parseFloat(y.dataset.v) : y.textContent;
      if (typeof xv === 'number' && isNaN(xv)) xv = -Infinity; if (typeof yv === 'number' && isNaN(yv)) yv = -Infinity;
      return (xv < yv ? -1 : xv > yv ? 1 : 0) * sort.dir;
    });
    rows.forEach(function(r){ body.appendChild(r); });
  }
  // A log opens at its end (where the result or the traceback is); a reader who scrolled up
  // keeps the place across redraws.
  function logPlaces(root){
    return Array.prototype.map.call(root.querySelectorAll('pre.log'), function(el){
      return {top: el.scrollTop, atEnd: el.scrollTop + el.clientHeight >= el.scrollHeight - 4};
    });
  }
  function logsAtEnd(root, kept){
    Array.prototype.forEach.call(root.querySelectorAll('pre.log'), function(el, i){
      var k = kept && kept[i];
      el.scrollTop = (k && !k.atEnd) ? k.top : el.scrollHeight;
    });
  }
  function refresh(){
    if (!live || !live.dataset.fragment) return;
    // a swap mid-drag would lose the selection, on the timeline or on a chart
    if (busy || drag || chartDrag) { again = true; return; }
    if (picking) return;  // a reader is filling in a form (filters, runs to compare): keep it as it is
    busy = true;
    fetch(live.dataset.fragment, {cache: 'no-store'}).then(function(r){ return r.ok ? r.text() : null; })
      .then(function(html){
        // a drag began while this was in flight: its redraw waits for the mouse, as a new one would
        if (html !== null && (drag || chartDrag)) { again = true; return; }
        if (html !== null && !picking) {
          var kept = logPlaces(live);
          if (window.orchChartsDestroy) window.orchChartsDestroy(live);
          live.innerHTML = html; logsAtEnd(live, kept); applySort();
          if (window.orchCharts) window.orchCharts(live);
          document.body.dataset.refreshes = String(1 + +(document.body.dataset.refreshes || 0));
        }
      }).catch(function(){}).then(function(){ busy = false; if (again) { again = false; refresh(); } });
  }
  if (live && live.dataset.fragment && window.EventSource) {
    var es = new EventSource('/api/stream');
    var seen = null, watch = (live.dataset.watch || '').split(' ').filter(Boolean);
    es.addEventListener('change', function(ev){
      var now = {}; try { now = JSON.parse(ev.data); } catch (e) {}
      var moved = seen === null ? false : watch.some(function(k){ return now[k] !== seen[k]; });
      // the first message only says where things stand: something may have changed since the
      // page was drawn, so redraw once
      if (seen === null || moved) refresh();
      seen = now;
    });
    es.addEventListener('open', function(){ document.body.dataset.live = 'yes'; });
  }
  document.addEventListener('click', function(ev){
    var th = ev.target.closest('th[data-sort]');
    if (th) {
      var col = Array.prototype.indexOf.call(th.parentNode.cells, th);
      sort = {col: col, dir: sort && sort.col === col ? -sort.dir : 1};
      applySort(); return;
    }
  });
  // Action forms (cancel, retry, resume) post the token this tab keeps; the answer is a page.
  document.addEventListener('submit', function(ev){
    var form = ev.target.closest('form.action'); if (!form) return;
    var field = form.querySelector('input[name="token"]'); if (field) field.value = token || '';
  });
  var drag = null, sel = null, chartDrag = false;
  document.addEventListener('mousedown', function(ev){
    if (ev.button !== 0) return;  // a drag selects with the main button only (as uPlot's does)
    if (ev.target.closest('[data-chart] .u-over')) { chartDrag = true; return; }
    var svg = ev.target.closest('svg.timeline');
    if (!svg || !live || !live.dataset.fragment || ev.target.closest('a')) return;
    drag = {rect: svg.getBoundingClientRect(), d: svg.dataset, x: ev.clientX}; ev.preventDefault();
    sel = document.getElementById('selection');
  });
  document.addEventListener('mousemove', function(ev){
    if (!drag || !sel) return;
    var r = drag.rect;
    sel.style.display = 'block'; sel.style.left = Math.min(drag.x, ev.clientX) + 'px';
    sel.style.width = Math.abs(ev.clientX - drag.x) + 'px';
    sel.style.top = r.top + 'px'; sel.style.height = r.height + 'px';
  });
  document.addEventListener('mouseup', function(ev){
    if (chartDrag) {  // uPlot takes the selection on this mouseup; the held redraw comes after
      chartDrag = false; if (again) { again = false; setTimeout(refresh, 0); } return;
    }
    if (!drag) return;
    var r = drag.rect, d = drag.d, x0 = drag.x; drag = null;
    if (sel) sel.style.display = 'none';
    if (Math.abs(ev.clientX - x0) < 5) { if (again) { again = false; refresh(); } return; }
    function t(cx){ var x = (cx - r.left) / r.width * +d.width;
      return +d.t0 + Math.min(Math.max((x - +d.left) / +d.plotWidth, 0), 1) * (+d.t1 - +d.t0); }
    var a = t(Math.min(x0, ev.clientX)), b = t(Math.max(x0, ev.clientX));
    var query = '?from=' + a.toFixed(3) + '&to=' + b.toFixed(3);
    history.replaceState(null, '', location.pathname + query);
    live.dataset.fragment = '/fragment/timeline' + query; refresh();
  });
  // a context menu or another window can take the mouseup: the drag ends there, and the held
  // redraw comes
  function dragLost(){
    if (!drag && !chartDrag) return;
    drag = null; chartDrag = false;
    if (sel) sel.style.display = 'none';
    if (again) { again = false; refresh(); }
  }
  document.addEventListener('contextmenu', dragLost);
  window.addEventListener('blur', dragLost);
  logsAtEnd(document, null);
  if (window.orchCharts) window.orchCharts(document);
})();
