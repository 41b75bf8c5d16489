"""Which way a metric's name says is better: a loss, an error rate or a perplexity is best lowest.
Read by results (which row of a column is best) and by submit (a loss judged as a maximum)."""

from __future__ import annotations

import re

# whole words of a metric's name only (`eval_loss`, `wer`, not `exact_answer` or `lossless`)
_LOWER_IS_BETTER = re.compile(r"(^|_)(loss|error|err|perplexity|ppl|mse|mae|rmse|wer|cer)($|_)", re.IGNORECASE)


def lower_is_better(metric: str) -> bool:
    """A loss, an error rate or a perplexity: the best is the lowest."""
    return bool(_LOWER_IS_BETTER.search(metric))
