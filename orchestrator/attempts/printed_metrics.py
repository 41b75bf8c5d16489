"""Progress and results from what a training script already prints. Pure: text in, values out.

Understood on stdout/stderr (the wrapper logs both into stdout.log):
- Hugging Face Trainer log dicts, `{'loss': 0.41, 'learning_rate': 5e-05, 'epoch': 0.5}`, also
  with numbers as quoted strings (`{'loss': '6.077'}`, recent transformers) and `eval_*` keys;
- tqdm bars, `45%|####5     | 45/100 [00:09<00:11, 4.9it/s, loss=0.41]`, which tqdm redraws with
  carriage returns and no newline for minutes;
- `step N/M` (or `Step N of M`), with a `loss` on the same line;
- a suite's `progress_regex` with named groups `step` (and optionally `total`, `loss`).
Several ranks may print the same bar: a step that goes back a little is a slower rank and is
ignored; one that drops below half of the last is a new epoch's bar and is taken. When several
bars run (training and evaluation), the one with the largest total is the progress. A bar whose
description names a phase other than training (`Loading weights: 219/219`, `Map: 3200/3200`,
`Downloading`, `Tokenizing`, ...) is not a step count: taken as one, a model load looked like
hundreds of training steps, and the memory it held then was taken for the shape's peak.

Every metric line understood (a log dict, a `step N/M` line with a loss, a tqdm postfix, a
`progress_regex` match) is also a history point at its step (attempts.history_points): a log dict
without a step of its own (`step`, `global_step` or the like, STEP_KEYS) is placed at the step of
the first bar drawn (a Trainer's training bar, not an evaluation bar that may count more
batches), else at its `epoch`, else at its ordinal among such lines. A line whose step is not a
whole number (text, 2.5, -1) gives no point: its values are at no known step, never moved to one.

Results (what a script printed at its end) are read by attempts.printed_results.
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from orchestrator.attempts.history_points import NOT_HISTORY
from orchestrator.store.history_bounds import Point
from orchestrator.wording import number

MAX_LINE_CHARS = 8192  # longer "lines" (a binary dump, a progress bar gone wrong) are cut
MAX_DICT_CHARS = 4096  # a log dict longer than this is not a Trainer log line
MAX_METRICS = 64
MAX_KEY_CHARS = 64

_TQDM = re.compile(r"(?<![\d./])(\d{1,12})/(\d{1,12})\s*\[")
_STEP = re.compile(r"\bstep\b\s*[:=#]?\s*(\d{1,12})\s*(?:/|of)\s*(\d{1,12})", re.IGNORECASE)
_LOSS = re.compile(r"\bloss\b\s*[:=]?\s*'?(-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|nan|inf)", re.IGNORECASE)
# Keys of a Trainer log dict kept as progress, besides eval_* metrics.
_PROGRESS_KEYS = ("loss", "learning_rate", "epoch", "grad_norm")
# Keys a printed dict names its optimizer step by (the first found wins).
STEP_KEYS = ("step", "global_step", "train_step", "optimizer_step", "iteration", "iter")
_RANKED = {"regex": 3, "step": 2, "tqdm": 1}  # an explicit step line beats a bar
# Descriptions of tqdm bars that count loading and data preparation, not optimizer steps.
_NOT_TRAINING = re.compile(
    r"\b(load|map|download|fetch|token|filter|generat|sav|preprocess|convert|shard|extract|resolv|"
    r"checkpoint|evaluat|predict|valid|test|infer|compil|warm|adding|trunc|pack|dataset|split)", re.IGNORECASE,
)
# A bar counting examples, dataset batches or bytes (`examples/s`, `ba/s`, `MB/s`) goes over data,
# not optimizer steps, whatever its description (TRL's `Adding EOS to train dataset`).
_DATA_RATE = re.compile(r"(?:examples|ex|ba|[kMG]?B)/s\b")


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def parse_dict_literal(text: str, nonfinite: bool = False) -> dict[Any, Any] | None:
    """The dict a line prints, as JSON or as a Python literal (ast.literal_eval of a bounded
    text: never eval), values as they were; None otherwise. With `nonfinite`, a Python dict's
    bare `nan`, `inf` and `-inf` values (`print(metrics)` of a run that diverged) are read as
    those floats, as JSON's `NaN` and `Infinity` are."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start or end - start >= MAX_DICT_CHARS:
        return None
    candidate = text[start : end + 1]
    parsed: Any = None
    try:
        parsed = json.loads(candidate)
    except RecursionError:  # a few thousand brackets: no metrics line, not the attempt's error
        return None
    except ValueError:
        parsed = _literal(candidate, nonfinite)
    return parsed if isinstance(parsed, dict) else None


class _NonFiniteNames(ast.NodeTransformer):
    """The names `nan` and `inf` (as `print` writes float NaN and infinities) as those floats:
    literal_eval then reads `{'loss': nan, 'x': -inf}` and still refuses any other name."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in ("nan", "inf"):
            return ast.copy_location(ast.Constant(float(node.id)), node)
        return node


def _literal(candidate: str, nonfinite: bool = False) -> Any:
    """ast.literal_eval of the text (never eval); with `nonfinite`, of its tree with the names
    `nan` and `inf` made floats (nothing else is rewritten: a string saying `nan` stays text)."""
    try:
        if not nonfinite:
            return ast.literal_eval(candidate)
        tree = ast.parse(candidate, mode="eval")
        return ast.literal_eval(_NonFiniteNames().visit(tree).body)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def numeric_entries(parsed: dict[Any, Any], nonfinite: bool = False) -> dict[str, float] | None:
    """The numeric entries of a printed dict (numbers or numeric strings); None when none. With
    `nonfinite`, float NaN and infinities are kept too (results name them, never average them)."""
    values = {
        key: value
        for key, raw in parsed.items()
        if isinstance(key, str) and len(key) <= MAX_KEY_CHARS
        and (value := _nonfinite_float(raw) if nonfinite else number(raw)) is not None
    }
    return dict(list(values.items())[:MAX_METRICS]) or None


def _nonfinite_float(raw: Any) -> float | None:
    """A number as `number` reads it, or a float NaN or infinity as it is."""
    found = number(raw)
    if found is None and isinstance(raw, float) and not math.isfinite(raw):
        return raw
    return found


def parse_dict(text: str) -> dict[str, float] | None:
    """The numeric entries of a dict printed as JSON or as a Python literal; None otherwise."""
    parsed = parse_dict_literal(text)
    return numeric_entries(parsed) if parsed is not None else None


def whole_step(value: Any) -> int | None:
    """A step as a whole number from 0 to 10**12; None for anything else (text, 2.5, -1)."""
    step = number(value)
    return int(step) if step is not None and 0 <= step == int(step) <= 10**12 else None


def split_segments(text: str) -> list[str]:
    """Lines as a terminal would show them: newlines and carriage returns both end one."""
    return [segment[:MAX_LINE_CHARS] for segment in re.split(r"[\r\n]", text)]


@dataclass
class _Bar:
    step: int
    total: int | None


@dataclass
class StdoutProgress:
    """Progress read from a stream of output, fed in chunks as it grows."""

    progress_regex: re.Pattern[str] | None = None
    bars: dict[tuple[str, int | None], _Bar] = field(default_factory=dict)
    values: dict[str, float] = field(default_factory=dict)
    carry: str = ""  # the unterminated last segment (a tqdm bar being redrawn)
    totals: dict[str, int] = field(default_factory=dict)  # the last total seen per source
    mid_line: bool = False  # reading started inside a line: drop text up to the first line end
    points: list[Point] = field(default_factory=list)  # history points not yet taken (`take_points`)
    logged_lines: int = 0  # log dicts seen with no step known: their ordinal is their step
    # A log dict on a line of its own (tqdm.write clears the bar, prints, redraws it) waits for the
    # bar drawn next: tqdm redraws at most every 0.1 s, so the bar before it may lag steps behind.
    pending: list[tuple[str, float, int]] = field(default_factory=list)  # (key, value, bar's step then)

    def take_points(self, flush: bool = False) -> list[Point]:
        """The history points understood since the last call, one per (step, key), the last
        winning; `flush` (the output has ended) places the dicts still waiting for a bar."""
        if flush:
            self._settle()
        taken = {(p.step, p.key): p for p in self.points}
        self.points = []
        return list(taken.values())

    def _settle(self, step: int | None = None) -> None:
        """Place the waiting dicts: at `step` (the training bar drawn right after them), else at
        the step the bar showed when they were printed."""
        for key, value, then in self.pending:
            self._point(then if step is None else step, key, value)
        self.pending = []

    def _first_bar_key(self) -> tuple[str, int | None] | None:
        if not self.bars:
            return None
        best = max(_RANKED[k[0]] for k in self.bars)
        return next(key for key in self.bars if _RANKED[key[0]] == best)

    def _point(self, step: float | None, key: str, value: float) -> None:
        if step is None:
            bar = self._first_bar()
            step = bar.step if bar is not None else None
        if step is not None and key not in NOT_HISTORY and len(self.points) < 100_000:
            self.points.append(Point(float(step), key, value))

    @classmethod
    def with_regex(cls, progress_regex: str | None) -> StdoutProgress:
        return cls(re.compile(progress_regex) if progress_regex else None)

    def feed(self, text: str) -> None:
        """Take the next chunk of output. A segment with no line end yet is parsed as it is
        (a tqdm bar ends with none) and again when its end arrives."""
        if not text:
            return
        segments = split_segments(self.carry + text)
        self.carry = segments.pop()[:MAX_LINE_CHARS]
        if self.mid_line:
            if not segments:
                self.carry = ""
                return
            segments.pop(0)
            self.mid_line = False
        for segment in segments:
            self._line(segment)
        if self.carry:
            self._line(self.carry, partial=True)

    def resync(self, mid_line: bool) -> None:
        """The next chunk does not follow the last one (bytes were skipped): forget the
        unterminated segment, and when the chunk starts inside a line, skip to its end."""
        self.carry = ""
        self.mid_line = mid_line

    def _line(self, line: str, partial: bool = False) -> None:
        if not line.strip():
            return
        if self.pending and not partial and not self._draws_first_bar(line):
            self._settle()  # what came next was not the bar: the dicts keep the step they were printed at
        if self.progress_regex is not None:
            match = self.progress_regex.search(line)
            if match is not None:
                groups = match.groupdict()
                step = _int(groups.get("step"))
                if step is not None:
                    self._step("regex", step, _int(groups.get("total")))
                loss = number(groups.get("loss"))
                if loss is not None:
                    self.values["loss"] = loss
                    if not partial and step is not None:  # no step read: no point (never moved)
                        self._point(step, "loss", loss)
                return
        if partial:
            # An unterminated segment may be cut mid-number: only a whole tqdm bar counts.
            tqdm = _TQDM.search(line)
            if tqdm is not None and line.rstrip().endswith("]"):
                self._tqdm(line, tqdm)
            return
        raw = parse_dict_literal(line) if "{" in line else None
        logged = numeric_entries(raw) if raw is not None else None
        if raw is not None and logged is not None:
            before = line[: line.find("{")]  # a bar drawn without a line end, then the dict printed
            if (bar := _TQDM.search(before)) is not None:
                self._tqdm(before, bar)
            step_key = next((k for k in STEP_KEYS if k in raw), None)
            logged_step = whole_step(raw[step_key]) if step_key is not None else None
            point_step: float | None = None
            if step_key is not None and logged_step is None:
                # a step that is not a whole number: its values are at no known step, so they
                # are no points at all (placed at the last step, they moved)
                for key, value in logged.items():
                    if key in _PROGRESS_KEYS or key.startswith("eval_"):
                        self.values[key] = value
                return
            if logged_step is not None:  # a JSON log line with a step
                total = logged.get("total", logged.get("max_steps"))
                whole_total = int(total) if total is not None and total == int(total) else None
                self._step("step", logged_step, whole_total)
                point_step = logged_step
            elif self.main_bar() is None:  # no step, no bar: at its epoch, else its ordinal
                self.logged_lines += 1
                epoch = logged.get("epoch")
                point_step = epoch if epoch is not None and 0 <= epoch <= 10**12 else self.logged_lines
            first = self._first_bar()
            waits = point_step is None and bar is None and first is not None  # a dict on a line of its own
            for key, value in logged.items():
                if key in _PROGRESS_KEYS or key.startswith("eval_"):
                    self.values[key] = value
                if waits and first is not None and key not in NOT_HISTORY and len(self.pending) < 10_000:
                    self.pending.append((key, value, first.step))
                elif not waits:
                    self._point(point_step, key, value)
            return
        step_match = _STEP.search(line)
        if step_match is not None:
            self._step("step", int(step_match.group(1)), int(step_match.group(2)))
            self._loss_in(line, int(step_match.group(1)))
            return
        tqdm = _TQDM.search(line)
        if tqdm is not None:
            self._tqdm(line, tqdm, point=True)

    def _tqdm(self, line: str, match: re.Match[str], point: bool = False) -> None:
        if _NOT_TRAINING.search(line[: match.start()].rsplit("\r", 1)[-1]):
            return
        if _DATA_RATE.search(line[match.end() :].split("]", 1)[0]):
            return
        self._step("tqdm", int(match.group(1)), int(match.group(2)))
        self._loss_in(line[match.end() :], int(match.group(1)) if point else None, point)  # tqdm's postfix: `loss=0.41`

    def _loss_in(self, text: str, step: int | None, point: bool = True) -> None:
        found = _LOSS.search(text)
        loss = number(found.group(1)) if found else None
        if loss is not None:
            self.values["loss"] = loss
            if point and step is not None:
                self._point(step, "loss", loss)

    def _draws_first_bar(self, line: str) -> bool:
        """Whether the line draws the first bar (before any dict on it)."""
        match = _TQDM.search(line.split("{", 1)[0])
        return match is not None and ("tqdm", int(match.group(2))) == self._first_bar_key()

    def _step(self, source: str, step: int, total: int | None) -> None:
        if total is None:  # a line without its total belongs to the last bar of its kind that had one
            total = self.totals.get(source)
        else:
            self.totals[source] = total
        key = (source, total)
        bar = self.bars.get(key)
        if bar is None or step >= bar.step or step <= bar.step // 2:
            self.bars[key] = _Bar(step, total)
        if self.pending and key == self._first_bar_key():
            self._settle(self.bars[key].step)
        # else: a rank behind the others printed an older step

    def _first_bar(self) -> _Bar | None:
        """The first bar drawn of the best-ranked kind: a Trainer's training bar, drawn before
        any evaluation bar (which may count more batches than training has steps)."""
        key = self._first_bar_key()
        return None if key is None else self.bars[key]

    def main_bar(self) -> _Bar | None:
        if not self.bars:
            return None
        best = max(self.bars, key=lambda k: (_RANKED[k[0]], k[1] or 0))
        return self.bars[best]

    def snapshot(self) -> dict[str, Any] | None:
        """The progress as `progress.jsonl` would say it; None before anything was understood."""
        bar = self.main_bar()
        if bar is None and not self.values:
            return None
        shown: dict[str, Any] = {"source": "stdout"}
        if bar is not None:
            shown["step"] = bar.step
            if bar.total is not None:
                shown["total"] = bar.total
        shown.update(self.values)
        return shown


# Keys a training loop logs about itself, not about the model's quality: never a result metric.
BOOKKEEPING_KEYS = frozenset({"step", "global_step", "total", "max_steps", "epoch", "learning_rate", "lr",
                              "grad_norm", "samples_per_s", "peak_mem_mib"})
# What a training loop logs about its own progress: a JSON line of only these (with a step) is
# a heartbeat, not the script's result (its `step` was once read as a metric).
PROGRESS_LINE_KEYS = BOOKKEEPING_KEYS | {"loss", "t"}


def is_progress_line(printed: dict[str, float]) -> bool:
    return ("step" in printed or "global_step" in printed) and set(printed) <= PROGRESS_LINE_KEYS


# `'loss': 0.41` or `"loss": NaN` in a log dict (not `eval_loss`, not `train_loss`)
_DICT_LOSS = re.compile(r"""['"]loss['"]\s*:\s*['"]?(-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|nan|-?inf(?:inity)?)""",
                        re.IGNORECASE)


def printed_losses(text: str, progress_regex: re.Pattern[str] | None = None) -> list[float]:
    """The training losses in a stretch of output, in order, NaN and infinities included (they
    decide divergence): a `progress_regex` match's `loss` group, a log dict's `loss`, a tqdm
    postfix `loss=0.41` or a `step N/M loss 0.41` line; one per line (a redrawn bar is one per
    redraw). A regex scan, not the progress parser: it runs over megabytes when an attempt ends."""
    losses: list[float] = []
    for line in split_segments(text):
        raw: str | None = None
        if progress_regex is not None and (match := progress_regex.search(line)) is not None:
            raw = match.groupdict().get("loss")
        if raw is None and "loss" in line.lower() and (found := _DICT_LOSS.search(line) or _LOSS.search(line)):
            raw = found.group(1)
        if raw is not None:
            try:
                losses.append(float(raw))
            except ValueError:
                continue
    return losses
