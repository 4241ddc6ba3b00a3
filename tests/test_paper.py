"""The paper's claims, checked against paired results with known answers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from preproj.analysis.pairing import analysis_plan, column_names, correct, digits
from preproj.analysis.paper import CLAIMS, PAPER_SKIP_NORMS, check_claims, check_depth, claim_pairs, claims_table
from preproj.analysis.plots import plot_paired
from preproj.analysis.stats import accuracy, paired_difference, perplexity


def planted(method: str, reference: str, task: str, delta: float, n: int = 3000, seed: int = 0) -> dict:
    """compare's paired entry for method against reference, from per-item values with a planted effect."""
    rng = np.random.default_rng(seed)
    metric = f"{task}.{column_names('harness')[task]}"
    if task == "wikitext":  # per-document (nll, words): delta is added to the nll per word
        words = rng.integers(50, 500, n).astype(float)
        nll = rng.uniform(2.0, 4.0, n) * words
        a = np.stack([np.c_[nll, words]])
        b = np.stack([np.c_[nll + (delta + rng.normal(0, 0.05, n)) * words, words]])
        p = paired_difference(a, b, perplexity, metric=metric, higher_is_better=False)
    else:
        prob = rng.uniform(0.2, 0.7, n)
        a = (rng.random((1, n)) < prob).astype(float)
        b = (rng.random((1, n)) < prob + delta).astype(float)
        p = paired_difference(a, b, accuracy, metric=metric)
    return {"method": method, "reference": reference, **p.to_dict(), "raw_verdict": p.verdict}


def checked_claims(paired: list[dict], protocol: str = "harness", plan: dict | None = None) -> list[dict]:
    """compare's path: the default plan's corrections, then the claims."""
    plan = plan or analysis_plan(Path("/nonexistent"),
                                 ["base", "lora", "skip", "preproj", "preproj+skip", "preproj+lora"], protocol)
    correct(paired, plan)
    return check_claims(paired, plan, column_names(protocol))


def test_a_claim_is_confirmed_refuted_or_undetectable_by_its_paired_interval():
    paired = [planted("preproj+skip", "base", "lambada", +0.10),        # the paper's direction, large: confirmed
              planted("preproj+skip", "base", "wikitext", +0.10),       # perplexity up: the opposite of the claim
              planted("preproj+skip", "base", "hellaswag", 0.0, n=50),  # 50 items, no effect: not detectable
              planted("lora", "base", "lambada", +0.10)]                # no claim is about lora against base
    checked = {c["metric"]: c for c in checked_claims(paired)}
    assert set(checked) == {"lambada.acc", "wikitext.word_perplexity", "hellaswag.acc_norm"}
    assert checked["lambada.acc"]["verdict"] == "confirmed" and checked["lambada.acc"]["low"] > 0
    assert checked["wikitext.word_perplexity"]["verdict"] == "refuted" \
        and checked["wikitext.word_perplexity"]["effect"] > 0
    undetected = checked["hellaswag.acc_norm"]
    assert undetected["verdict"] == "not detectable at this budget" and undetected["low"] < 0 < undetected["high"]
    rows = "\n".join(claims_table(list(checked.values()), None, digits))
    assert f"would detect ±{undetected['mde']:.3f}" in rows and "0.128 → 0.180 (+40.6%)" in rows


def test_claims_use_the_protocols_column_and_need_both_methods():
    paired = [planted("preproj+skip", "base", "hellaswag", +0.2)]
    assert checked_claims(paired, "paper") == []  # the paper protocol's column is hellaswag.acc
    paired[0]["metric"] = "hellaswag.acc"
    assert [c["verdict"] for c in checked_claims(paired, "paper")] == ["confirmed"]
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
    assert "2.3× at 160M" in claims_table([], check_depth([paper, paper]), digits)[-1]


def test_the_paired_plot_is_written(tmp_path):
    paired = [planted("preproj+skip", "base", task, 0.05, n=200) for task in ("lambada", "wikitext")]
    paired.append(planted("lora", "base", "lambada", 0.0, n=200))
    plot_paired(paired, tmp_path / "paired.png")
    assert (tmp_path / "paired.png").stat().st_size > 5000


def test_a_claim_follows_holm_within_its_family_and_a_plan_file_changes_the_family(tmp_path):
    """Three claims (and a comparison that is no claim) with raw p near 0.02 each: called one at a time, none
    survives Holm over the three; a plan whose claims family holds only one of them leaves that one confirmed."""
    paired = [planted("preproj+skip", "base", "lambada", +0.025, n=3000, seed=k) for k in range(8)]
    pick = sorted(paired, key=lambda p: abs(np.log(p["p"] / 0.02)))[0]
    tasks = ("lambada", "hellaswag", "arc_easy")
    entries = [{**pick, "metric": f"{t}.{column_names('harness')[t]}"} for t in tasks]
    entries.append({**pick, "reference": "lora"})
    assert 0.01 < pick["p"] < 0.05 and pick["raw_verdict"] == "better"
    three = checked_claims([dict(e) for e in entries])
    assert {c["metric"] for c in three} == {"lambada.acc", "hellaswag.acc_norm"} and len(three) == 3
    assert all(c["verdict"] == "not detectable at this budget" for c in three)
    assert all(c["p_adjusted"] >= min(1.0, 2 * c["p"]) for c in three)
    plan = json.loads(json.dumps(analysis_plan(tmp_path, ["base", "preproj+skip"], "harness")))
    plan["families"][0]["members"] = [{"method": "preproj+skip", "reference": "base", "metric": "lambada.acc"}]
    (tmp_path / "analysis_plan.json").write_text(json.dumps(plan))
    one = checked_claims([dict(e) for e in entries], plan=analysis_plan(tmp_path, [], "harness"))
    assert [(c["metric"], c["verdict"]) for c in one] == [("lambada.acc", "confirmed")]
    plan["families"][0]["correction"] = "bonferroni"
    with pytest.raises(ValueError, match="correction 'bonferroni'"):
        checked_claims([dict(e) for e in entries], plan=plan)


def test_a_plan_declaring_another_alpha_gets_its_verdicts_text_and_prose_at_that_alpha():
    """A raw p just under 0.01 that rounds to 0.01 in two digits: under a plan declaring alpha 0.01 it is a claim
    confirmed, and the cell, the claims table and the report's prose all write it and the threshold on its side of
    0.01, not of 0.05."""
    from preproj.analysis.pairing import describe_entry
    from preproj.analysis.report import paired_paragraph, render_report

    pick = planted("preproj+skip", "base", "lambada", +0.025, n=3000)
    entry = {**pick, "p": 0.00996}
    member = {k: entry[k] for k in ("method", "reference", "metric")}
    plan = {"alpha": 0.01, "comparisons": [{"method": "preproj+skip", "reference": "base"}],
            "families": [{"name": "claims", "correction": "holm", "members": [member]}]}
    claims = checked_claims([entry], plan=plan)
    assert [c["verdict"] for c in claims] == ["confirmed"]
    assert "p 0.00996, adj. 0.00996: better" in describe_entry(entry, 0.01)
    assert "p 0.01, adj. 0.01: better" in describe_entry(entry)  # at 0.05, two digits keep it on its side
    assert "| 0.00996 (0.00996) | confirmed" in "\n".join(claims_table(claims, None, digits, 0.01))
    assert "adjusted p is below 0.01;" in paired_paragraph({"paired": [{**entry, "text": ""}], "plan": plan})
    report = {"model": "m", "preset": "quick", "protocol": "harness", "eval_limits": {}, "train": {}, "seeds": 1,
              "methods": {}, "paired": [{**entry, "text": describe_entry(entry, 0.01), "seeds": [1, 1],
                                         "test": "item-and-seed"}], "claims": claims, "plan": plan}
    assert "confirmed when the adjusted p is below 0.01 and" in render_report(report)


def test_the_report_answers_the_plans_question_by_its_own_family_whichever_family_decides_elsewhere(tmp_path):
    """A plan's question is answered first, by the Holm family named "question" alone: skip - base on LAMBADA at
    p 0.02 is better there (adjusted 0.04, its partner not measured yet and counted as p = 1), though the later
    claims family, which decides the entry in the paired table, leaves it undetected (adjusted 0.06)."""
    from preproj.analysis.pairing import describe_entry
    from preproj.analysis.report import question_section, render_report

    lambada = {**planted("skip", "base", "lambada", +0.10), "p": 0.02}
    member = {k: lambada[k] for k in ("method", "reference", "metric")}
    partner = {"method": "preproj+skip", "reference": "base", "metric": "lambada.acc"}
    others = [{**member, "metric": m} for m in ("hellaswag.acc_norm", "arc_easy.acc")]
    plan = {"question": "Does the skip raise LAMBADA?", "declared": "before any run", "alpha": 0.05,
            "comparisons": [{"method": "skip", "reference": "base"}, {"method": "preproj+skip", "reference": "base"}],
            "families": [{"name": "question", "correction": "holm", "members": [member, partner]},
                         {"name": "claims", "correction": "holm", "members": [member, *others]}]}
    (tmp_path / "analysis_plan.json").write_text(json.dumps(plan))
    declared = analysis_plan(tmp_path, [], "harness")
    paired = [lambada]
    correct(paired, declared)
    assert lambada["decided_by"] == "claims" and lambada["verdict"] == "no detectable difference"
    assert lambada["adjusted"] == pytest.approx({"question": 0.04, "claims": 0.06})

    report = {"model": "m", "preset": "study", "protocol": "harness", "eval_limits": {}, "train": {}, "seeds": 1,
              "methods": {}, "paired": [{**lambada, "text": describe_entry(lambada), "seeds": [1, 1],
                                         "test": "item-and-seed"}], "claims": [], "plan": declared}
    section = question_section(report)
    assert section[:2] == ["", "## The question"] and "*Does the skip raise LAMBADA?*" in section[3]
    assert "2 paired comparisons, corrected together by Holm's method" in section[3]
    rows = {line.split(" | ")[0]: line for line in section if line.startswith("| ") and " − " in line}
    assert rows["| skip − base"].endswith("| 0.02 (0.04) | better |")
    assert "not measured yet | – (counted as p = 1)" in rows["| preproj+skip − base"]
    text = render_report(report)
    assert text.index("## The question") < text.index("## Paired differences")
    assert question_section({**report, "plan": {**declared, "question": None}}) == []
    assert question_section({**report, "plan": {**declared, "families": declared["families"][1:]}}) == []


def test_a_declared_member_still_to_come_counts_as_p_one_so_no_interim_call_is_withdrawn(tmp_path):
    """A plan file declares three claims among its comparisons (and one outside them); with one not measured yet,
    Holm corrects over all three (the missing one as p = 1) and the report says so. Once it arrives no adjusted p
    rises, whatever its p, and the call stands."""
    from preproj.analysis.pairing import declared_members, describe_entry, family_sizes
    from preproj.analysis.report import paired_paragraph

    paired = [planted("preproj+skip", "base", "lambada", +0.025, n=3000, seed=k) for k in range(8)]
    pick = sorted(paired, key=lambda p: p["p"])[0]
    tasks = ("lambada", "hellaswag", "wikitext")
    entries = [{**pick, "metric": f"{t}.{column_names('harness')[t]}", "p": pick["p"] * (1 + i)}
               for i, t in enumerate(tasks)]
    members = [{k: e[k] for k in ("method", "reference", "metric")} for e in entries]
    elsewhere = {"method": "preproj+skip", "reference": "preproj", "metric": "hellaswag.acc_norm"}  # not compared here
    plan = {"alpha": 0.05, "comparisons": [{"method": "preproj+skip", "reference": "base"}],
            "families": [{"name": "claims", "correction": "holm", "members": [*members, elsewhere]}]}
    (tmp_path / "analysis_plan.json").write_text(json.dumps(plan))
    declared = analysis_plan(tmp_path, [], "harness")
    assert declared_members(declared) == {"claims": {(m["method"], m["reference"], m["metric"]) for m in members}}

    interim = [dict(e) for e in entries[:2]]
    correct(interim, declared)
    assert family_sizes(declared, interim) == {"claims": (3, 1)}
    assert [e["adjusted"]["claims"] for e in interim] == pytest.approx([3 * pick["p"], 2 * 2 * pick["p"]])
    text = paired_paragraph({"paired": [{**e, "text": describe_entry(e)} for e in interim], "plan": declared})
    assert "3 declared comparisons, 1 of them not measured yet and counted as p = 1" in text
    for p_last in (1e-6, 0.5, 1.0):  # the last one arrives, at any p
        final = [dict(e) for e in entries[:2]] + [{**entries[2], "p": p_last}]
        correct(final, declared)
        assert family_sizes(declared, final) == {"claims": (3, 0)}
        assert all(f["adjusted"]["claims"] <= i["adjusted"]["claims"] for f, i in zip(final, interim))

    undeclared = {**declared, "file": None}  # a default plan commits to nothing not yet measured
    interim = [dict(e) for e in entries[:2]]
    correct(interim, undeclared)
    assert [e["adjusted"]["claims"] for e in interim] == pytest.approx([2 * pick["p"], 2 * pick["p"]])
