"""The page's own stylesheet and script and the vendored chart library (uPlot), read from
the package's `static/` folder: served by `orch web` and inlined into `orch report`, never
fetched from a network."""

from __future__ import annotations

from functools import cache
from importlib import resources

UPLOT_VERSION = "1.6.32"  # npm `uplot`, dist/uPlot.iife.min.js and dist/uPlot.min.css (MIT, static/uPlot.LICENSE)
STATIC_FILES = {
    "orch.css": "text/css",
    "orch.js": "text/javascript",
    "charts.js": "text/javascript",
    "uPlot.iife.min.js": "text/javascript",
    "uPlot.min.css": "text/css",
}


@cache
def static_text(name: str) -> str:
    if name not in STATIC_FILES:
        raise KeyError(name)
    return resources.files("orchestrator.web").joinpath("static", name).read_text(encoding="utf-8")
