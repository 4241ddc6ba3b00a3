"""The paper's claims, checked against paired results with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from preproj.compare import COLUMNS, _digits, plot_paired
from preproj.paper import CLAIMS, PAPER_SKIP_NORMS, check_claims, check_depth, claim_pairs, claims_table
from preproj.stats import accuracy, paired_bootstrap, perplexity


def planted(method: str, reference: str, task: str, delta: float, n: int = 3000, seed: int = 0) -> dict:
    """compare's paired entry for method against reference, from per-item values with a planted effect."""
    rng = np.random.default_rng(seed)
    metric = f"{task}.{dict(COLUMNS['harness'])[task]}"
    if task == "wikitext":  # per-document (nll, words): delta is added to the nll per word
        words = rng.integers(50, 500, n).astype(float)
        nll = rng.uniform(2.0, 4.0, n) * words
        a = np.stack([np.c_[nll, words]])
        b = np.stack([np.c_[nll + (delta + rng.normal(0, 0.05, n)) * words, words]])
        p = paired_bootstrap(a, b, perplexity, metric=metric, higher_is_better=False, n_boot=400)
    else:
        prob = rng.uniform(0.2, 0.7, n)
        a = (rng.random((1, n)) < prob).astype(float)
        b = (rng.random((1, n)) < prob + delta).astype(float)
        p = paired_bootstrap(a, b, accuracy, metric=metric, n_boot=400)
    return {"method": method, "reference": reference, **p.to_dict()}


def test_a_claim_is_confirmed_refuted_or_undetectable_by_its_paired_interval():
    paired = [planted("preproj+skip", "base", "lambada", +0.10),        # the paper's direction, large: confirmed
              planted("preproj+skip", "base", "wikitext", +0.10),       # perplexity up: the opposite of the claim
              planted("preproj+skip", "base", "hellaswag", 0.0, n=50),  # 50 items, no effect: not detectable
              planted("lora", "base", "lambada", +0.10)]                # no claim is about lora against base
    checked = {c["metric"]: c for c in check_claims(paired, dict(COLUMNS["harness"]))}
    assert set(checked) == {"lambada.acc", "wikitext.word_perplexity", "hellaswag.acc_norm"}
    assert checked["lambada.acc"]["verdict"] == "confirmed" and checked["lambada.acc"]["low"] > 0
    assert checked["wikitext.word_perplexity"]["verdict"] == "refuted" and checked["wikitext.word_perplexity"]["effect"] > 0
    undetected = checked["hellaswag.acc_norm"]
    assert undetected["verdict"] == "not detectable at this budget" and undetected["low"] < 0 < undetected["high"]
    rows = "\n".join(claims_table(list(checked.values()), None, _digits))
    assert f"would detect ±{undetected['mde']:.3f}" in rows and "0.128 → 0.180 (+40.6%)" in rows


def test_claims_use_the_protocols_column_and_need_both_methods():
    paired = [planted("preproj+skip", "base", "hellaswag", +0.2)]
    assert check_claims(paired, dict(COLUMNS["paper"])) == []  # the paper protocol's column is hellaswag.acc
    paired[0]["metric"] = "hellaswag.acc"
    assert [c["verdict"] for c in check_claims(paired, dict(COLUMNS["paper"]))] == ["confirmed"]
    assert claim_pairs(["base", "preproj+skip"]) == [("preproj+skip", "base")]
    everything = claim_pairs(["base", "lora", "skip", "preproj", "preproj+skip", "preproj+lora"])
    assert set(everything) == {(c.method, c.reference) for c in CLAIMS} and len(everything) == len(set(everything))


def test_the_depth_claim_is_a_t_interval_over_seeds_of_last_over_first():
    rising = [np.linspace(0.1, 0.1 * r, 12).tolist() for r in (2.0, 2.2, 2.4)]
    depth = check_depth(rising)
    assert depth["ratio"] == pytest.approx(2.2) and depth["low"] > 1 and depth["verdict"] == "confirmed"
    assert check_depth([list(reversed(n)) for n in rising])["verdict"] == "refuted"
    assert check_depth([[0.1, 0.12], [0.1, 0.08]])["verdict"] == "not detectable at this budget"
    assert check_depth([rising[0]])["verdict"].startswith("not detectable") and check_depth([]) is None
    paper = PAPER_SKIP_NORMS["Pythia-160M"]
    assert "2.3× at 160M" in claims_table([], check_depth([paper, paper]), _digits)[-1]


def test_the_paired_plot_is_written(tmp_path):
    paired = [planted("preproj+skip", "base", task, 0.05, n=200) for task in ("lambada", "wikitext")]
    paired.append(planted("lora", "base", "lambada", 0.0, n=200))
    plot_paired(paired, tmp_path / "paired.png")
    assert (tmp_path / "paired.png").stat().st_size > 5000
