"""The paired statistics on synthetic data with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from preproj.analysis.stats import (
    RULE,
    RULES,
    accuracy,
    benjamini_hochberg,
    describe,
    holm,
    p_text,
    paired_bootstrap,
    paired_difference,
    paired_t,
    perplexity,
    ratio_of_sums,
    t_interval,
    two_seeds_note,
)


def planted(rng, n_items: int, delta: float):
    """0/1 outcomes of two methods on the same items: item difficulty shared, B better by `delta` in expectation."""
    p = rng.uniform(0.2, 0.7, n_items)
    a = (rng.random(n_items) < p).astype(float)
    b = (rng.random(n_items) < p + delta).astype(float)
    return a[None], b[None]


def test_the_interval_covers_a_planted_difference_at_about_its_nominal_rate():
    rng, delta, hits, runs = np.random.default_rng(0), 0.05, 0, 200
    for k in range(runs):
        a, b = planted(rng, 400, delta)
        p = paired_bootstrap(a, b, accuracy, n_boot=400, seed=k)
        hits += p.low <= delta <= p.high
    assert 0.90 <= hits / runs <= 0.99, hits / runs


def test_a_large_planted_difference_is_detected_and_called_by_direction():
    a, b = planted(np.random.default_rng(1), 2000, 0.15)
    better = paired_bootstrap(a, b, accuracy, metric="acc")
    assert better.verdict == "better" and better.low > 0 and better.effect == pytest.approx(b.mean() - a.mean())
    worse_ppl = paired_bootstrap(np.stack([np.c_[np.full(50, 2.0), np.ones(50)]]),
                                 np.stack([np.c_[np.full(50, 2.5) + np.random.default_rng(2).normal(0, .1, 50),
                                                 np.ones(50)]]),
                                 perplexity, higher_is_better=False)
    assert worse_ppl.verdict == "worse" and worse_ppl.effect > 0


def test_identical_runs_give_a_zero_difference():
    a, _ = planted(np.random.default_rng(3), 300, 0.0)
    p = paired_bootstrap(a, a.copy(), accuracy)
    assert (p.effect, p.low, p.high, p.mde) == (0.0, 0.0, 0.0, 0.0) and p.verdict == "no detectable difference"
    docs = np.random.default_rng(4).uniform(1, 5, (1, 40, 2))
    q = paired_bootstrap(docs, docs.copy(), perplexity, higher_is_better=False)
    assert q.effect == 0.0 and q.low == q.high == 0.0


def test_no_difference_reports_the_smallest_detectable_effect():
    a, b = planted(np.random.default_rng(5), 200, 0.0)
    p = paired_bootstrap(a, b, accuracy)
    assert p.verdict == "no detectable difference" and 0.03 < p.mde < 0.3
    assert f"would detect ±{p.mde:.3f}" in describe(p)


def test_seeds_and_items_combine_as_documented():
    rng = np.random.default_rng(6)
    base, _ = planted(rng, 500, 0.0)
    outcomes = (rng.random((3, 500)) < 0.5).astype(float)
    # The effect is the difference of the seed-averaged metrics.
    p = paired_bootstrap(base, outcomes, accuracy)
    assert p.effect == pytest.approx(outcomes.mean(axis=1).mean() - base.mean()) and p.seeds == (1, 3)
    # Seed-to-seed variation widens the interval: three seeds that differ by a constant offset each
    # versus the same three seeds without the offsets.
    flip = np.zeros((3, 500))
    flip[0, :40], flip[2, :40] = 1, -1  # seed 0 gets 40 items more right, seed 2 40 fewer
    spread = np.clip(outcomes + flip, 0, 1)
    narrow = paired_bootstrap(base, outcomes, accuracy, seed=1)
    wide = paired_bootstrap(base, spread, accuracy, seed=1)
    assert (wide.high - wide.low) > 1.1 * (narrow.high - narrow.low)
    # ... by the seeds' variance: symmetric about the effect and at least 1.96 of their standard error wide.
    seed_se = np.sqrt(spread.mean(axis=1).var(ddof=1) / 3)
    assert wide.high - wide.effect == pytest.approx(wide.effect - wide.low)
    assert wide.high - wide.effect > 1.96 * seed_se
    # Seeds that are all the same give the single-seed interval (up to bootstrap noise).
    same = paired_bootstrap(base, np.repeat(outcomes[:1], 3, axis=0), accuracy, seed=2)
    single = paired_bootstrap(base, outcomes[:1], accuracy, seed=2)
    assert same.effect == pytest.approx(single.effect)
    assert (same.high - same.low) == pytest.approx(single.high - single.low, rel=0.15)


def test_the_interval_covers_a_planted_difference_with_seed_to_seed_variation_at_about_its_nominal_rate():
    """Three seeds a side, each seed shifting its method's accuracy on every item (training randomness),
    the seeds' spread larger than the items' noise, as on a large task. Resampling the three seeds in the
    bootstrap covered about 85% here; their variance with a t-quantile covers about 94%."""
    rng, delta, hits, runs = np.random.default_rng(7), 0.03, 0, 250
    for k in range(runs):
        p = rng.uniform(0.2, 0.7, 2000)
        a = (rng.random((3, 2000)) < p + rng.normal(0, 0.04, (3, 1))).astype(float)
        b = (rng.random((3, 2000)) < p + delta + rng.normal(0, 0.04, (3, 1))).astype(float)
        q = paired_bootstrap(a, b, accuracy, n_boot=200, seed=k)
        hits += q.low <= delta <= q.high
    assert 0.92 <= hits / runs <= 0.99, hits / runs


def test_seeds_that_differ_only_item_by_item_add_little_to_the_items_interval():
    """No seed effect, only each seed's own luck on each item: the items' bootstrap carries that already,
    so the interval stays near the items-only one of the seed-averaged outcomes. Counting the seeds' raw
    variance on top made it about 1.55 times as wide here."""
    rng, ratios = np.random.default_rng(12), []
    for k in range(30):
        p = rng.uniform(0.2, 0.7, 2000)
        a, b = (rng.random((3, 2000)) < p).astype(float), (rng.random((3, 2000)) < p + 0.03).astype(float)
        q = paired_bootstrap(a, b, accuracy, n_boot=300, seed=k)
        items_only = paired_bootstrap(a.mean(0)[None], b.mean(0)[None], accuracy, n_boot=300, seed=k)
        ratios.append((q.high - q.low) / (items_only.high - items_only.low))
    assert 0.95 < np.mean(ratios) < 1.35, np.mean(ratios)


def test_unpaired_items_are_refused():
    with pytest.raises(ValueError, match="same items on both sides"):
        paired_bootstrap(np.zeros((1, 10)), np.zeros((1, 11)), accuracy)


def test_t_interval_over_seeds():
    mean, half = t_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.302653 * 1.0 / np.sqrt(3), rel=1e-5)


def test_paired_t_covers_a_planted_seed_paired_difference_at_its_nominal_rate():
    """Three seeds, a seed effect shared by both sides (it cancels in the pairing) and noise per run."""
    rng, delta, hits, runs = np.random.default_rng(3), -0.05, 0, 2000
    for _ in range(runs):
        shared = rng.normal(3.0, 0.3, 3)
        p = paired_t(shared + rng.normal(0, 0.02, 3), shared + delta + rng.normal(0, 0.02, 3), higher_is_better=False)
        hits += p.low <= delta <= p.high
    assert 0.93 <= hits / runs <= 0.97, hits / runs
    big = paired_t([3.0, 3.1, 2.9], [2.8, 2.91, 2.69], higher_is_better=False)
    assert big.verdict == "better" and big.effect == pytest.approx(-0.2, abs=1e-9)
    from scipy.stats import ttest_rel

    assert big.p == pytest.approx(ttest_rel([2.8, 2.91, 2.69], [3.0, 3.1, 2.9]).pvalue, rel=1e-9)
    same = paired_t([3.0, 3.1, 2.9], [3.0, 3.1, 2.9])
    assert same.effect == 0 and same.verdict == "no detectable difference"
    with pytest.raises(ValueError, match="one value per seed"):
        paired_t([1.0, 2.0], [1.0, 2.0, 3.0])


def test_the_closed_form_items_variance_is_the_bootstraps():
    """One seed a side: paired_difference's interval is the bootstrap's, without its Monte Carlo noise."""
    rng = np.random.default_rng(20)
    a, b = planted(rng, 1500, 0.04)
    exact = paired_difference(a, b, accuracy)
    boot = paired_bootstrap(a, b, accuracy, n_boot=4000, seed=1)
    assert exact.effect == boot.effect and exact.test == "item-and-seed"
    assert (exact.high - exact.low) == pytest.approx(boot.high - boot.low, rel=0.06)
    docs = np.stack([np.c_[rng.uniform(2, 4, 60) * (w := rng.integers(100, 900, 60)), w]])
    other = docs.copy()
    other[..., 0] *= rng.normal(0.97, 0.01, 60)
    exact = paired_difference(docs, other, perplexity, higher_is_better=False)
    boot = paired_bootstrap(docs, other, perplexity, higher_is_better=False, n_boot=4000)
    assert (exact.high - exact.low) == pytest.approx(boot.high - boot.low, rel=0.1)
    assert exact.p < 0.05 and exact.verdict == "better"


def test_satterthwaite_df_shrink_when_the_seeds_spread_barely_exceeds_the_interaction():
    """HellaSwag-like: three seeds whose metrics differ about as much as the items' luck alone would make them."""
    rng = np.random.default_rng(21)
    p = rng.uniform(0.2, 0.7, 1000)
    a = (rng.random((3, 1000)) < p).astype(float)
    b = (rng.random((3, 1000)) < p + 0.02 + rng.normal(0, 0.01, (3, 1))).astype(float)
    wide = paired_difference(a, b, accuracy, rule="subtract, Satterthwaite df")
    narrow = paired_difference(a, b, accuracy, rule="subtract, n-1 df")
    raw = paired_difference(a, b, accuracy, rule="raw, n-1 df")
    assert wide.effect == narrow.effect == raw.effect
    assert (wide.high - wide.low) >= (narrow.high - narrow.low) and (raw.high - raw.low) >= (narrow.high - narrow.low)
    assert {"subtract, n-1 df", "subtract, Satterthwaite df", "raw, n-1 df"} <= set(RULES) and RULE in RULES


def test_seed_paired_differences_cancel_a_shared_seed_effect():
    rng = np.random.default_rng(22)
    p = rng.uniform(0.2, 0.7, 3000)
    shared = rng.normal(0, 0.05, (3, 1))  # seed i: the same data order, the same shift for both arms
    a = (rng.random((3, 3000)) < p + shared).astype(float)
    b = (rng.random((3, 3000)) < p + shared + 0.03).astype(float)
    paired = paired_difference(a, b, accuracy, seed_paired=True)
    unpaired = paired_difference(a, b, accuracy)
    assert paired.test == "seed-paired" and paired.effect == unpaired.effect
    assert (paired.high - paired.low) < 0.7 * (unpaired.high - unpaired.low)
    with pytest.raises(ValueError, match="same two or more seeds"):
        paired_difference(a[:1], b[:1], accuracy, seed_paired=True)


def test_holm_and_benjamini_hochberg_adjust_as_published():
    p = [0.01, 0.04, 0.03, 0.005, 0.2]
    assert holm(p) == pytest.approx([0.04, 0.09, 0.09, 0.025, 0.2])
    assert benjamini_hochberg(p) == pytest.approx([0.025, 0.05, 0.05, 0.025, 0.2])
    assert holm([]) == [] and benjamini_hochberg([]) == []


def test_each_rules_p_value_agrees_with_its_own_interval():
    """p < 0.05 exactly when the 95% interval excludes zero, for every rule, paired or not."""
    rng = np.random.default_rng(23)
    for k in range(12):
        p = rng.uniform(0.2, 0.7, 800)
        shift = rng.normal(0, 0.03, (3, 1))
        a = (rng.random((3, 800)) < p + shift).astype(float)
        b = (rng.random((3, 800)) < p + shift + 0.02 * (k % 4) + rng.normal(0, 0.02, (3, 1))).astype(float)
        for rule in RULES:
            for paired in (False, True):
                q = paired_difference(a, b, accuracy, rule=rule, seed_paired=paired)
                assert (q.p < 0.05) == (q.low > 0 or q.high < 0), (rule, paired, q)
                assert q.low <= q.effect <= q.high and 0 <= q.p <= 1


def test_an_undefined_p_value_rejects_nothing_and_still_counts_in_its_family():
    """A comparison on one item has no p-value; the corrections keep it as p = 1 (so the others pay for it) and
    leave its own adjusted p undefined instead of failing (found by `compare --limit 1`)."""
    nan = float("nan")
    assert holm([0.01, nan])[0] == pytest.approx(0.02) and math.isnan(holm([0.01, nan])[1])
    bh = benjamini_hochberg([0.01, nan, 0.04])
    assert bh[0] == pytest.approx(0.03) and math.isnan(bh[1]) and bh[2] == pytest.approx(0.06)


@pytest.mark.parametrize("p, text", [(0.04988, "0.0499"), (0.0499996, "0.0499996"), (0.0011, "0.0011"), (0.3, "0.3"),
                                     (0.05004, "0.05"), (0.051, "0.051")])
def test_a_p_value_is_never_written_on_the_other_side_of_alpha(p, text):
    assert p_text(p) == text


def test_two_seeds_widen_an_interval_by_their_quantile_only_where_they_vary_under_the_chosen_rule():
    """An arm whose second seed repeats its first item for item (no seed variance at all): 'raw, t(n-1) for all' still
    gives the whole interval t(1)'s quantile, 12.7 / 1.96 times one seed's (three such seeds 4.3 / 1.96); the chosen
    rule gives t(1) to the seeds' part only, which is zero here, so the interval is one seed's. two_seeds_note says
    what two seeds cost under the rules that give the seeds a t(n-1) quantile."""
    rng = np.random.default_rng(3)
    base = (rng.random((1, 2000)) < 0.4).astype(float)
    arm = (rng.random((1, 2000)) < 0.42).astype(float)

    def half(k: int, rule: str) -> float:
        p = paired_difference(base, np.repeat(arm, k, axis=0), accuracy, rule=rule)
        return (p.high - p.low) / 2

    old = "raw, t(n-1) for all"
    assert half(2, old) / half(1, old) == pytest.approx(12.706 / 1.960, rel=1e-3)
    assert half(3, old) / half(1, old) == pytest.approx(4.303 / 1.960, rel=1e-3)
    assert RULE == "raw, separate quantiles" and half(2, RULE) == pytest.approx(half(1, RULE), rel=1e-9)
    assert "one degree of freedom, 12.7 (3 seeds: 4.3)" in two_seeds_note(2)
    assert two_seeds_note(1) is None and two_seeds_note(3) is None and two_seeds_note(2, "raw, n-1 df") is None
    assert "the seeds' part of each interval" in two_seeds_note(2) and "the whole interval" in two_seeds_note(2, old)


def test_a_ratio_over_documents_takes_the_jackknife_variance_and_the_documents_effective_number():
    """Influence values of a ratio of sums are the jackknife's: var(u)/n is the jackknife variance computed leave one
    out; its items' degrees of freedom are Kish's effective number of documents less one."""
    from preproj.analysis.stats import _parts

    rng = np.random.default_rng(4)
    counts = rng.lognormal(6, 1.0, 40)
    docs = np.stack([np.stack([(3 + rng.normal(0, 0.3, 40)) * counts, counts], axis=-1)])  # (1 seed, 40 docs, 2)
    theta = docs[0, :, 0].sum() / docs[0, :, 1].sum()
    loo = np.array([np.delete(docs[0, :, 0], i).sum() / np.delete(docs[0, :, 1], i).sum() for i in range(40)])
    jackknife = 39 / 40 * ((loo - loo.mean()) ** 2).sum()
    u = ratio_of_sums.influence(docs)[0]
    assert u.var(ddof=1) / 40 == pytest.approx(jackknife, rel=1e-9)
    assert perplexity.influence(docs)[0] == pytest.approx(39 * (np.exp(theta) - np.exp(loo)), rel=1e-9)
    kish = counts.sum() ** 2 / (counts ** 2).sum()
    assert 10 < kish < 30  # long documents dominate: far fewer than 40 documents' worth
    assert _parts(docs, docs * [1.01, 1.0], ratio_of_sums, False).items_df == pytest.approx(kish - 1)
    assert _parts(np.ones((1, 40)), np.zeros((1, 40)), accuracy, False).items_df == 39
