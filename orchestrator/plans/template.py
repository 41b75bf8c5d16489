"""Worker command templates: parsing, checking at submit, filling per attempt. Pure.

A template such as `python train.py --cfg {config} --batch-size {cfg.batch_size}
{cfg.gradient_checkpointing?--gradient-checkpointing}` is split with shlex first; each argument
is then parsed into literal text and placeholders:

- `{config}` `{run_dir}` `{seed}` `{data}` `{job}`: the attempt's config.yaml, run dir, ...;
- `{resume}`: the checkpoint an attempt after a death resumes from (orchestrator.plans.resume);
  an argument that uses it is left out when there is none, so `--resume_from_checkpoint={resume}`
  is given only on a resume;
- `{nproc}` `{port}`: the job's number of GPUs (`gpus:`) and a free TCP port chosen per attempt,
  for `torchrun --nproc_per_node={nproc} --master_port={port}` (two jobs never share 29500);
- `{cfg.KEY}`: the attempt's config value of KEY, after `--set` and the ladder (numbers as
  Python writes them, `true`/`false` for booleans, lists and mappings as JSON);
- `{cfg.KEY?TEXT}`: TEXT when KEY is true (or a non-zero number, a non-empty string), nothing
  otherwise; an argument that renders to nothing this way is left out, so
  `{cfg.gradient_checkpointing?--gradient-checkpointing}` is a store_true flag;
- `{{` and `}}` are literal braces.

A value is always inside one argument: it can never become a second argument or reach a shell.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import PlanError

NAMES = ("config", "run_dir", "seed", "data", "job", "nproc", "port", "resume")
_DROPPED_WHEN_EMPTY = frozenset({"resume"})  # an argument using one of these, empty, is left out
_PART = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_CFG = re.compile(r"^cfg\.([A-Za-z0-9_][A-Za-z0-9_.\-]{0,127})(?:\?([^{}]*))?$")
_NAMES_SHOWN = ", ".join("{" + n + "}" for n in NAMES)


@dataclass(frozen=True)
class Part:
    kind: str  # "text" | "name" (one of NAMES) | "cfg" (a value) | "flag" (presence text)
    text: str = ""  # literal text, or a flag's text
    key: str = ""  # the name or the config key


@dataclass(frozen=True)
class Template:
    source: str
    args: tuple[tuple[Part, ...], ...]

    def _parts(self) -> Iterable[Part]:
        return (part for arg in self.args for part in arg)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(p.key for p in self._parts() if p.kind == "name")

    @property
    def value_keys(self) -> frozenset[str]:
        return frozenset(p.key for p in self._parts() if p.kind == "cfg")

    @property
    def flag_keys(self) -> frozenset[str]:
        return frozenset(p.key for p in self._parts() if p.kind == "flag")

    @property
    def reads_config(self) -> bool:
        """Whether the script gets the merged config.yaml, hence every config change."""
        return "config" in self.names

    def reaches(self, key: str) -> bool:
        """Whether a change of config KEY reaches the script (through {config} or {cfg.KEY})."""
        return self.reads_config or key in self.value_keys or key in self.flag_keys

    def fill(self, names: Mapping[str, str], config: Mapping[str, Any]) -> list[str]:
        """The argv of one attempt. A missing name or config key is a PlanError."""
        argv: list[str] = []
        for arg in self.args:
            pieces: list[str] = []
            only_flags = True
            if any(p.kind == "name" and p.key in _DROPPED_WHEN_EMPTY and not names.get(p.key) for p in arg):
                continue
            for part in arg:
                if part.kind == "text":
                    pieces.append(part.text)
                    only_flags = False
                elif part.kind == "name":
                    if part.key not in names:
                        raise PlanError(
                            f"placeholder {{{part.key}}} in worker command {self.source!r} has no value here"
                        )
                    pieces.append(names[part.key])
                    only_flags = False
                elif part.kind == "cfg":
                    if config.get(part.key) is None:
                        raise PlanError(f"placeholder {{cfg.{part.key}}}: the config has no value for {part.key}")
                    pieces.append(render_value(config[part.key]))
                    only_flags = False
                elif is_true(config.get(part.key)):
                    pieces.append(part.text)
            rendered = "".join(pieces)
            if rendered or not only_flags:
                argv.append(rendered)
        return argv


def render_value(value: Any) -> str:
    """A config value as an argparse script reads it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def is_true(value: Any) -> bool:
    """Whether a `{cfg.KEY?TEXT}` flag is given: YAML `true`, a non-zero number, a non-empty
    string other than false/no/off/0."""
    if isinstance(value, str):
        return value.strip().lower() not in ("", "false", "no", "off", "0")
    return bool(value) if isinstance(value, (bool, int, float)) else False


def _parse_arg(token: str, source: str) -> tuple[Part, ...]:
    parts: list[Part] = []
    position = 0
    for match in _PART.finditer(token):
        if match.start() > position:
            parts.append(Part("text", token[position : match.start()]))
        position = match.end()
        whole = match.group(0)
        if whole in ("{{", "}}"):
            parts.append(Part("text", whole[0]))
            continue
        if whole in ("{", "}"):
            raise PlanError(f"invalid worker command {source!r}: a lone {whole!r} (write {whole * 2} for a brace)")
        field = match.group(1)
        if field in NAMES:
            parts.append(Part("name", key=field))
            continue
        cfg = _CFG.match(field)
        if cfg is None:
            raise PlanError(
                f"unknown placeholder {{{field}}} in worker command {source!r}: use {_NAMES_SHOWN}, "
                "{cfg.KEY} or {cfg.KEY?--flag} (write {{ }} for a brace)"
            )
        key, flag = cfg.group(1), cfg.group(2)
        parts.append(Part("flag", flag, key) if flag is not None else Part("cfg", key=key))
    if position < len(token):
        parts.append(Part("text", token[position:]))
    return tuple(parts)


def parse_template(worker: str) -> Template:
    """Parse a command template; every problem is a PlanError naming it."""
    try:
        tokens = shlex.split(worker)
    except ValueError as exc:
        raise PlanError(f"invalid worker command {worker!r}: {exc}") from None
    if not tokens:
        raise PlanError("empty worker command: give 'lora', 'sim' or a command template")
    return Template(worker, tuple(_parse_arg(token, worker) for token in tokens))


def check_config_keys(
    template: Template, configs: Mapping[str, Mapping[str, Any]], settable: Iterable[str]
) -> None:
    """Every `{cfg.KEY}` must have a value in every config submitted (`configs`: name -> merged
    config); a `{cfg.KEY?flag}` key must be in one of them or be a key the ladder or --set can
    set (`settable`). PlanError naming the first offender otherwise."""
    settable = set(settable)
    for key in sorted(template.value_keys):
        missing = [name for name, config in configs.items() if config.get(key) is None]
        if missing:
            raise PlanError(
                f"worker command placeholder {{cfg.{key}}}: config {missing[0]} has no value for {key!r} "
                f"(add it to the config, or --set {key}=VALUE)"
            )
    for key in sorted(template.flag_keys):
        if key not in settable and not any(key in config for config in configs.values()):
            raise PlanError(
                f"worker command placeholder {{cfg.{key}?...}}: no config of the suite has {key!r}, "
                "and neither the ladder nor --set sets it"
            )


OUR_WORKERS = {"lora": "workers.lora", "sim": "workers.sim"}
