"""The web page (`orch web`) and the self-contained report (`orch report`) over state.db.

Everything is read through `orchestrator.store.web_queries`; pages are Jinja2 templates
(templates/, autoescaped), charts are drawn in the browser by the vendored uPlot (static/),
the timeline's packing picture is SVG from a template. Nothing is fetched from a network.
"""
