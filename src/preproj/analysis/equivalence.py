"""Equivalence within a declared margin, and the seeds a comparison would need to decide.

"No detectable difference" is not evidence of sameness. Where a plan declares a margin m for a metric, two
one-sided tests (TOST; Schuirmann 1987) ask whether the difference is above -m and below +m; the larger of the two
one-sided p-values is the equivalence p, corrected within the comparison's family like any other p. Both tests use
the interval rule's own construction (stats.RULES): the same standard error and degrees of freedom, or for the
separate-quantiles rules the same quantile per part, so that a comparison's difference test and its equivalence test
never disagree about how wide the uncertainty is.
"""

from __future__ import annotations

import math

import numpy as np

from .stats import RULE, Statistic, _interval, _Parts, _parts, _seed_part, _separate_p, t_rule_df


def _one_sided_p(distance: float, parts: _Parts, rule: str) -> float:
    """p of H0: difference <= effect - distance (so a positive distance argues against it), under `rule`."""
    from scipy import stats as scipy_stats

    if rule.endswith("separate quantiles"):
        seeds = [_seed_part(*x, rule) for x in parts.seeds]
        if distance == 0:
            return 0.5
        two_sided = _separate_p(abs(distance), parts.items, parts.items_df, seeds)
        return two_sided / 2 if distance > 0 else 1 - two_sided / 2
    # the t rules: the rule's own standard error and degrees of freedom
    se = _interval(parts, rule, with_p=False)[3]
    if se == 0 or not math.isfinite(se):
        return 0.0 if distance > 0 else 1.0
    df = t_rule_df(parts, [_seed_part(*x, rule) for x in parts.seeds], rule)
    t = distance / se
    return float(scipy_stats.t.sf(t, df) if math.isfinite(df) else scipy_stats.norm.sf(t))


def equivalence(a: np.ndarray, b: np.ndarray, statistic: Statistic, margin: float, *, seed_paired: bool = False,
                rule: str = RULE, alpha: float = 0.05) -> dict:
    """B against A within ±margin: {"margin", "p": the TOST p-value, "seeds_to_decide": the seeds per arm at which
    the difference or the equivalence test would decide at level alpha (None where no count up to 200 would)}, from
    one estimate of the variance parts."""
    if not margin > 0:
        raise ValueError(f"an equivalence margin must be > 0, got {margin!r}.")
    parts = _as_parts(a, b, statistic, seed_paired)
    return {"margin": margin, "p": _tost_p(parts, margin, rule),
            "seeds_to_decide": _seeds_to_decide(parts, margin, rule, alpha)}


def _as_parts(a, b, statistic: Statistic, seed_paired: bool) -> _Parts:
    return _parts(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), statistic, seed_paired)


def _tost_p(parts: _Parts, margin: float, rule: str) -> float:
    """The larger of the two one-sided p-values that |B - A| < margin (nan where nothing varies)."""
    if not math.isfinite(parts.items):
        return math.nan
    return max(_one_sided_p(parts.effect + margin, parts, rule), _one_sided_p(margin - parts.effect, parts, rule))


def _seeds_to_decide(parts: _Parts, margin: float, rule: str, alpha: float = 0.05, most: int = 200) -> int | None:
    """The fewest seeds per arm at which, were the effect and the variance components what this run measured, the
    difference test (|effect| beyond the 1 - alpha interval) or the equivalence test (the 1 - 2 alpha interval inside
    the margin) would decide; None when no count up to `most` would, as when the items' part alone is too wide."""
    if not parts.seeds or not math.isfinite(parts.items):
        return None
    effect = abs(parts.effect)
    for n in range(max(2, min(x[2] for x in parts.seeds)), most + 1):
        scaled = [(between, interaction, n, items) for between, interaction, _, items in parts.seeds]
        grown = _Parts(parts.effect, parts.items, parts.items_df, scaled)
        if _half_width(grown, rule, 1 - alpha) < effect:
            return n
        if effect < margin and _half_width(grown, rule, 1 - 2 * alpha) < margin - effect:
            return n
    return None


def _half_width(parts: _Parts, rule: str, confidence: float) -> float:
    return _interval(parts, rule, confidence, with_p=False)[0]

