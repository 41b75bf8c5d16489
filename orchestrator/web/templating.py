"""The Jinja2 environment every page and the report render through: templates from the
package's `templates/` folder, autoescaped, with the few formatting filters they share."""

from __future__ import annotations

import json
import time
from functools import cache
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from orchestrator.wording import attempts_said, fmt_duration, fmt_value


def clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ts))


def stamp(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts))


def mib(value: float) -> str:
    return f"{value / 1024:.1f} GiB"


def json_script(value: Any) -> Markup:
    """JSON for a <script type="application/json"> block: `<`, `>` and `&` escaped as \\u003c
    and the like, so text from a run dir can never close the element."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
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
    )
    # `yaml`: a config value as the CLI and the YAML files write it (`true`, `null`), never a Python repr
    env.filters.update(
        clock=clock, stamp=stamp, mib=mib, json_script=json_script, duration=fmt_duration,
        yaml=fmt_value, attempts=attempts,
    )
    return env


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)
