"""The Jinja2 environment every page and the report render through: templates from the
package's `templates/` folder, autoescaped, with the few formatting filters they share."""

from __future__ import annotations

import json
import time
from functools import cache
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from orchestrator.wording import attempts_said, fmt_duration, fmt_value, shown_lines


def clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ts))


def stamp(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts))


def mib(value: float) -> str:
    return f"{value / 1024:.1f} GiB"


class Sent(str):
    """Text a page sends back as it is: a filter's option value, a hidden field, a metric name a
    chart writes into the address. HTML-escaped like all text, never escaped by wording's rule
    (`lr\\u200dsched` would filter on a name nothing has); the text a person reads beside it is."""


def sent(value: Any) -> Sent:
    """The `sent` filter: `<option value="{{ o | sent }}">{{ o }}</option>`."""
    return Sent(value)


def shown(value: Any) -> Any:
    """Every `{{ ... }}` of a page as it is shown (Jinja's finalize): text through
    wording.shown_lines, the one rule for user text, so a control or bidirectional character
    (U+202E) shows escaped (`\\u202e`) instead of reordering the page; markup already made
    (a rendered fragment, an SVG), text sent back (Sent) and other values as they are."""
    return shown_lines(value) if isinstance(value, str) and not isinstance(value, (Markup, Sent)) else value


_NESTED = (str, dict, list, tuple)
_PLAIN = frozenset({float, int, bool, type(None)})


def _shown_data(value: Any) -> Any:
    """JSON data a page's script shows (chart labels, metric names): each text, keys included,
    as `shown` shows it, but for identifiers the script sends back (Sent: a metric it names in the
    address). A list of numbers alone (most of a chart's data) is passed as it is."""
    if isinstance(value, str):
        return shown(value)
    if isinstance(value, dict):
        return {shown(k): _shown_data(v) if isinstance(v, _NESTED) else v for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if _PLAIN.issuperset(map(type, value)):
            return value
        return [_shown_data(v) if isinstance(v, _NESTED) else v for v in value]
    return value


def json_script(value: Any) -> Markup:
    """JSON for a <script type="application/json"> block: its texts as `shown` shows them, and
    `<`, `>` and `&` escaped as \\u003c and the like, so text from a run dir can never close the
    element."""
    text = json.dumps(_shown_data(value), separators=(",", ":"), allow_nan=False)
    return Markup(text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


def attempts(job: Any) -> str:
    """A job's attempts and resumes against their limits, as `orch show` says them."""
    return attempts_said(job.attempt_count, job.counted_attempts, job.max_attempts, job.resumes,
                         job.max_resumes)


@cache
def environment() -> Environment:
    env = Environment(
        loader=PackageLoader("orchestrator.web", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=shown,
    )
    # `yaml`: a config value as the CLI and the YAML files write it (`true`, `null`), never a Python repr
    env.filters.update(
        clock=clock, stamp=stamp, mib=mib, json_script=json_script, duration=fmt_duration,
        yaml=fmt_value, attempts=attempts, sent=sent,
    )
    return env


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)
