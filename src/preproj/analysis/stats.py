"""Paired comparisons of two methods evaluated on the same items: effect, 95% interval, verdict.

Each run of a method on a task yields one row of per-item values (accuracy: 0/1 per item;
perplexity and held-out loss: a (negative log-likelihood, count) pair per document, because both are
ratios of sums). A comparison resamples *items* with the same indices for both methods, which keeps
the pairing: item difficulty cancels, and the interval is far narrower than two unpaired ones.

With several seeds per method the effect is the difference of the seed-averaged metrics, and its
variance has two parts: the items' (the paired bootstrap over items, all seeds kept) and the seeds'
(each method's between-seed variance of its metric, less the seed-by-item part that the items'
bootstrap already carries, over its number of seeds). The interval is the effect ± a t-quantile
times the combined standard error, with Welch-Satterthwaite degrees of freedom from the seeds' part.
Resampling seeds inside the bootstrap instead would understate their spread by a factor (n-1)/n and
ignore how few they are: with three seeds its intervals cover far less than 95%. A method with a
single seed contributes no seed variance, so the interval is conditional on that seed; with no seed
variance at all it is the bootstrap's percentile interval.

"no detectable difference" always comes with the smallest effect the run could have detected: the
effect that an interval of this width would exclude zero for with 80% probability, (z 0.975 + z 0.80)
standard errors, or the same in t-quantiles when the seeds' variance enters.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from .statistics import STATISTICS, Statistic, accuracy, perplexity, ratio_of_sums  # noqa: F401 (re-exported)

MDE_Z = 1.959964 + 0.841621  # two-sided 5% test at 80% power


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
    p: float = math.nan
    """Two-sided p-value of a zero difference, from the same standard error and degrees of freedom as the interval."""
    test: str = ""
    """seed-paired, item-and-seed, or the older item bootstrap ("")."""
    fragile: bool = False
    """The verdict changes under the other defensible degrees-of-freedom convention (RULES)."""
    equivalence: dict | None = None
    """Where a plan declares a margin for the metric: the margin, the TOST p and the seeds that would decide
    (analysis/equivalence.py); left out of to_dict() where there is none."""
    at_level: Callable[[float], dict] | None = field(default=None, repr=False, compare=False)
    """The same run's figures at another two-sided level alpha: {"mde": ...}, and "seeds_to_decide" where there is
    an equivalence test. A family's correction asks for a stricter level than 0.05 (pairing.correct); never
    written out."""

    @property
    def verdict(self) -> str:
        if self.low > 0 or self.high < 0:
            better = (self.effect > 0) == self.higher_is_better
            return "better" if better else "worse"
        return "no detectable difference"

    def to_dict(self) -> dict:
        found = {**asdict(self), "verdict": self.verdict}
        del found["at_level"]
        if found["equivalence"] is None:
            del found["equivalence"]
        return found


def paired_bootstrap(a: np.ndarray, b: np.ndarray, statistic: Callable[[np.ndarray], np.ndarray], *,
                     metric: str = "", higher_is_better: bool = True, n_boot: int = 4000, seed: int = 0) -> Paired:
    """Effect of B over A with a 95% interval.

    a, b: (seeds, items, ...) per-item values of the same items (seeds may differ between a and b).
    statistic maps (..., items, ...) to the metric. Each bootstrap replicate draws items with
    replacement, the same items for both; seeds enter through their variance (module docstring)."""
    from scipy import stats as scipy_stats

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape[1:] != b.shape[1:]:
        raise ValueError(f"paired comparison needs the same items on both sides, got shapes {a.shape} and {b.shape}.")
    n_items = a.shape[1]
    rng = np.random.default_rng(seed)
    boot_a, boot_b = np.empty((n_boot, len(a))), np.empty((n_boot, len(b)))  # each seed's metric per replicate
    for k in range(n_boot):
        items = rng.integers(0, n_items, n_items)
        boot_a[k], boot_b[k] = statistic(a[:, items]), statistic(b[:, items])
    effects = boot_b.mean(axis=1) - boot_a.mean(axis=1)
    per_seed_a, per_seed_b = statistic(a), statistic(b)  # (seeds,)
    effect = float(per_seed_b.mean() - per_seed_a.mean())
    seed_parts = [(_seed_variance(v, boot) / len(v), len(v) - 1)  # (variance of the seed mean, its df)
                  for v, boot in ((per_seed_a, boot_a), (per_seed_b, boot_b)) if len(v) > 1]
    var_seeds = float(sum(part for part, _ in seed_parts))
    if var_seeds == 0:
        low, high = np.percentile(effects, [2.5, 97.5])
        mde = MDE_Z * effects.std(ddof=1)
    else:
        var = effects.var(ddof=1) + var_seeds
        df = var**2 / sum(part**2 / d for part, d in seed_parts)  # the items' part: infinite df
        t = scipy_stats.t.ppf(0.975, df)
        low, high = effect - t * math.sqrt(var), effect + t * math.sqrt(var)
        mde = (t + scipy_stats.t.ppf(0.80, df)) * math.sqrt(var)
    return Paired(metric, float(per_seed_a.mean()), float(per_seed_b.mean()), effect, float(low), float(high),
                  float(mde), n_items, (len(a), len(b)), higher_is_better)


def _seed_variance(per_seed: np.ndarray, boot: np.ndarray) -> float:
    """Between-seed variance of a method's metric, less the part the items already carry.

    On fixed items each seed's metric also differs from the others by how that seed's model fares on
    these particular items (the seed-by-item interaction), which the bootstrap over items counts
    already. Its size is how much the seeds' deviations from their mean move between bootstrap
    replicates (times n/(n-1)); left in, it would be counted twice and the interval would be too wide
    when the seeds barely differ."""
    n = len(per_seed)
    interaction = (boot - boot.mean(axis=1, keepdims=True)).var(axis=0, ddof=1).mean() * n / (n - 1)
    return max(0.0, float(per_seed.var(ddof=1) - interaction))


# How the seeds' variance enters the interval. results/coverage.md maps each rule's coverage by simulation (scripts/
# coverage.py); RULE is the one chosen there, and a call that the defensible rules disagree on is fragile.
#   subtract: an arm's seed variance is its between-seed variance less the seed-by-item interaction that the items'
#             variance already carries; raw: the between-seed variance as it is (the interaction counted twice).
#   n-1 df / Satterthwaite df: the degrees of freedom of that estimate, combined with the items' (infinite) by
#             Welch-Satterthwaite; Satterthwaite's for a difference of two mean squares are far fewer when the two
#             are close.
#   t(n-1) for all: the whole interval takes the seeds' t-quantile, as if the seeds carried all of the variance.
#   separate quantiles: the items' part takes its own t-quantile and each seed part its own t(n-1), added in
#             quadrature, so an underestimated seed variance cannot buy the items' degrees of freedom.
# The items' variance is estimated from the items themselves (analysis/statistics.py), with items - 1 degrees of
# freedom, or for documents of unequal length their effective number - 1 (the normal quantile where t is due covered
# 93.8% instead of 95% on 62 WikiText documents in the map).
RULES = ("subtract, n-1 df", "subtract, Satterthwaite df", "raw, n-1 df", "raw, t(n-1) for all",
         "raw, separate quantiles", "subtract, separate quantiles")
RULE = "raw, separate quantiles"


@dataclass
class _Parts:
    """What every rule needs, computed once: the effect, the items' variance, and per seed part its between-seed
    variance, interaction variance, seeds and items."""

    effect: float
    items: float
    items_df: float
    seeds: list[tuple[float, float, int, int]]


def _parts(a: np.ndarray, b: np.ndarray, statistic: Statistic, seed_paired: bool) -> _Parts:
    theta_a, theta_b = statistic(a), statistic(b)
    u_a, u_b = statistic.influence(a), statistic.influence(b)
    n_items = a.shape[1]
    # one item has no variance to estimate: undefined, said so by the report, not warned about by numpy
    items = float((u_b.mean(axis=0) - u_a.mean(axis=0)).var(ddof=1) / n_items) if n_items > 1 else math.nan
    sides = [(theta_b - theta_a, u_b - u_a)] if seed_paired else [(t, u) for t, u in ((theta_a, u_a), (theta_b, u_b))
                                                                  if len(t) > 1]
    seeds = []
    for per_seed, influence in sides:
        n = len(per_seed)
        residual = influence - influence.mean(axis=0, keepdims=True)
        interaction = float((residual ** 2).sum() / ((n - 1) * (n_items - 1)) / n_items) if n_items > 1 else 0.0
        seeds.append((float(per_seed.var(ddof=1)), interaction, n, n_items))
    return _Parts(float(theta_b.mean() - theta_a.mean()), items, max(1.0, statistic.effective_items(a) - 1.0),
                  seeds)


def _seed_part(between: float, interaction: float, n: int, items: int, rule: str) -> tuple[float, float]:
    """(variance of the seed mean, its degrees of freedom) for one arm's (or one seed-paired difference's) seeds."""
    if rule.startswith("raw"):
        return between / n, n - 1.0
    component = between - interaction
    if component <= 0:
        return 0.0, math.inf
    if rule != "subtract, Satterthwaite df":
        return component / n, n - 1.0
    interaction_df = (n - 1) * (items - 1)  # none on one item, where the interaction is not estimated (0)
    share = between ** 2 / (n - 1) + (interaction ** 2 / interaction_df if interaction_df else 0.0)
    return component / n, component ** 2 / share


def _quantile(df: float, level: float) -> float:
    from scipy import stats as scipy_stats

    return float(scipy_stats.t.ppf(level, df) if math.isfinite(df) else scipy_stats.norm.ppf(level))


def t_rule_df(parts: _Parts, seeds: list[tuple[float, float]], rule: str) -> float:
    """The degrees of freedom of a rule that takes one t-quantile for the whole interval: Welch-Satterthwaite over the
    items' part and the seed parts `seeds` ((variance, df) each, _seed_part's), or the seeds' fewest for
    "t(n-1) for all"."""
    if rule == "raw, t(n-1) for all" and seeds:
        return min(d for _, d in seeds)
    var = parts.items + sum(v for v, _ in seeds)
    share = parts.items ** 2 / parts.items_df + sum(v ** 2 / df for v, df in seeds if v > 0)
    return var ** 2 / share if share > 0 else parts.items_df


def _interval(parts: _Parts, rule: str, confidence: float = 0.95,
              with_p: bool = True) -> tuple[float, float, float, float]:
    """(half-width, smallest detectable effect, p-value (nan unless with_p), standard error) under `rule`."""
    from scipy import stats as scipy_stats

    seeds = [_seed_part(*x, rule) for x in parts.seeds]
    var = parts.items + sum(v for v, _ in seeds)
    se = math.sqrt(var)
    level = 0.5 + confidence / 2
    if rule.endswith("separate quantiles"):
        z, zp = _quantile(parts.items_df, level), _quantile(parts.items_df, 0.80)
        half = math.sqrt(z ** 2 * parts.items + sum(_quantile(df, level) ** 2 * v for v, df in seeds))
        mde = math.sqrt((z + zp) ** 2 * parts.items + sum((_quantile(df, level) + _quantile(df, 0.80)) ** 2 * v
                                                         for v, df in seeds))
        # the p-value of the same test: the level at which this construction's interval would just touch zero
        p = math.nan if not with_p else _separate_p(parts.effect, parts.items, parts.items_df, seeds) \
            if se > 0 and parts.effect != 0 else float(parts.effect == 0)
        return half, mde, p, se
    df = t_rule_df(parts, seeds, rule)
    q = _quantile(df, level)
    mde = (q + _quantile(df, 0.80)) * se
    if se == 0:
        p = 1.0 if parts.effect == 0 else 0.0
    else:
        t = abs(parts.effect) / se
        p = float(2 * (scipy_stats.t.sf(t, df) if math.isfinite(df) else scipy_stats.norm.sf(t)))
    return q * se, mde, p, se


def two_seeds_note(seeds: int, rule: str = RULE) -> str | None:
    """What two seeds per arm cost under `rule`, where it gives a seed part its own t(n-1) quantile: t(1)'s is 12.7,
    so an arm of two seeds against another can get a wider interval than the same arm with one seed (conditional on
    it) or three. None for any other count or rule."""
    if seeds != 2 or not rule.endswith(("t(n-1) for all", "separate quantiles")):
        return None
    part = "the whole interval" if rule.endswith("for all") else "the seeds' part of each interval"
    return (f"2 seeds per method: the interval rule ({rule}) gives {part} the t-quantile of one degree of freedom, "
            f"{_quantile(1, 0.975):.1f} (3 seeds: {_quantile(2, 0.975):.1f}), so a paired interval with such an arm "
            "can be wider than with one seed or three; results/coverage.md checked the rule at 1 and 3 seeds. To "
            "decide, use --seeds 3; for intervals conditional on one seed, --seeds 1.")


def _separate_p(effect: float, items: float, items_df: float, seeds: list[tuple[float, float]]) -> float:
    """The smallest two-sided level at which the separate-quantiles interval excludes zero (bisection on its log,
    from 1e-16; upper-tail quantiles, exact for tiny levels)."""
    from scipy import stats as scipy_stats

    def half(c: float) -> float:
        upper = [scipy_stats.t.isf(c / 2, df) if math.isfinite(df) else scipy_stats.norm.isf(c / 2) for _, df in seeds]
        return math.sqrt(scipy_stats.t.isf(c / 2, items_df) ** 2 * items
                         + sum(q ** 2 * v for q, (v, _) in zip(upper, seeds) if v > 0))

    low, high = math.log(1e-16), 0.0
    if half(math.exp(low)) < abs(effect):
        return math.exp(low)
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if half(math.exp(mid)) >= abs(effect) else (low, mid)
    return math.exp(high)


def paired_difference(a: np.ndarray, b: np.ndarray, statistic: Statistic, *, metric: str = "",
                      higher_is_better: bool = True, seed_paired: bool = False, rule: str = RULE,
                      confidence: float = 0.95) -> Paired:
    """Effect of B over A (the difference of the seed-averaged metrics) with its interval and p-value.

    a, b: (seeds, items, ...) per-item values of the same items. The items' part of the variance is the paired
    bootstrap's in closed form (Statistic). seed_paired (the same seeds on both sides, seed i the same data order):
    the seeds enter through the per-seed differences; otherwise through each arm's own between-seed variance, a
    single seed adding none (the interval is then conditional on that seed). The rule says how (RULES)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape[1:] != b.shape[1:]:
        raise ValueError(f"paired comparison needs the same items on both sides, got shapes {a.shape} and {b.shape}.")
    if seed_paired and (len(a) != len(b) or len(a) < 2):
        raise ValueError(f"a seed-paired comparison needs the same two or more seeds on both sides, got {len(a)} and "
                         f"{len(b)}.")
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}.")
    parts = _parts(a, b, statistic, seed_paired)
    half, mde, p, _ = _interval(parts, rule, confidence)
    return Paired(metric, float(statistic(a).mean()), float(statistic(b).mean()), parts.effect, parts.effect - half,
                  parts.effect + half, float(mde), a.shape[1], (len(a), len(b)), higher_is_better, p,
                  "seed-paired" if seed_paired else "item-and-seed",
                  at_level=lambda alpha: {"mde": float(_interval(parts, rule, 1 - alpha, with_p=False)[1])})


def intervals_by_rule(a: np.ndarray, b: np.ndarray, statistic: Statistic, *, seed_paired: bool = False,
                      confidence: float = 0.95) -> dict[str, tuple[float, float]]:
    """{rule: (low, high)} for every rule at once (the coverage map's inner loop)."""
    parts = _parts(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), statistic, seed_paired)
    found = {}
    for rule in RULES:
        half = _interval(parts, rule, confidence, with_p=False)[0]
        found[rule] = (parts.effect - half, parts.effect + half)
    return found


def _undefined_as_one(adjust):
    """An undefined p-value (a comparison on one item, or with no variation at all) can reject nothing: it keeps its
    place in the family as p = 1, so the others are corrected for it too, and its own adjusted p stays undefined."""
    def adjusted(p_values: list[float]) -> list[float]:
        defined = [p if math.isfinite(p) else 1.0 for p in p_values]
        return [q if math.isfinite(p) else math.nan for p, q in zip(p_values, adjust(defined))]

    adjusted.__doc__, adjusted.__name__ = adjust.__doc__, adjust.__name__
    return adjusted


@_undefined_as_one
def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error), in the input's order."""
    order = np.argsort(p_values)
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


@_undefined_as_one
def benjamini_hochberg(p_values: list[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (false discovery rate), in the input's order."""
    from scipy.stats import false_discovery_control

    return [float(x) for x in false_discovery_control(p_values)] if p_values else []


def p_text(p: float, alpha: float = 0.05) -> str:
    """A p-value in two significant digits, or as many more as it takes to keep it on its side of alpha: 0.0499 is
    not written as 0.05, which would read as not significant beside the verdict it gave."""
    for digits in range(2, 7):
        text = f"{p:.{digits}g}"
        if (float(text) < alpha) == (p < alpha):
            return text
    return text


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
    of the per-seed differences with a t interval, its two-sided p-value (undefined where the differences do not
    vary), and the effect an interval this wide would detect at 80% power."""
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
    effect = float(diff.mean())
    p = float(2 * scipy_stats.t.sf(abs(effect) / se, n - 1)) if se > 0 else math.nan

    def at_level(alpha: float) -> dict:
        return {"mde": float((scipy_stats.t.isf(alpha / 2, n - 1) + scipy_stats.t.ppf(0.80, n - 1)) * se)}

    return Paired(metric, float(a.mean()), float(b.mean()), effect, effect - t * se, effect + t * se,
                  at_level(1 - confidence)["mde"], 0, (n, n), higher_is_better, p=p, test="seed-paired",
                  at_level=at_level)
