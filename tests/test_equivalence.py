"""Equivalence within a declared margin (analysis/equivalence.py) and the verdicts it gives a plan's comparisons."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from preproj.analysis.equivalence import equivalence
from preproj.analysis.pairing import correct, describe_entry, verdict_in, with_equivalence
from preproj.analysis.report import paired_paragraph
from preproj.analysis.stats import RULES, accuracy, paired_difference


def _arms(shift: float, seeds: int = 5, items: int = 4000, flip: float = 0.1, seed: int = 0):
    """Two arms of 0/1 items sharing item difficulty; B answers `shift` more of them right on average."""
    rng = np.random.default_rng(seed)
    truth = rng.random(items) < 0.35
    a = np.stack([truth ^ (rng.random(items) < flip) for _ in range(seeds)]).astype(float)
    b = np.stack([truth ^ (rng.random(items) < flip) for _ in range(seeds)]).astype(float)
    b[:, rng.random(items) < abs(shift)] = 1.0 if shift > 0 else 0.0
    return a, b


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("seed", range(4))
def test_tost_rejects_exactly_when_the_90_percent_interval_lies_inside_the_margin(rule, seed):
    a, b = _arms(0.0, seed=seed)
    for margin in (0.003, 0.006, 0.01, 0.02):
        p = equivalence(a, b, accuracy, margin, seed_paired=True, rule=rule)["p"]
        d = paired_difference(a, b, accuracy, seed_paired=True, rule=rule, confidence=0.90)
        assert (p < 0.05) == (-margin < d.low and d.high < margin), (margin, p, d.low, d.high)


def test_a_difference_outside_the_margin_is_never_equivalent_and_more_seeds_decide_a_close_call():
    a, b = _arms(0.05)
    assert equivalence(a, b, accuracy, 0.01, seed_paired=True, rule="raw, separate quantiles")["p"] > 0.5
    a, b = _arms(0.0, seeds=3, items=5000, flip=0.05)
    rule = "raw, separate quantiles"
    n = equivalence(a, b, accuracy, 0.01, seed_paired=True, rule=rule)["seeds_to_decide"]
    assert n is not None and n >= 3
    # the items' part alone is wider than a tight margin: no number of seeds decides it on these items
    assert equivalence(a, b, accuracy, 0.001, seed_paired=True, rule=rule)["seeds_to_decide"] is None
    with pytest.raises(ValueError, match="margin must be > 0"):
        equivalence(a, b, accuracy, 0.0)


def _entry(method: str, p: float, tost: float, margin: float = 0.01) -> dict:
    return {"method": method, "reference": "lora", "metric": "lambada.acc", "effect": 0.001, "low": -0.004,
            "high": 0.006, "mde": 0.007, "p": p, "raw_verdict": "better" if p < 0.05 else "no detectable difference",
            "items": 5153, "equivalence": {"margin": margin, "p": tost, "seeds_to_decide": 8}}


def test_a_plans_margin_turns_a_null_into_equivalent_or_undecided_corrected_in_its_family():
    plan = {"alpha": 0.05, "comparisons": [], "families": [{"name": "question", "correction": "holm", "members": [
        {"method": m, "reference": "lora", "metric": "lambada.acc"} for m in ("skip", "skip@common", "gate")]}]}
    found = [_entry("skip", 0.5, 0.01), _entry("skip@common", 0.6, 0.03), _entry("gate", 0.001, math.nan)]
    correct(found, plan)
    # Holm over three TOST p-values: 0.01 x 3 = 0.03 passes, 0.03 x 2 = 0.06 does not
    assert [e["verdict"] for e in found] == ["equivalent within ±0.01", "undecided at ±0.01", "better"]
    assert found[0]["equivalence"]["adjusted"]["question"] == pytest.approx(0.03)
    assert verdict_in(found[1], "question", 0.05) == "undecided at ±0.01"
    assert describe_entry(found[1]).endswith("undecided at ±0.01 (8 seeds would decide it)")
    text = paired_paragraph({"paired": [{**e, "text": describe_entry(e)} for e in found], "plan": plan})
    assert "Equivalence (two one-sided tests within the plan's margins" in text
    assert "skip vs lora on lambada.acc: equivalent within ±0.01; 1 undecided." in text
    assert "no detectable difference" not in text.split("Equivalence")[1]


def test_what_a_null_could_have_detected_is_given_at_the_level_its_family_decides_at():
    # The smallest detectable effect and the seeds that would decide are those at alpha over the family's size, the
    # level a comparison passes whatever the rest of its family shows; an uncorrected figure would promise more.
    from preproj.analysis.stats import paired_t

    a, b = _arms(0.0, seeds=3, items=3000, flip=0.05, seed=3)
    rule = "raw, separate quantiles"
    alone = with_equivalence(paired_difference(a, b, accuracy, seed_paired=True, rule=rule, metric="lambada.acc"),
                             functools.partial(equivalence, a, b, accuracy, 0.015, seed_paired=True, rule=rule))
    assert alone.at_level(0.05)["mde"] == pytest.approx(alone.mde, rel=1e-12)
    plan = {"alpha": 0.05, "families": [{"name": "four", "correction": "holm", "members": "all"}]}
    entries = [{"method": m, "reference": "lora", **alone.to_dict(), "raw_verdict": alone.verdict}
               for m in ("skip", "gate", "preproj", "value-residual")]
    assert "at_level" not in entries[0]
    correct(entries, plan, [alone] * 4)
    entry = entries[0]
    assert entry["detect_alpha"] == pytest.approx(0.05 / 4)
    assert entry["mde"] == pytest.approx(alone.at_level(0.0125)["mde"]) and entry["mde"] > 1.2 * alone.mde
    assert (alone.equivalence["seeds_to_decide"], entry["equivalence"]["seeds_to_decide"]) == (3, 5)
    if entry["verdict"] == "no detectable difference":
        assert describe_entry(entry).endswith(f"(would detect ±{entry['mde']:.3f} after correction)")
    # a family of one asks for no stricter level, and says nothing about a correction
    single = [{"method": "skip", "reference": "lora", **alone.to_dict(), "raw_verdict": alone.verdict}]
    correct(single, {"alpha": 0.05, "families": [{"name": "one", "correction": "holm", "members": "all"}]}, [alone])
    assert single[0]["mde"] == pytest.approx(alone.mde) and "after correction" not in describe_entry(single[0])
    # the seed-paired t of the from-scratch studies: the same at 0.05, wider at a stricter level
    t = paired_t([1.0, 1.2, 0.9, 1.1], [1.05, 1.3, 0.92, 1.2])
    assert t.at_level(0.05)["mde"] == pytest.approx(t.mde) and t.at_level(0.01)["mde"] > t.mde


def test_the_level_a_comparison_needs_counts_what_its_family_has_already_called():
    from preproj.analysis.pairing import detect_level

    entry, called = {"p": 0.2}, [{"p": 1e-6}, {"p": 1e-5}]
    both = {id(e) for e in called}
    assert detect_level(entry, ("holm", 4, both), 0.05) == pytest.approx(0.05 / 2)  # Holm's third step
    assert detect_level(entry, ("benjamini-hochberg", 4, both), 0.05) == pytest.approx(0.05 * 3 / 4)
    assert detect_level(entry, ("holm", 4, set()), 0.05) == detect_level(entry, ("benjamini-hochberg", 4, set()), 0.05)
    assert detect_level(called[0], ("holm", 4, both), 0.05) == pytest.approx(0.05 / 3)  # itself not counted
    assert detect_level(entry, None, 0.05) == 0.05
