"""The metrics a paired comparison is made on, each computed from per-item values with its influence values and the
degrees of freedom its items give (analysis/stats.py builds the intervals from them).

Accuracy is a mean over items: its influence values are the items' deviations, exactly. Perplexity and held-out loss
are ratios of sums over documents (WikiText-2 test: 62 of them, of very unequal length): their influence values are
the jackknife's over documents, (n - 1)(theta - theta without document i), which for a ratio are wider than the
delta method's first-order ones where a few long documents dominate, and their degrees of freedom are those of the
documents' effective number (Kish: (sum of tokens)^2 / sum of squared tokens). On the coverage map's 62-document
cells the delta method with t(61) covered 94.2-94.6%, the jackknife with Kish's degrees of freedom about 95%
(results/coverage.md).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


class Statistic:
    """A metric computed from per-item values, with its influence values: u such that the metric of resampled items
    moves, to first order, by the mean of their u. var(u) / items is then the variance of the metric over items, in
    closed form, which makes intervals exact to compute and fast enough to map their coverage by simulation
    (results/coverage.md). `effective_items`: how many items' worth of information the values carry (the items'
    degrees of freedom are one fewer)."""

    def __init__(self, name: str, value: Callable[[np.ndarray], np.ndarray],
                 influence: Callable[[np.ndarray], np.ndarray],
                 effective_items: Callable[[np.ndarray], float] | None = None):
        self.name, self.value, self.influence = name, value, influence
        self.effective_items = effective_items or (lambda v: float(v.shape[1]))

    def __call__(self, values: np.ndarray) -> np.ndarray:
        return self.value(values)

    def __repr__(self) -> str:
        return f"Statistic({self.name})"


def _ratio(values: np.ndarray) -> np.ndarray:
    return values[..., 0].sum(axis=-1) / values[..., 1].sum(axis=-1)


def _leave_one_out(values: np.ndarray) -> np.ndarray:
    """The ratio of sums without each item in turn: (..., items)."""
    num, den = values[..., 0], values[..., 1]
    return (num.sum(axis=-1, keepdims=True) - num) / (den.sum(axis=-1, keepdims=True) - den)


def _jackknife(transform: Callable[[np.ndarray], np.ndarray]):
    """Influence values of transform(ratio of sums): the jackknife's pseudo-value deviations over items."""
    def influence(values: np.ndarray) -> np.ndarray:
        n = values.shape[-2]
        return (n - 1) * (transform(_ratio(values))[..., None] - transform(_leave_one_out(values)))
    return influence


def _kish(values: np.ndarray) -> float:
    """The effective number of documents weighted by their token counts (the first row's: every row scores the same
    documents with the same tokenizer)."""
    counts = values.reshape(-1, *values.shape[-2:])[0, :, 1]
    return float(counts.sum() ** 2 / (counts ** 2).sum())


def _identity(x: np.ndarray) -> np.ndarray:
    return x


accuracy = Statistic("mean", lambda v: v.mean(axis=-1), lambda v: v - v.mean(axis=-1, keepdims=True))
"""values (..., items) of 0/1 -> the mean over items."""
ratio_of_sums = Statistic("ratio of sums", _ratio, _jackknife(_identity), _kish)
"""values (..., items, 2) of (numerator, denominator) -> sum of numerators / sum of denominators."""
perplexity = Statistic("exp of a ratio of sums", lambda v: np.exp(_ratio(v)), _jackknife(np.exp), _kish)
"""values (..., items, 2) of (nll, count) -> exp(total nll / total count)."""
STATISTICS = {"accuracy": accuracy, "ratio_of_sums": ratio_of_sums, "perplexity": perplexity}
"""The statistics a task's metric can name (evaluation.tasks.Metric.statistic)."""
