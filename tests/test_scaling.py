"""`preproj scaling` end to end on a tiny grid: runs, shared plain baselines, resume, paired report, plots."""

from __future__ import annotations

import json
import re

import pytest

import preproj.experiments.scaling as scaling
from preproj.experiments.scaling import ScalingArgs, parse_sizes, parse_variants, run_scaling
from preproj.experiments.scaling_report import sink_reading
from preproj.training.probes import uniform_first_token_attention

CORPUS = ["the cat sat on the mat and the dog ate the bone while the bird sang a song. " * 2] * 200


def test_grid_runs_reports_and_resumes_without_retraining(tmp_path, monkeypatch, caplog):
    text = tmp_path / "text.txt"
    text.write_text("\n".join(CORPUS))
    args = ScalingArgs(out=str(tmp_path / "grid"), sizes="1x32", variants="preproj+skip,base@params,base@flops,skip",
                       seeds=2, tokens=8 * 32 * 6, data=str(text), tokenizer="train:300", seq_len=32, batch_size=8,
                       warmup=2, eval_every=3, device="cpu", precision="fp32", timing_rounds=1)
    with caplog.at_level("INFO", logger="preproj"):
        results = run_scaling(args, progress=False)
    # the log counts the runs the grid trains: base@flops shares base@params's, so 3 variants x 2 seeds
    assert re.findall(r"\[scaling\] (run \d+ of \d+): \S+/(\S+)/seed\d \(lr [\d.e-]+, 1,536 tokens\)", caplog.text) == [
        (f"run {i} of 6", v) for i, v in enumerate(["preproj+skip"] * 2 + ["base@params"] * 2 + ["skip"] * 2, 1)]
    entry = results["sizes"]["1x32"]
    assert set(entry["variants"]) == {"preproj+skip", "base@params", "base@flops", "skip"}
    params = {v: x["params"] for v, x in entry["variants"].items()}
    assert abs(params["base@params"] / params["preproj+skip"] - 1) < 0.02
    # The two plain matches give one width here, so base@flops reuses base@params's runs instead of training twice.
    assert entry["variants"]["base@flops"]["validation_loss"] == entry["variants"]["base@params"]["validation_loss"]
    assert not (tmp_path / "grid" / "1x32" / "base@flops").exists()
    for variant in ("base@params", "skip"):
        paired = entry["paired"]["preproj+skip"][variant]
        assert tuple(paired["seeds"]) == (2, 2) and paired["metric"] == "1x32 validation loss"
        assert paired["low"] <= paired["effect"] <= paired["high"] \
            and paired["adjusted"]["against preproj+skip"] >= paired["p"]
    assert "base@flops" not in entry["paired"]["base@params"]  # the same runs as base@params: nothing to compare
    assert set(entry["paired"]["base@params"]) == {"skip"}  # preproj+skip against base@params: the first family
    assert len(entry["variants"]["skip"]["first_token_attention"][0]) == 1  # one layer
    assert 0 < entry["timing"]["adapted_step_seconds"] and entry["timing"]["plain_step_seconds"] > 0
    report = (tmp_path / "grid" / "report.md").read_text()
    assert "| preproj+skip |" in report and "reference" in report and "modules' share" in report
    assert "Holm within 'against preproj+skip' and Holm within 'against base@params'" in report
    for name in ("loss_vs_tokens.png", "loss_vs_flops.png", "skip_norms.png", "sink.png", "results.json",
                 "analysis_plan.json"):
        assert (tmp_path / "grid" / name).stat().st_size > 0

    def refuse(*a, **k):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(scaling, "pretrain", refuse)
    again = run_scaling(args, progress=False)
    assert again["sizes"]["1x32"]["variants"]["skip"]["validation_loss"] == entry["variants"]["skip"]["validation_loss"]
    assert json.loads((tmp_path / "grid" / "results.json").read_text())["sizes"]["1x32"]["paired"]


def test_the_sink_is_read_against_attention_spread_evenly():
    """Mean over seeds, per layer: only a layer above the even level is called a sink, and it is named."""
    even = uniform_first_token_attention(128)
    below = {"first_token_attention": [[0.01, 0.02], [0.02, 0.03]], "validation_loss": [3.0, 3.1]}
    above = {"first_token_attention": [[0.01, 0.30], [0.02, 0.20], None],  # a seed without the probe is skipped
             "validation_loss": [2.9, 3.2, 3.3]}
    assert sink_reading({"variants": {"skip": below}}, even).endswith(
        "no layer of any run reaches it (0.010 to 0.030): no sink has formed.")
    said = sink_reading({"variants": {"skip": below, "gate": above, "gate@again": above}}, even)
    # a variant sharing another's runs (base@flops at base@params's width) is named once, under the first name
    assert said.endswith("above it (a sink), mean over seeds: gate layer 1 (0.250).")


@pytest.mark.parametrize("sizes, variants, message", [
    ("4x100", "preproj+skip", "multiple of 32"),
    ("4x128", "base,skip", "must include preproj+skip"),
    ("4x128", "preproj+skip,lora", "--variants takes"),
])
def test_bad_grids_are_refused(sizes, variants, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_sizes(sizes)
        parse_variants(variants)


def test_a_sweep_picks_each_variants_rate_on_validation_and_the_declared_plan_drives_the_report(tmp_path, monkeypatch):
    text = tmp_path / "text.txt"
    text.write_text("\n".join(CORPUS))
    args = ScalingArgs(out=str(tmp_path / "grid"), sizes="1x32", variants="preproj+skip,gate,pre-mlp", seeds=2,
                       tokens=8 * 32 * 4, lrs="1e-4,1e-2", sweep_tokens=8 * 32 * 3, data=str(text),
                       tokenizer="train:300", seq_len=32, batch_size=8, warmup=1, eval_every=2, device="cpu",
                       precision="fp32", timing_rounds=1)
    results = run_scaling(args, progress=False)
    for variant, v in results["sizes"]["1x32"]["variants"].items():
        sweep = v["sweep"]
        assert set(sweep) == {"0.0001", "0.01"} and all(len(x) == 1 for x in sweep.values())
        assert v["lr"] == float(min(sweep, key=lambda r: sweep[r][0]))  # the lowest validation loss decides
        summary = json.loads((tmp_path / "grid" / "1x32" / variant / "seed1" / "summary.json").read_text())
        assert summary["pretrain"]["lr"] == v["lr"] and summary["tokens_seen"] == 8 * 32 * 4
        assert json.loads((tmp_path / "grid" / "1x32" / "sweep" / f"{variant}@0.01" / "seed0" / "summary.json")
                          .read_text())["tokens_seen"] == 8 * 32 * 3
    assert {(c["method"], c["reference"]) for c in results["comparisons"]} == {("gate", "preproj+skip"),
                                                                               ("pre-mlp", "preproj+skip")}

    plan_file = tmp_path / "grid" / "analysis_plan.json"
    plan = json.loads(plan_file.read_text())
    plan["families"] = [{"name": "against gate", "correction": "benjamini-hochberg", "reference": "gate"}]
    plan_file.write_text(json.dumps(plan))
    monkeypatch.setattr(scaling, "pretrain", lambda *a, **k: (_ for _ in ()).throw(AssertionError("retrained")))
    again = run_scaling(args, progress=False)
    assert {(c["method"], c["reference"]) for c in again["comparisons"]} == {("preproj+skip", "gate"),
                                                                             ("pre-mlp", "gate")}
    assert "Benjamini-Hochberg within 'against gate'" in (tmp_path / "grid" / "report.md").read_text()
    rewritten = run_scaling(ScalingArgs(out=str(tmp_path / "grid"), report_only=True))
    assert [c["p"] for c in rewritten["comparisons"]] == [c["p"] for c in again["comparisons"]]
    with pytest.raises(ValueError, match="--lrs takes positive learning rates"):
        scaling.parse_lrs("3e-3,fast")
