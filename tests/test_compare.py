"""preproj compare end to end on a tiny Llama with the embedded tokenizer (real vocabulary, tiny width)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
from dataclasses import replace

import numpy as np
import pytest
import torch
import transformers
from conftest import data_dir

import preproj
import preproj.analysis.report as report_text
from preproj.analysis.report import agreement_paragraph, paired_paragraph
from preproj.cli import main
from preproj.experiments import compare, sweep
from preproj.experiments import retrain as retrain_module
from preproj.experiments.compare import CompareArgs, run_compare
from preproj.runtime.files import RunLock
from preproj.training import TrainingInterrupted


@pytest.fixture(scope="module")
def tiny_real_vocab_model(tmp_path_factory, smollm2):
    _, tokenizer = smollm2
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                      max_position_embeddings=512,
                                      tie_word_embeddings=True)
    path = tmp_path_factory.mktemp("tiny_llama")
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.mark.integration
def test_compare_writes_table_results_and_plots(tmp_path, tiny_real_vocab_model, monkeypatch):
    assert data_dir() is not None, "../shared/data or $PREPROJ_DATA_DIR is needed"
    small = {**compare.PRESETS["cpu"]["train"], "seq_len": 32, "batch_size": 2, "eval_every": 2, "save_every": 2}
    monkeypatch.setitem(compare.PRESETS["cpu"], "train", small)
    monkeypatch.setitem(compare.PRESETS["cpu"], "eval", {**compare.PRESETS["cpu"]["eval"], "max_length": 256})
    args = CompareArgs(model=tiny_real_vocab_model, methods="base,preproj+skip,lora", steps=3, limit=4,
                       data_dir=str(data_dir()), out=str(tmp_path / "cmp"))
    report = run_compare(args, progress=False)
    out = tmp_path / "cmp"
    for name in ("report.md", "results.json", "skip_norms.png", "skip_norms.json", "training_curves.png", "paired.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    results = json.loads((out / "results.json").read_text())
    assert set(results["methods"]) == {"base", "preproj+skip", "lora"}
    d, n = 32, 2
    assert results["methods"]["preproj+skip"]["trainable_params"] == n * (2 * d * 40 + d * d)
    lora = results["methods"]["lora"]["trainable_params"]
    assert abs(lora - results["methods"]["preproj+skip"]["trainable_params"]) \
        <= 0.01 * results["methods"]["preproj+skip"]["trainable_params"]
    assert results["methods"]["base"]["trainable_params"] == 0
    cell = results["methods"]["preproj+skip"]["metrics"]["lambada.acc"]
    assert cell["n_items"] == 4 and cell["ci95"] is not None
    assert len(json.loads((out / "skip_norms.json").read_text())["ours"]["preproj+skip"]) == n
    # one each, for every method; preset cpu trains in 'auto', resolved for this machine and recorded
    from preproj.runtime.precision import precision as as_precision
    assert (results["precision"], results["eval_precision"]) == (as_precision("auto", "cpu").name, "fp32")
    # paired comparisons over the same items: every trained method against base, and against lora
    keys = {(p["method"], p["reference"], p["metric"]) for p in results["paired"]}
    for method, reference in (("preproj+skip", "base"), ("lora", "base"), ("preproj+skip", "lora")):
        for metric in ("lambada.acc", "hellaswag.acc_norm", "arc_easy.acc", "wikitext.word_perplexity",
                       "wikitext.heldout_loss"):
            assert (method, reference, metric) in keys
    for p in results["paired"]:
        assert p["low"] <= p["effect"] <= p["high"] and p["items"] in (2, 4) and p["verdict"]
    assert (out / "preproj+skip-seed42" / "items.lambada.jsonl").is_file()
    text = (out / "report.md").read_text()
    # what made it: the report's process, and each run's record (three runs made here, alike)
    assert results["provenance"]["cpu"] and "## Provenance" in text
    assert "- 3 run(s) (base-seed42, preproj+skip-seed42, lora-seed42): preproj " in text
    assert f"training {results['precision']}, evaluation fp32" in text
    assert "| preproj+skip | 1 | 0.0003 | 0.01M |" in text and "| base | 1 | – | – |" in text and "| 0 | – |" in text \
        and "## Paired differences" in text and "Pythia-160M" in text and "## What agrees" in text
    # every claim about two methods that were run, with a verdict from its paired entry; the depth claim from skip norms
    claims = {(c["method"], c["reference"], c["metric"]): c for c in results["claims"]}
    assert set(claims) == {(m, r, f"{t}.{metric}") for m, r in (("preproj+skip", "base"), ("preproj+skip", "lora"))
                           for t, metric in (("lambada", "acc"), ("hellaswag", "acc_norm"),
                                             ("wikitext", "word_perplexity"))}
    for key, c in claims.items():
        p = next(x for x in results["paired"] if (x["method"], x["reference"], x["metric"]) == key)
        assert (c["effect"], c["low"], c["high"]) == (p["effect"], p["low"], p["high"]) and c["verdict"] in text
    assert results["depth"]["seeds"] == 1 and "## The paper's claims" in text and "last layer over the first" in text
    # A second run reuses every finished (method, seed) instead of training again.
    again = run_compare(args, progress=False)
    assert again["methods"]["lora"]["metrics"] == report["methods"]["lora"]["metrics"]
    # An evaluation stopped part-way resumes at the task it was in: finished tasks are not scored again.
    (out / "lora-seed42" / "result.json").unlink()
    (out / "lora-seed42" / "eval.wikitext.json").unlink()
    # --report-only reports the finished runs and lists the rest, training and evaluating nothing, even while
    # the comparison owns the directory.
    with monkeypatch.context() as m, RunLock(out, "preproj compare"):
        m.setattr(compare, "train", lambda *a, **k: pytest.fail("--report-only trained"))
        m.setattr(compare, "evaluate", lambda *a, **k: pytest.fail("--report-only evaluated"))
        interim = run_compare(replace(args, report_only=True), progress=False)
    assert interim["pending"] == ["lora-seed42"] and list(interim["methods"]) == ["base", "preproj+skip"]
    assert interim["methods"]["preproj+skip"]["metrics"] == report["methods"]["preproj+skip"]["metrics"]
    assert {(p["method"], p["reference"]) for p in interim["paired"]} == {("preproj+skip", "base")}
    assert "**Interim report**: 1 run(s) still to come (lora-seed42)" in (out / "report.md").read_text()
    scored = []
    real = compare.evaluate
    monkeypatch.setattr(compare, "evaluate", lambda *a, **k: scored.append(a[2]) or real(*a, **k))
    third = run_compare(args, progress=False)
    assert scored == [["wikitext"]] and third["methods"]["lora"]["metrics"] == report["methods"]["lora"]["metrics"]
    # its times count every part: the tasks scored before the stop as well as the one after, and the training
    lora_dir = out / "lora-seed42"
    lora_run = json.loads((lora_dir / "result.json").read_text())
    parts = [json.loads((lora_dir / f"eval.{t}.json").read_text())["seconds"]
             for t in ("lambada", "hellaswag", "arc_easy", "wikitext")]
    assert lora_run["eval_seconds"] == sum(parts) > 0
    assert lora_run["train_seconds"] == json.loads((lora_dir / "summary.json").read_text())["train_seconds"] > 0
    # ... but only if the weights are the very ones it scored
    kept = json.loads((lora_dir / "eval.lambada.json").read_text())
    assert len(kept["setting"]["weights"]) == 64
    kept["setting"]["weights"] = "0" * 64
    (lora_dir / "eval.lambada.json").write_text(json.dumps(kept))
    (lora_dir / "result.json").unlink()
    # a task kept from before evaluation times were recorded leaves the run's evaluation time unknown
    older = json.loads((lora_dir / "eval.hellaswag.json").read_text())
    (lora_dir / "eval.hellaswag.json").write_text(json.dumps({k: v for k, v in older.items() if k != "seconds"}))
    scored.clear()
    fourth = run_compare(args, progress=False)
    assert scored == [["lambada"]]
    assert fourth["methods"]["lora"]["eval_seconds"] == {"mean": None, "runs": 0, "of": 1}
    assert "| unknown |" in (out / "report.md").read_text()


def test_times_are_averaged_over_the_runs_that_have_them():
    assert report_text._fmt_seconds(report_text.mean_known([100.0, None, 300.0])) == "200s (2 of 3 runs)"
    assert report_text._fmt_seconds(report_text.mean_known([100.0, 300.0])) == "200s"
    assert report_text._fmt_seconds(report_text.mean_known([None])) == "unknown"


def test_precisions_that_load_the_base_differently_are_refused(tmp_path):
    with pytest.raises(ValueError, match="pick two that load the base alike"):
        run_compare(CompareArgs(methods="base", precision="bf16-true", eval_precision="fp32", out=str(tmp_path)),
                    progress=False)


def test_report_only_needs_a_finished_run(tmp_path):
    with pytest.raises(ValueError, match="No .method, seed. run has finished"):
        run_compare(CompareArgs(methods="base,lora", lr_sweep="none", report_only=True, out=str(tmp_path)),
                    progress=False)


def test_agreement_paragraph_reads_the_numbers():
    def row(lam, hs, arc, ppl, ci=0.001):
        cells = {"lambada.acc": lam, "hellaswag.acc_norm": hs, "arc_easy.acc": arc, "wikitext.word_perplexity": ppl}
        return {"metrics": {k: {"mean": v, "ci95": ci} for k, v in cells.items()}}

    report = {"protocol": "harness", "methods": {"base": row(0.30, 0.35, 0.50, 30.0),
                                                  "preproj+skip": row(0.35, 0.34, 0.50, 20.0)}}
    text = agreement_paragraph(report)
    assert "LAMBADA +0.05 (paper +0.052: same direction)" in text
    assert "HellaSwag -0.01 (paper +0.012: opposite direction)" in text and "ARC-E +0 (paper -0.01: no change)" in text
    assert "base" in text and "preproj+skip < base" in text
    # a paired test on the same items, where there is one, decides whether a change is detectable
    report["methods"]["base"]["metrics"]["hellaswag.acc_norm"]["ci95"] = 0.05
    assert "HellaSwag -0.01 (paper +0.012: opposite direction, not detectable)" in agreement_paragraph(report)
    report["paired"] = [{"method": "preproj+skip", "reference": "base", "metric": "hellaswag.acc_norm",
                         "verdict": "worse"}]
    assert "HellaSwag -0.01 (paper +0.012: opposite direction)" in agreement_paragraph(report)


@pytest.mark.integration
def test_learning_rates_are_swept_per_method_and_seeds_go_where_asked(tmp_path, tiny_real_vocab_model, monkeypatch,
                                                                      caplog):
    assert data_dir() is not None, "../shared/data or $PREPROJ_DATA_DIR is needed"
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"line {i}: the quick brown fox jumps over the lazy dog and keeps running {i}"
                                for i in range(400)))
    small = {**compare.PRESETS["cpu"]["train"], "data": str(corpus), "seq_len": 32, "batch_size": 2, "eval_every": 2,
             "save_every": 2, "warmup": 1}
    monkeypatch.setitem(compare.PRESETS["cpu"], "train", small)
    monkeypatch.setitem(compare.PRESETS["cpu"], "eval", {**compare.PRESETS["cpu"]["eval"], "max_length": 256})
    args = CompareArgs(model=tiny_real_vocab_model, methods="base,skip,lora", steps=2, limit=3, seeds=2,
                       seeded_methods="skip", lr_sweep="1e-4,3e-2", sweep_steps=2, data_dir=str(data_dir()),
                       out=str(tmp_path / "cmp"))
    with caplog.at_level("INFO", logger="preproj"):
        report = run_compare(args, progress=False)
    sweep = json.loads((tmp_path / "cmp" / "sweep" / "sweep.json").read_text())
    for method in ("skip", "lora"):
        losses = sweep["heldout_loss"][method]
        assert set(losses) == {"0.0001", "0.03"}
        assert sweep["chosen"][method] == float(min(losses, key=losses.get)) == report["methods"][method]["lr"]
    assert report["methods"]["skip"]["seeds"] == [42, 43] and report["methods"]["lora"]["seeds"] == [42]
    # seed by seed: every method's first seed before any second one
    started = re.findall(r"\[compare\] (\S+) seed (\d+) \.\.\.", caplog.text)
    assert started == [("base", "42"), ("skip", "42"), ("lora", "42"), ("skip", "43")]
    assert "2 seeds per method: the interval rule (raw, separate quantiles) gives the seeds' part of each interval " \
           "the t-quantile of one degree of freedom, 12.7 (3 seeds: 4.3)" in caplog.text
    assert {p["seeds"][1] for p in report["paired"] if p["method"] == "skip" and p["reference"] == "base"} == {2}
    text = (tmp_path / "cmp" / "report.md").read_text()
    assert "## Learning rates" in text
    # Seeds differ by method, so the report names each method's; the swept rates replace the default one.
    assert "Seeds: skip 42, 43; lora 42." in text and "Seeds per method" not in text
    assert "at each method's swept learning rate" in text and '"lr"' not in text.split("## Learning rates")[0]
    with pytest.raises(ValueError, match="reported WikiText-2 test"):
        monkeypatch.setitem(compare.PRESETS["cpu"], "train", {**small, "data": "wikitext2"})
        run_compare(args, progress=False)
    # `preproj paired` reproduces compare's own comparison from the files alone (every seed of DIR:METHOD) ...
    monkeypatch.setitem(compare.PRESETS["cpu"], "train", small)
    out = tmp_path / "cmp"
    assert main(["paired", f"{out}:base", f"{out}:skip", "--out", str(tmp_path / "p.json")]) == 0
    ours = {p["metric"]: p for p in json.loads((tmp_path / "p.json").read_text())["paired"]}
    theirs = {p["metric"]: p for p in report["paired"] if p["method"] == "skip" and p["reference"] == "base"}
    assert set(ours) == set(theirs)
    for metric, p in ours.items():
        assert (p["effect"], p["low"], p["high"], list(p["seeds"])) == (
            theirs[metric]["effect"], theirs[metric]["low"], theirs[metric]["high"], list(theirs[metric]["seeds"]))
    # ... and takes single items files too; a missing method says what it looked for.
    one = out / "skip-seed42" / "items.lambada.jsonl"
    assert main(["paired", str(out / "base-seed42" / "items.lambada.jsonl"), str(one)]) == 0
    both = ",".join(str(out / f"skip-seed{s}" / "items.lambada.jsonl") for s in (42, 43))
    assert main(["paired", f"{out}:base", both, "--out", str(tmp_path / "q.json")]) == 0
    q = json.loads((tmp_path / "q.json").read_text())["paired"]
    assert [p["metric"] for p in q] == ["lambada.acc"] and q[0]["effect"] == ours["lambada.acc"]["effect"]
    assert main(["paired", f"{out}:base", f"{out}:nothing"]) == 2
    # Comparing a subset of the methods keeps the others' sweep rows in sweep.json.
    run_compare(replace(args, methods="base,skip"), progress=False)
    assert json.loads((out / "sweep" / "sweep.json").read_text())["heldout_loss"] == sweep["heldout_loss"]
    # METHOD@LR is an arm at a fixed rate beside the swept one; a second sweep seed retrains the best two rates.
    both = run_compare(replace(args, methods="base,skip,skip@1e-3", sweep_seeds=2, seeds=1), progress=False)
    assert both["methods"]["skip@1e-3"]["lr"] == 1e-3 and (out / "skip@1e-3-seed42" / "result.json").is_file()
    assert {p["method"] for p in both["paired"] if p["reference"] == "base"} == {"skip", "skip@1e-3"}
    finalists = json.loads((out / "sweep" / "sweep.json").read_text())["finalists"]["skip"]
    assert all(len(losses) == 2 for losses in finalists.values()) and len(finalists) == 2
    assert (out / "sweep" / "skip-lr0.0001-seed43" / "summary.json").is_file()
    # A finished run moved to the arm of its rate, as compare's refusal to reuse it at another rate says to, keeps its
    # comparisons: its item files are read where it is now, not where it was written.
    (out / "skip@1e-3-seed42").rename(out / "skip@0.001-seed42")
    moved = run_compare(replace(args, methods="base,skip,skip@0.001", sweep_seeds=2, seeds=1, report_only=True),
                        progress=False)
    effects = {m: {p["metric"]: p["effect"] for p in result["paired"] if p["method"] == m and p["reference"] == "base"}
               for m, result in (("skip@1e-3", both), ("skip@0.001", moved))}
    assert effects["skip@1e-3"] and effects["skip@0.001"] == effects["skip@1e-3"]
    with pytest.raises(ValueError, match="METHOD@LR"):
        run_compare(replace(args, methods="base,skip@fast"), progress=False)


def test_a_sweep_keeps_rows_only_from_the_same_candidates_and_steps(tmp_path):
    old = {"candidates": [1e-4, 1e-3], "steps": 8, "heldout_loss": {"lora": {"0.0001": 3.0, "0.001": 2.9}},
           "chosen": {"lora": 1e-3}, "precisions": ["bf16"]}
    new = {"candidates": [1e-4, 1e-3], "steps": 8, "heldout_loss": {"skip": {"0.0001": 3.1, "0.001": 3.2}},
           "chosen": {"skip": 1e-4}, "precisions": ["fp32"]}
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(old))
    merged = sweep._merged_with_file(new, path)
    assert merged["heldout_loss"] == {**old["heldout_loss"], **new["heldout_loss"]}
    assert merged["chosen"] == {"lora": 1e-3, "skip": 1e-4} and merged["precisions"] == ["bf16", "fp32"]
    path.write_text(json.dumps({**old, "steps": 16}))
    assert sweep._merged_with_file(new, path) == new


def test_agreement_paragraph_has_no_direction_where_the_paper_saw_no_change():
    def row(lam, hs, arc, ppl):
        cells = {"lambada.acc": lam, "hellaswag.acc_norm": hs, "arc_easy.acc": arc, "wikitext.word_perplexity": ppl}
        return {"metrics": {k: {"mean": v, "ci95": 0.05} for k, v in cells.items()}}

    # the paper's Pythia-160M LoRA has HellaSwag 0.326, the same as its base
    report = {"protocol": "harness",
              "methods": {"base": row(0.30, 0.40, 0.50, 30.0), "lora": row(0.30, 0.375, 0.50, 40.0)}}
    assert "HellaSwag -0.025 (paper +0: no change in the paper; ours not detectable)" in agreement_paragraph(report)


def test_paired_paragraph_says_which_calls_survive_the_correction():
    def row(i, verdict, raw):
        return {"method": f"m{i}", "reference": "base", "metric": "lambada.acc", "verdict": verdict, "raw_verdict": raw,
                "text": f"+0.010 [+0.001, +0.019] p 0.01, adj. 0.02: {verdict}"}
    plan = {"families": [{"name": "all", "correction": "benjamini-hochberg", "members": "all"}]}
    rows = [row(i, "better" if i < 3 else "no detectable difference", "better" if i < 5 else "no detectable difference")
            for i in range(60)]
    text = paired_paragraph({"seeds": 3, "paired": rows, "plan": plan})
    assert "all: benjamini-hochberg over every comparison" in text and "The other 57 comparisons" in text
    assert "2 of them only because of it" in text and "m3 vs base on lambada.acc; m4 vs base" in text
    text = paired_paragraph({"seeds": 1, "paired": rows[5:10], "plan": plan})
    assert "any of the 5 comparisons" in text and "conditional on it" in text
    assert "The other" not in paired_paragraph({"seeds": 3, "paired": rows[:3], "plan": plan})


def test_paired_under_the_paper_protocol_scores_wikitext_by_the_papers_perplexity(tmp_path):
    """The bf16 question's comparison: `eval --protocol paper --items` records, one file per seed, paired over rows and
    seeds; the paper's perplexity is exp of the mean row loss, whatever each row's length."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(10, 500, size=150)

    def write(name: str, shift: float) -> str:
        path = tmp_path / f"{name}.items.jsonl"
        path.write_text("".join(json.dumps({"task": "wikitext", "index": i, "ll": -(3.0 + shift + 0.01 * (i % 7)) * n,
                                            "tokens": int(n)}) + "\n" for i, n in enumerate(tokens)))
        return str(path)

    a = ",".join(write(f"a{s}", 0.0) for s in range(3))
    b = ",".join(write(f"b{s}", -0.05 - 0.001 * s) for s in range(3))
    assert main(["paired", a, b, "--protocol", "paper", "--out", str(tmp_path / "p.json")]) == 0
    (p,) = json.loads((tmp_path / "p.json").read_text())["paired"]
    mean_loss = 3.0 + 0.01 * np.mean([i % 7 for i in range(150)])
    assert p["metric"] == "wikitext.perplexity" and p["a"] == pytest.approx(math.exp(mean_loss))
    assert p["b"] == pytest.approx(math.exp(mean_loss - 0.051)) and p["verdict"] == "better" and p["seeds"] == [3, 3]


@pytest.mark.integration
def test_compare_resumed_with_other_training_arguments_is_refused(tmp_path, tiny_real_vocab_model, monkeypatch):
    small = {**compare.PRESETS["cpu"]["train"], "seq_len": 32, "batch_size": 2, "eval_every": 2, "save_every": 2}
    monkeypatch.setitem(compare.PRESETS["cpu"], "train", small)
    monkeypatch.setitem(compare.PRESETS["cpu"], "eval", {**compare.PRESETS["cpu"]["eval"], "max_length": 256})
    args = CompareArgs(model=tiny_real_vocab_model, methods="base,skip", steps=2, limit=2, data_dir=str(data_dir()),
                       out=str(tmp_path / "cmp"))
    run_compare(args, progress=False)
    (tmp_path / "cmp" / "skip-seed42" / "result.json").unlink()  # as if stopped after training, before scoring
    with pytest.raises(ValueError, match=r"started with other arguments \(steps 2 -> 3\)"):
        run_compare(replace(args, steps=3), progress=False)
    assert run_compare(args, progress=False)["methods"]["skip"]["train_tokens"] == 2 * 2 * 32


@pytest.fixture
def finished_compare(tmp_path, tiny_real_vocab_model, monkeypatch):
    """A finished two-step comparison (base, skip) through the command line, on a small cpu preset."""
    small = {**compare.PRESETS["cpu"]["train"], "seq_len": 32, "batch_size": 2, "eval_every": 2, "save_every": 2}
    monkeypatch.setitem(compare.PRESETS["cpu"], "train", small)
    monkeypatch.setitem(compare.PRESETS["cpu"], "eval", {**compare.PRESETS["cpu"]["eval"], "max_length": 256})
    out = tmp_path / "cmp"
    argv = ["compare", "--model", tiny_real_vocab_model, "--methods", "base,skip", "--steps", "2", "--limit", "2",
            "--precision", "fp32", "--device", "cpu", "--data-dir", str(data_dir()), "--out", str(out), "--quiet"]
    assert main(argv) == 0
    return {"argv": argv, "out": out, "small": small, "model": tiny_real_vocab_model}


def _with(argv: list[str], flag: str, value: str) -> list[str]:
    argv = list(argv)
    argv[argv.index(flag) + 1] = value
    return argv


# (id, change to the finished comparison's command or preset, what the refusal must name)
RERUNS = [
    ("steps", lambda c, m: _with(c["argv"], "--steps", "3"), "steps 2 -> 3"),
    ("model", lambda c, m: _with(c["argv"], "--model", str(shutil.copytree(c["model"], c["out"].parent / "other"))),
     "model "),
    ("precision", lambda c, m: _with(c["argv"], "--precision", "bf16-mixed"), "precision 'fp32' -> 'bf16-mixed'"),
    ("data", lambda c, m: (m.setitem(compare.PRESETS["cpu"], "train", {**c["small"], "data": "wikitext2-train"}),
                           c["argv"])[1], "data 'wikitext2' -> 'wikitext2-train'"),
    ("limit", lambda c, m: _with(c["argv"], "--limit", "3"), "lambada limit 2 -> 3"),
]


@pytest.mark.integration
@pytest.mark.parametrize("case", RERUNS, ids=[c[0] for c in RERUNS])
def test_a_compare_rerun_with_changed_arguments_is_refused_naming_the_field(finished_compare, case, monkeypatch,
                                                                           capsys):
    """Reusing the finished runs would report them under arguments they did not run with."""
    _, change, named = case
    before = (finished_compare["out"] / "results.json").read_text()
    capsys.readouterr()
    assert main(change(finished_compare, monkeypatch)) == 2
    err = capsys.readouterr().err.strip()
    assert named in err and "finished with other arguments" in err and len(err.splitlines()) == 1, err
    assert (finished_compare["out"] / "results.json").read_text() == before  # nothing relabelled


@pytest.mark.integration
def test_a_finished_compare_rerun_keeps_its_time_and_a_new_method_set_trains_only_what_is_new(finished_compare,
                                                                                             capsys):
    out, argv = finished_compare["out"], finished_compare["argv"]
    took = json.loads((out / "results.json").read_text())["wall_seconds"]
    assert took > 0
    capsys.readouterr()
    assert main(argv) == 0  # nothing new: the recorded time stands, and the summary says nothing ran
    assert json.loads((out / "results.json").read_text())["wall_seconds"] == took
    assert "every run already finished" in capsys.readouterr().out
    base_result = (out / "base-seed42" / "result.json").stat().st_mtime_ns
    assert main(_with(argv, "--methods", "base,preproj")) == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["methods"]) == {"base", "preproj"} and results["new_runs"] == 1
    assert results["wall_seconds"] > took and (out / "base-seed42" / "result.json").stat().st_mtime_ns == base_result


@pytest.mark.integration
def test_a_task_added_after_a_run_finished_is_scored_on_its_retrained_weights(tmp_path, tiny_real_vocab_model,
                                                                              monkeypatch, caplog):
    """A task the preset gained after the runs finished (as wikitext_file came to the study): --fill-missing
    retrains each run (its weights are not kept in git), checks the SHA-256 of the retrained weights against the
    one its other tasks recorded, and only then scores the new task."""
    small = {**compare.PRESETS["cpu"]["train"], "seq_len": 32, "batch_size": 2, "eval_every": 2, "save_every": 2}
    monkeypatch.setitem(compare.PRESETS["cpu"], "train", small)
    monkeypatch.setitem(compare.PRESETS["cpu"], "eval", {**compare.PRESETS["cpu"]["eval"], "max_length": 256})
    args = CompareArgs(model=tiny_real_vocab_model, methods="base,skip", steps=2, limit=2, data_dir=str(data_dir()),
                       out=str(tmp_path / "cmp"))
    run_compare(args, progress=False)
    skip_dir = tmp_path / "cmp" / "skip-seed42"
    trained = preproj.load_adapter(preproj.load_model(tiny_real_vocab_model)[0], skip_dir)
    shutil.rmtree(skip_dir / "checkpoint")
    (skip_dir / "adapter_model.safetensors").unlink()  # as in git: the weights are not kept
    monkeypatch.setitem(compare.PRESETS["cpu"], "eval", {**compare.PRESETS["cpu"]["eval"],
                                                         "extra_tasks": ("wikitext_file",)})
    assert "wikitext_file" not in run_compare(args, progress=False)["methods"]["skip"]["metrics"]  # not asked

    # A fill stopped part-way (Ctrl-C after the retrain's first step) resumes that retrain where it stopped.
    follow = retrain_module.following

    def stopping_after_step_1(run_dir):
        check = follow(run_dir)

        def on_record(record):
            check(record)
            if record["step"] == 1:
                os.kill(os.getpid(), signal.SIGINT)
        return on_record

    monkeypatch.setattr(retrain_module, "following", stopping_after_step_1)
    with pytest.raises(TrainingInterrupted, match="after step 1"):
        run_compare(replace(args, fill_missing=True), progress=False)
    place = tmp_path / "cmp" / ".skip-seed42.retrain"
    assert torch.load(place / "checkpoint" / "state.pt", weights_only=True)["step"] == 1
    monkeypatch.setattr(retrain_module, "following", follow)
    filled = run_compare(replace(args, fill_missing=True), progress=False)
    assert not place.exists()  # removed once scored
    _, tokenizer = preproj.load_model(tiny_real_vocab_model)
    direct = preproj.evaluate(trained, tokenizer, ["wikitext_file"], limit=2, max_length=256, data_dir=str(data_dir()),
                              progress=False)["tasks"]["wikitext_file"]
    result = json.loads((skip_dir / "result.json").read_text())["tasks"]["wikitext_file"]
    assert result["word_perplexity"] == direct["word_perplexity"]
    assert "wikitext_file" in json.loads((tmp_path / "cmp" / "base-seed42" / "result.json").read_text())["tasks"]
    assert not [p for p in (tmp_path / "cmp").iterdir() if ".retrain" in p.name]
    assert not list((tmp_path / "cmp").rglob(".eval.*.journal*"))  # each task's journal goes once it is scored
    assert filled["methods"]["skip"]["trainable_params"] > 0

    result = json.loads((skip_dir / "result.json").read_text())
    result["tasks"].pop("wikitext_file")
    (skip_dir / "result.json").write_text(json.dumps(result))
    (skip_dir / "eval.wikitext_file.json").unlink()
    lambada = json.loads((skip_dir / "eval.lambada.json").read_text())
    lambada["setting"]["weights"] = "0" * 64
    (skip_dir / "eval.lambada.json").write_text(json.dumps(lambada))
    with caplog.at_level("WARNING"):
        run_compare(replace(args, fill_missing=True), progress=False)
    assert "wikitext_file not scored: the retrained weights differ from the scored ones" in caplog.text
    assert "wikitext_file" not in json.loads((skip_dir / "result.json").read_text())["tasks"]

    # A machine that does not reproduce the run is found at the first step whose loss differs, not after training.
    log = [json.loads(line) for line in (skip_dir / "train_log.jsonl").read_text().splitlines()]
    log[1]["loss"] += 2**-20
    (skip_dir / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    caplog.clear()
    with caplog.at_level("WARNING"):
        run_compare(replace(args, fill_missing=True), progress=False)
    assert (f"the retrain departs from the recorded run (step 1 loss {log[1]['loss'] - 2**-20!r}, recorded"
            in caplog.text)
    assert "trained with the kernels this process runs, so something else changed" in caplog.text
    assert "wikitext_file" not in json.loads((skip_dir / "result.json").read_text())["tasks"]
    assert not [p for p in (tmp_path / "cmp").iterdir() if ".retrain" in p.name]
    assert not list((tmp_path / "cmp").rglob(".eval.*.journal*"))  # each task's journal goes once it is scored
