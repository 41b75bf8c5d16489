"""Which row of each (task, metric) column a table singles out (bold), and on what basis. Pure.

Choosing the best setting by its test mean is model selection on test, so the choice is made on
the validation split whenever the column's rows report it, and the test mean of the chosen row is
what a reader sees. A row with fewer than two counted seeds has no std and is never chosen, nor is
a row any of whose counted runs orch flagged as diverged (♯): a figure must not single out a
setting whose loss blew up. For a loss, an error or a perplexity the best is the lowest. One row
per column is chosen: ties are broken as TIE_RULE says; a choice resting on fewer seeds than a
rival's is noted, and so is a diverged row that would have been chosen.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from orchestrator.plans.metric_direction import lower_is_better
from orchestrator.results.aggregate import ResultSummary
from orchestrator.results.formats import DIVERGED, column_title

MIN_N_CHOSEN = 2  # a single seed is no evidence that a setting is better
Column = tuple[str, str]  # (task, metric)


class Basis(str, Enum):
    VAL = "val"  # chosen by the mean on the validation split
    TEST = "test"  # chosen by the test mean: no row of the column reported val


@dataclass(frozen=True)
class ColumnChoice:
    """The row a column singles out (by id of its summary; empty: nothing could be chosen, e.g.
    no row with two seeds), what chose it, a note when it rests on fewer seeds than a rival or
    when a diverged row would have been chosen, and the diverged rows the rule left out."""

    basis: Basis | None
    chosen: frozenset[int]
    note: str = ""  # `the choice, r8, has 2 seeds; its rivals up to 4`
    passed_over: tuple[str, ...] = ()  # labels of rows with n ≥ 2 left out for a diverged run (♯)


def choose(summaries: Sequence[ResultSummary], digits: int, select: Basis | None = None) -> dict[Column, ColumnChoice]:
    """Per column, one row: the best mean val at the shown precision, or, when no eligible row
    of the column reports val over two runs or more and `select` does not ask for val, the best
    test mean. Eligible: a mean over two seeds or more, and no counted run flagged as diverged (♯);
    on val, a val mean over two runs or more (one run's val is no more evidence). A tie at the
    shown precision goes to the better unrounded mean, then to more seeds, then to the smaller
    std, then to the first row in table order (TIE_RULE)."""
    columns: dict[Column, list[ResultSummary]] = {}
    for s in summaries:
        columns.setdefault((s.task, s.metric), []).append(s)
    choices = {}
    for column, rows in columns.items():
        ranked = [s for s in rows if s.mean is not None and s.distinct_seeds >= MIN_N_CHOSEN]
        eligible = [s for s in ranked if not s.diverged]
        basis, best, pool = _pick(eligible, column, digits, select)
        notes = []
        if best is not None:
            rivals = max(s.distinct_seeds for s in pool)
            if best.distinct_seeds < rivals:
                notes.append(f"the choice, {best.label}, has {best.distinct_seeds} seeds; its rivals up to {rivals}")
        # a val mean from one seed is no more evidence than a test mean from one: say where it would have chosen
        _, lone, _ = _pick(eligible, column, digits, select, min_val_n=1)
        if lone is not None and lone is not best and lone.val_n < MIN_N_CHOSEN:
            instead = f"{best.label} chosen" if best is not None else "none chosen"
            notes.insert(0, f"{lone.label} has the best val mean but from one run: not chosen on it; {instead}")
        passed_over = tuple(s.label for s in ranked if s.diverged)
        if passed_over:
            would_basis, would, _ = _pick(ranked, column, digits, select)
            if would is not None and would.diverged:  # the rule changed the choice: say so
                assert would_basis is not None
                instead = f"{best.label} chosen" if best is not None else "none chosen"
                notes.insert(0, f"{would.label} has the best {would_basis.value} mean but a counted run's loss "
                                f"diverged ({DIVERGED}): not chosen; {instead}")
        chosen = frozenset() if best is None else frozenset({id(best)})
        choices[column] = ColumnChoice(basis if best is not None else None, chosen, "; ".join(notes), passed_over)
    return choices


def _pick(pool: list[ResultSummary], column: Column, digits: int, select: Basis | None,
          min_val_n: int = MIN_N_CHOSEN) -> tuple[Basis | None, ResultSummary | None, list[ResultSummary]]:
    """The basis, the best row of `pool` on it (None: none to choose) and the rows it was chosen among.
    A row's val mean counts only over `min_val_n` seeds or more."""
    with_val = [s for s in pool if s.val_mean is not None and s.val_n >= min_val_n]
    basis = Basis.VAL if with_val or select is Basis.VAL else Basis.TEST
    pool = with_val if basis is Basis.VAL else pool
    if not pool:
        return None, None, pool
    sign = 1.0 if lower_is_better(column[1]) else -1.0  # the best sorts first
    _, best = min(enumerate(pool), key=lambda p: (sign * round(_score(p[1], basis), digits),
                                                  sign * _score(p[1], basis), -p[1].distinct_seeds,
                                                  _spread(p[1], basis), p[0]))
    return basis, best, pool


TIE_RULE = ("a tie at the shown precision goes to the better unrounded mean, then more seeds, then the "
            "smaller std, then the first row")


def _spread(s: ResultSummary, basis: Basis) -> float:
    std = s.val_std if basis is Basis.VAL else s.std
    return float("inf") if std is None else std


def _score(s: ResultSummary, basis: Basis) -> float:
    value = s.val_mean if basis is Basis.VAL else s.mean
    assert value is not None  # pooled from rows that have it
    return value


def choice_notes(choices: dict[Column, ColumnChoice]) -> list[str]:
    """`glue_rte (accuracy): the choice, r8, has 2 seeds; its rivals up to 4`, per column."""
    return [f"{column_title(task, metric)}: {c.note}" for (task, metric), c in choices.items() if c.note]


def is_chosen(summary: ResultSummary, choices: dict[Column, ColumnChoice]) -> bool:
    choice = choices.get((summary.task, summary.metric))
    return choice is not None and id(summary) in choice.chosen


def unchosen_columns(choices: dict[Column, ColumnChoice]) -> list[Column]:
    return [column for column, choice in choices.items() if not choice.chosen]


def bold_legend(choices: dict[Column, ColumnChoice], metrics: Iterable[str]) -> str:
    """The sentence under a table that says what bold means in it ("" when nothing is bold)."""
    bases = {c.basis for c in choices.values() if c.chosen}
    if not bases:
        return ""
    lowest = sorted({m for m in metrics if lower_is_better(m)})
    direction = f"; lowest is best for {', '.join(lowest)}" if lowest else ""
    # said only where the rule left a row out, so a table with no ♯ row reads as before
    rows = "rows with n ≥ 2" + (f" and no diverged run ({DIVERGED})"
                                if any(c.passed_over for c in choices.values()) else "")
    if bases == {Basis.VAL}:
        text = (f"bold: per column, the best mean on the validation split among {rows} (its test mean "
                "shown, which may be lower than another row's)")
    elif bases == {Basis.TEST}:
        text = f"bold: per column, the best test mean among {rows} (no val reported: chosen on test)"
    else:
        text = (f"bold: per column, the best mean on the validation split among {rows}, or the best "
                "test mean where no row reported val (chosen on test)")
    return text + direction + "; " + TIE_RULE


def chosen_by(choices: dict[Column, ColumnChoice]) -> dict[int, str]:
    """id of each chosen summary -> what chose it (`val` or `test`), for the JSON and CSV."""
    return {key: choice.basis.value for choice in choices.values() if choice.basis for key in choice.chosen}
