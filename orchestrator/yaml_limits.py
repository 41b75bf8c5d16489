"""Every YAML file orch reads goes through `load_yaml`: bounded in size, aliases and depth, and
a key written twice in one mapping is refused (PyYAML keeps the last one silently).

PyYAML's safe loader builds an alias as a shared reference, so a "billion laughs" document of
a few hundred bytes loads quickly and then explodes in anything that walks it (JSON dumps,
hashing, merging): `orch submit` once ran over a minute and reached 3.9 GB on one. Real suites,
configs and ladders use a handful of aliases at most.
"""

from __future__ import annotations

import os
import stat
from typing import Any

import yaml

from orchestrator.errors import PlanError

MAX_YAML_BYTES = 1024 * 1024
MAX_YAML_ALIASES = 100
MAX_YAML_DEPTH = 50
MAX_YAML_NODES = 200_000  # scalars, lists and mappings with every alias expanded


class _LimitedLoader(yaml.SafeLoader):
    """The safe loader, counting aliases and nesting as the document is composed."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                raise PlanError(f"more than {MAX_YAML_ALIASES} YAML aliases (*name)")
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise PlanError(f"nested more than {MAX_YAML_DEPTH} levels deep")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *base` then a key of its own overrides the base, as YAML means
            key = self.construct_object(key_node, deep=True)
            try:
                repeated = key in seen
                seen.add(key)
            except TypeError:
                continue  # an unhashable key: the safe constructor refuses it itself
            if repeated:
                line = key_node.start_mark.line + 1
                raise PlanError(
                    f"key {key!r} is given twice in one mapping (line {line}): keep one"
                )
        return super().construct_mapping(node, deep=deep)


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """Nodes in the document once every alias is expanded: each node counted once per
    reference, computed once per node, so a billion-laughs document costs microseconds."""
    key = id(node)
    if key not in memo:
        memo[key] = 0  # a recursive alias counts as a leaf
        size = 1
        if isinstance(node, yaml.SequenceNode):
            size += sum(min(_expanded_size(item, memo), MAX_YAML_NODES + 1) for item in node.value)
        elif isinstance(node, yaml.MappingNode):
            size += sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
        memo[key] = min(size, MAX_YAML_NODES + 1)
    return memo[key]


def _not_plain(value: Any, where: str, ancestors: set[int]) -> str | None:
    """Where and why `value` is not plain data (text, numbers, switches, null, lists and
    mappings of them): a date, a set, bytes or a tuple cannot become a job's JSON, an alias that
    holds itself has no end, and a whole number beyond 64 bits fits no column."""
    shown = where or "the document"
    if value is None or isinstance(value, (str, bool, float)):
        return None
    if isinstance(value, int):
        return None if -(2**63) <= value < 2**63 else f"{shown}: a whole number beyond 64 bits"
    if not isinstance(value, (list, dict)):
        return f"{shown}: a {type(value).__name__} value (quote it to keep it as text)"
    if id(value) in ancestors:
        return f"{shown}: an alias that holds itself"
    ancestors.add(id(value))
    try:
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(value, dict) and (found := _not_plain(key, f"{shown}: a key", ancestors)):
                return found
            inner = (
                f"{where}.{key}"
                if where and isinstance(key, str)
                else f"{where}{key if isinstance(key, str) else [key]}"
            )
            if found := _not_plain(item, inner[:120], ancestors):
                return found
    finally:
        ancestors.discard(id(value))
    return None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """`line 3, column 8: mapping values are not allowed here`: where in the file, and what."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or (
        str(exc).splitlines()[0] if str(exc) else "invalid YAML"
    )
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + " ".join(str(problem).split())


def load_yaml(text: str, what: str) -> Any:
    """The one YAML document in `text`; PlanError (naming `what`) when it is too large, has too
    many aliases, nests too deep, or is not YAML."""
    if len(text) > MAX_YAML_BYTES:
        raise PlanError(f"{what} is larger than {MAX_YAML_BYTES // 1024} KiB")
    try:
        # the reader refuses a control character (NUL, \x01) as it is built, before any parsing
        loader = _LimitedLoader(text)
    except yaml.YAMLError as exc:
        raise PlanError(f"{what} is not valid YAML: {_yaml_problem(exc)}") from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        expanded = _expanded_size(node, {})
        if expanded > MAX_YAML_NODES:
            raise PlanError(
                f"expands to {expanded} nodes through its aliases, more than {MAX_YAML_NODES}"
            )
        document = loader.construct_document(node)
        if problem := _not_plain(document, "", set()):
            raise PlanError(problem)
        return document
    except PlanError as exc:
        raise PlanError(f"{what}: {exc}") from None
    except yaml.YAMLError as exc:
        raise PlanError(f"{what} is not valid YAML: {_yaml_problem(exc)}") from None
    except RecursionError:
        raise PlanError(f"{what}: nested too deeply") from None
    except (ValueError, TypeError, AttributeError, OverflowError) as exc:
        # a tag the safe loader cannot build (`!!float abc`, `!!int abc`, a 5000-digit number)
        detail = " ".join(str(exc).split())[:100]
        raise PlanError(
            f"{what}: a value cannot be read ({type(exc).__name__}: {detail})"
        ) from None
    finally:
        loader.dispose()


def read_yaml_file(path: Any, what: str) -> Any:
    """Read and load a YAML file, refusing one over MAX_YAML_BYTES before reading it all, and
    anything but a regular file (a FIFO would hold the command forever, a device never ends)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise PlanError(f"{what} not found: {path}") from None
    except OSError as exc:
        raise PlanError(f"{what} {path} cannot be read: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PlanError(f"{what} {path} is not a regular file")
        with os.fdopen(fd, encoding="utf-8") as handle:
            fd = -1  # the handle closes it now
            text = handle.read(MAX_YAML_BYTES + 1)
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError(f"{what} {path} cannot be read: {exc}") from None
    finally:
        if fd >= 0:
            os.close(fd)
    return load_yaml(text, f"{what} {path}")
