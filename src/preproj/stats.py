"""Paired comparisons of two methods evaluated on the same items: effect, 95% interval, verdict.

Each run of a method on a task yields one row of per-item values (accuracy: 0/1 per item;
perplexity and held-out loss: a (negative log-likelihood, count) pair per document, because both are
ratios of sums). A comparison resamples *items* with the same indices for both methods, which keeps
the pairing: item difficulty cancels, and the interval is far narrower than two unpaired ones.

With several seeds per method the effect is the difference of the seed-averaged metrics, and the
bootstrap resamples seeds (within each method) and items together, so the interval carries both
sources of variation. With a single seed on each side only items are resampled, and the interval
is conditional on that seed.

"no detectable difference" always comes with the smallest effect the run could have detected: the
effect that an interval of this width would exclude zero for with 80% probability, 2.8 standard
errors (z 0.975 + z 0.80) of the bootstrap distribution.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

MDE_Z = 1.959964 + 0.841621  # two-sided 5% test at 80% power


def accuracy(values: np.ndarray) -> np.ndarray:
    """values (..., items) of 0/1 -> the mean over items."""
    return values.mean(axis=-1)


def ratio_of_sums(values: np.ndarray) -> np.ndarray:
    """values (..., items, 2) of (numerator, denominator) -> sum of numerators / sum of denominators."""
    return values[..., 0].sum(axis=-1) / values[..., 1].sum(axis=-1)


def perplexity(values: np.ndarray) -> np.ndarray:
    """values (..., items, 2) of (nll, count) -> exp(total nll / total count)."""
    return np.exp(ratio_of_sums(values))


@dataclass
class Paired:
    metric: str
    a: float
    """The metric of method A (seed-averaged)."""
    b: float
    """The metric of method B (seed-averaged)."""
    effect: float
    """b - a."""
    low: float
    high: float
    """95% percentile interval of the effect."""
    mde: float
    """Smallest |effect| this run would detect with 80% power."""
    items: int
    seeds: tuple[int, int]
    higher_is_better: bool

    @property
    def verdict(self) -> str:
        if self.low > 0 or self.high < 0:
            better = (self.effect > 0) == self.higher_is_better
            return "better" if better else "worse"
        return "no detectable difference"

    def to_dict(self) -> dict:
        return {**asdict(self), "verdict": self.verdict}


def paired_bootstrap(a: np.ndarray, b: np.ndarray, statistic: Callable[[np.ndarray], np.ndarray], *,
                     metric: str = "", higher_is_better: bool = True, n_boot: int = 4000, seed: int = 0) -> Paired:
    """Effect of B over A with a 95% interval.

    a, b: (seeds, items, ...) per-item values of the same items (seeds may differ between a and b).
    statistic maps (..., items, ...) to the metric. Each replicate draws seeds with replacement within
    each method (when a method has more than one) and items with replacement, the same items for both."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape[1:] != b.shape[1:]:
        raise ValueError(f"paired comparison needs the same items on both sides, got shapes {a.shape} and {b.shape}.")
    n_items = a.shape[1]
    rng = np.random.default_rng(seed)
    effects = np.empty(n_boot)
    for k in range(n_boot):
        items = rng.integers(0, n_items, n_items)
        sa = rng.integers(0, len(a), len(a)) if len(a) > 1 else np.zeros(1, dtype=int)
        sb = rng.integers(0, len(b), len(b)) if len(b) > 1 else np.zeros(1, dtype=int)
        effects[k] = statistic(b[sb][:, items]).mean() - statistic(a[sa][:, items]).mean()
    value_a, value_b = float(statistic(a).mean()), float(statistic(b).mean())
    low, high = np.percentile(effects, [2.5, 97.5])
    return Paired(metric, value_a, value_b, value_b - value_a, float(low), float(high),
                  float(MDE_Z * effects.std(ddof=1)), n_items, (len(a), len(b)), higher_is_better)


def describe(p: Paired, digits: int = 3) -> str:
    """'+0.012 [-0.004, +0.028]: no detectable difference (would detect ±0.022)'."""
    f = f"{{:+.{digits}f}}"
    text = f"{f.format(p.effect)} [{f.format(p.low)}, {f.format(p.high)}]: {p.verdict}"
    if p.verdict == "no detectable difference":
        text += f" (would detect ±{p.mde:.{digits}f})"
    return text


def t_interval(values, confidence: float = 0.95) -> tuple[float, float]:
    """(mean, half-width) of a t interval over independent runs (seeds)."""
    from scipy import stats as scipy_stats

    values = np.asarray(values, dtype=np.float64)
    if len(values) < 2:
        return float(values.mean()), math.nan
    half = scipy_stats.t.ppf(0.5 + confidence / 2, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))
    return float(values.mean()), float(half)


def paired_t(a, b, *, metric: str = "", higher_is_better: bool = True, confidence: float = 0.95) -> Paired:
    """Effect of B over A from runs paired by seed (a[i] and b[i] share seed i, hence data order): the mean
    of the per-seed differences with a t interval, and the effect an interval this wide would detect at
    80% power."""
    from scipy import stats as scipy_stats

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired_t needs one value per seed on each side, got shapes {a.shape} and {b.shape}.")
    diff = b - a
    n = len(diff)
    if n < 2:
        return Paired(metric, float(a.mean()), float(b.mean()), float(diff.mean()), math.nan, math.nan, math.nan, 0,
                      (n, n), higher_is_better)
    se = diff.std(ddof=1) / math.sqrt(n)
    t = scipy_stats.t.ppf(0.5 + confidence / 2, n - 1)
    mde = (t + scipy_stats.t.ppf(0.80, n - 1)) * se
    effect = float(diff.mean())
    return Paired(metric, float(a.mean()), float(b.mean()), effect, effect - t * se, effect + t * se, float(mde), 0,
                  (n, n), higher_is_better)
