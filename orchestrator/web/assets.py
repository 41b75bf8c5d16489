"""The page's stylesheet and script, inlined into every page and the report (no files to
serve, nothing fetched from a network)."""

CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d2330;background:#fafbfc}
header{background:#1d2330;color:#fff;padding:8px 16px;display:flex;gap:18px;align-items:center}
header a{color:#cfd8e8;text-decoration:none}header a.active{color:#fff;font-weight:600}
header .brand{font-weight:700;color:#fff;margin-right:8px}
main{padding:12px 16px;max-width:1400px}
h2{font-size:16px;margin:18px 0 6px}
table{border-collapse:collapse;background:#fff}
th,td{padding:3px 8px;border-bottom:1px solid #e3e6ea;text-align:left;vertical-align:middle}
th{font-weight:600;background:#f1f3f6}th[data-sort]{cursor:pointer;user-select:none}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
.counts span{display:inline-block;margin-right:14px}.counts b{font-size:18px}
.membar{display:flex;width:240px;height:12px;background:#e6e6e6;border-radius:2px;overflow:hidden}
.membar i{display:block;height:100%}
.legend{margin:4px 0 10px;color:#555}.key{margin-right:14px;white-space:nowrap}
.key i{display:inline-block;width:12px;height:10px;margin-right:4px;vertical-align:middle;border-radius:2px}
.oom-key{color:#d64545;margin-right:4px}
svg .lane{fill:#f4f6f9}svg .lane-label{font-size:11px;fill:#333}svg .axis-label{font-size:10px;fill:#666}
svg .tick{stroke:#e1e4e8;stroke-width:1}svg .tick-label{font-size:10px;fill:#666;text-anchor:middle}
svg .lvl{font-size:9px;fill:#fff;pointer-events:none}svg .oom-mark{fill:#d64545;stroke:#fff;stroke-width:.6}
svg g.attempt:hover rect{stroke:#000;stroke-width:1}
svg.timeline{cursor:crosshair;background:#fff}svg.memory,svg.loss{background:#fff}svg.loss{max-width:720px;display:block}
svg.dots .sd{stroke:#555;stroke-width:2}svg.dots .mean{stroke:#1d2330;stroke-width:2}svg.dots .seed{fill:#3b7dd8;fill-opacity:.75}
pre.log{background:#11151c;color:#d8dee9;padding:8px;max-height:420px;overflow:auto;font-size:12px;white-space:pre-wrap}
button{font:inherit;padding:2px 10px;cursor:pointer}
.muted{color:#777}.empty{color:#777;font-style:italic}
.state-running{color:#3b7dd8}.state-succeeded{color:#2e9d5b}.state-failed{color:#7b2a8c}.state-cancelled{color:#888}
.summary td{padding:3px 14px 3px 0;border:0}
#selection{position:fixed;background:rgba(59,125,216,.15);border:1px solid #3b7dd8;pointer-events:none;display:none}
"""

JS = """
(function(){
  var q = new URLSearchParams(location.search), token = q.get('token');
  try { if (token) sessionStorage.setItem('orch-token', token); else token = sessionStorage.getItem('orch-token'); } catch (e) {}
  if (q.has('token')) {  // kept for this tab; out of the address bar, history and shared links
    q.delete('token'); var rest = q.toString();
    history.replaceState(null, '', location.pathname + (rest ? '?' + rest : ''));
  }
  var live = document.getElementById('live'), busy = false, again = false, sort = null;
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
  function refresh(){
    if (!live || !live.dataset.fragment) return;
    if (busy || drag) { again = true; return; }  // a swap mid-drag would lose the selection
    busy = true;
    fetch(live.dataset.fragment, {cache: 'no-store'}).then(function(r){ return r.ok ? r.text() : null; })
      .then(function(html){
        if (html !== null) { live.innerHTML = html; applySort();
          document.body.dataset.refreshes = String(1 + +(document.body.dataset.refreshes || 0)); }
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
    var b = ev.target.closest('button[data-action]');
    if (!b) return;
    var out = document.getElementById('action-result');
    var headers = token ? {'X-Orch-Token': token} : {};
    fetch(b.dataset.action, {method: 'POST', headers: headers}).then(function(r){
      return r.text().then(function(t){
        if (out) out.textContent = r.status === 403 ? 'refused (403): open the page with the token orch web printed (/?token=...)' : t;
        refresh();
      });
    });
  });
  var drag = null, sel = null;
  document.addEventListener('mousedown', function(ev){
    var svg = ev.target.closest('svg.timeline');
    if (!svg || !live || !live.dataset.fragment || ev.target.closest('a')) return;
    drag = {rect: svg.getBoundingClientRect(), d: svg.dataset, x: ev.clientX}; ev.preventDefault();
    sel = document.getElementById('selection');
  });
  document.addEventListener('mousemove', function(ev){
    if (!drag || !sel) return;
    var r = drag.rect;
    sel.style.display = 'block'; sel.style.left = Math.min(drag.x, ev.clientX) + 'px';
    sel.style.width = Math.abs(ev.clientX - drag.x) + 'px'; sel.style.top = r.top + 'px'; sel.style.height = r.height + 'px';
  });
  document.addEventListener('mouseup', function(ev){
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
})();
"""
