"""The analysis scripts under scripts/, on small synthetic inputs with known answers."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _adapter(path: Path, skips: list[torch.Tensor]) -> Path:
    path.mkdir(parents=True)
    tensors = {f"layers.{i}.skip.weight": w for i, w in enumerate(skips)}
    tensors.update({f"layers.{i}.preproj.up.weight": torch.randn(8, 4) for i in range(len(skips))})
    save_file(tensors, path / "adapter_model.safetensors")
    return path


def test_skip_agreement_tells_shared_matrices_from_matrices_of_the_same_norm(tmp_path):
    agreement = _load("skip_agreement")
    g = torch.Generator().manual_seed(0)
    d = 64
    shared = [torch.randn(d, d, generator=g) for _ in range(3)]
    a = _adapter(tmp_path / "a", shared)
    same = _adapter(tmp_path / "same", [2 * w for w in shared])  # same direction, twice the norm
    # unrelated matrices scaled to exactly the norms of a's: equal norms, cosine near zero
    other = [torch.randn(d, d, generator=g) for _ in range(3)]
    unrelated = _adapter(tmp_path / "unrelated", [o / o.norm() * w.norm() for o, w in zip(other, shared, strict=True)])
    result = agreement.agreement([a, same, unrelated])
    assert result["chance_cosine"] == 1 / d and [x["layer"] for x in result["layers"]] == [0, 1, 2]
    for x, w in zip(result["layers"], shared, strict=True):
        assert x["norms"][0] == pytest.approx(float(w.norm())) and x["norms"][1] == pytest.approx(2 * x["norms"][0])
        assert x["norms"][2] == pytest.approx(x["norms"][0])
        assert x["cosines"]["a~same"] == pytest.approx(1.0, abs=1e-6)
        assert abs(x["cosines"]["a~unrelated"]) < 4 / d and abs(x["cosines"]["same~unrelated"]) < 4 / d

    out = tmp_path / "out"
    run = subprocess.run([sys.executable, str(SCRIPTS / "skip_agreement.py"), str(a), str(same), "--out", str(out)],
                         capture_output=True, text=True, check=True)
    assert "1.000" in run.stdout and (out / "agreement.png").stat().st_size > 0
    assert json.loads((out / "agreement.json").read_text())["layers"][0]["cosines"]["a~same"] \
        == pytest.approx(1.0, abs=1e-6)


def test_skip_agreement_refuses_adapters_without_a_skip(tmp_path):
    agreement = _load("skip_agreement")
    path = tmp_path / "lora"
    path.mkdir()
    save_file({"layers.0.lora_A.weight": torch.zeros(2, 2)}, path / "adapter_model.safetensors")
    with pytest.raises(SystemExit, match="no W_skip"):
        agreement.agreement([path, path])
    with pytest.raises(SystemExit, match="not found"):
        agreement.agreement([tmp_path / "missing", path])


def _study_fixture(out: Path, rule: str | None = None, margins: dict | None = None) -> None:
    """A compare directory in miniature: the base (one seed) and two arms with three shared seeds, per-item files for
    LAMBADA and WikiText in both formats, and the results.json that compare's own analysis writes from them."""
    import numpy as np

    from preproj.analysis.pairing import analysis_plan, paired_comparisons
    from preproj.analysis.stats import RULE

    rng = np.random.default_rng(0)
    p = rng.uniform(0.1, 0.8, 400)
    words, tokens = rng.integers(200, 2000, 30), rng.integers(300, 3000, 30)
    runs, seeds = [], {"base": [42], "skip": [42, 43, 44], "lora": [42, 43, 44]}
    for method, shift in (("base", 0.0), ("skip", 0.05), ("lora", 0.01)):
        for seed in seeds[method]:
            run_dir = out / f"{method}-seed{seed}"
            run_dir.mkdir(parents=True)
            acc = rng.random(400) < p + shift + rng.normal(0, 0.02)
            ll = -tokens * (3.0 - shift + rng.normal(0, 0.05, 30))
            lines = [json.dumps({"task": "lambada", "index": i, "acc": float(a)}) for i, a in enumerate(acc)]
            (run_dir / "items.lambada.jsonl").write_text("\n".join(lines) + "\n")
            lines = [json.dumps({"task": "wikitext", "index": i, "ll": float(x), "words": int(w), "tokens": int(t)})
                     for i, (x, w, t) in enumerate(zip(ll, words, tokens))]
            (run_dir / "items.wikitext.jsonl").write_text("\n".join(lines) + "\n")
            lines = [line.replace('"wikitext"', '"wikitext_file"') for line in lines]  # the other text format
            (run_dir / "items.wikitext_file.jsonl").write_text("\n".join(lines) + "\n")
            runs.append({"method": method, "seed": seed, "run_dir": run_dir.name})
    methods = list(seeds)
    plan = {**analysis_plan(out, methods, "harness"), "rule": rule or RULE, **({"margins": margins} if margins else {})}
    report = {"methods": {m: {"seeds": s} for m, s in seeds.items()}, "plan": plan, "rule": plan["rule"],
              "paired": paired_comparisons(runs, methods, "harness", out, plan)}
    (out / "results.json").write_text(json.dumps(report))


@pytest.mark.parametrize("rule", ["subtract, Satterthwaite df", "raw, n-1 df", "subtract, separate quantiles",
                                  "raw, separate quantiles", "raw, t(n-1) for all"])
def test_recompute_agrees_with_compare_from_the_item_files_alone_and_catches_a_change(tmp_path, capsys, rule):
    _study_fixture(tmp_path, rule)
    recompute = _load("recompute")
    assert "preproj" not in (SCRIPTS / "recompute.py").read_text().split('"""', 2)[2]  # imports no preproj
    assert recompute.main([str(tmp_path)]) == 0
    report = json.loads((tmp_path / "results.json").read_text())
    assert {(e["method"], e["reference"]) for e in report["paired"]} == {("skip", "base"), ("lora", "base"),
                                                                         ("skip", "lora")}
    assert {e["test"] for e in report["paired"] if e["reference"] == "lora"} == {"seed-paired"}
    assert all(e["detect_alpha"] < 0.05 for e in report["paired"])  # the detectable effects it checked: corrected
    assert {e["metric"] for e in report["paired"]} >= {"wikitext_file.word_perplexity", "wikitext.heldout_loss"}
    assert "all agree" in capsys.readouterr().out
    path = tmp_path / "skip-seed43" / "items.lambada.jsonl"
    flipped = [json.loads(line) for line in path.read_text().splitlines()]
    for record in flipped[:40]:
        record["acc"] = 1.0 - record["acc"]
    path.write_text("\n".join(json.dumps(r) for r in flipped) + "\n")
    assert recompute.main([str(tmp_path)]) == 1
    assert "skip - base lambada.acc: effect" in capsys.readouterr().out


def test_recompute_corrects_a_declared_family_for_its_members_still_to_come(tmp_path, capsys):
    """A plan file declares a claim and a metric nothing has measured yet (HellaSwag): both corrections count them as
    p = 1, and recompute.py, reading the same plan, agrees; a report that dropped them would not."""
    from preproj.analysis.pairing import analysis_plan, family_sizes

    plan = analysis_plan(tmp_path, ["base", "skip", "lora"], "harness")
    plan["metrics"] = ["lambada.acc", "hellaswag.acc_norm", "wikitext.word_perplexity", "wikitext_file.word_perplexity"]
    plan["families"][0]["members"] = [{"method": "skip", "reference": "base", "metric": m} for m in plan["metrics"]]
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "analysis_plan.json").write_text(json.dumps(plan))
    _study_fixture(tmp_path)
    report = json.loads((tmp_path / "results.json").read_text())
    assert report["plan"]["families"] == plan["families"] and "measured" not in report["plan"]  # as declared
    assert family_sizes(report["plan"], report["paired"]) == {"claims": (4, 1),  # skip - base on hellaswag
                                                              "all": (12, 3)}    # every pair on hellaswag
    recompute = _load("recompute")
    assert recompute.main([str(tmp_path)]) == 0 and "all agree" in capsys.readouterr().out
    report["plan"].pop("file")  # the same numbers read as a default plan: nothing declared is still to come
    (tmp_path / "results.json").write_text(json.dumps(report))
    assert recompute.main([str(tmp_path)]) == 1 and "adjusted p" in capsys.readouterr().out


def test_coverage_map_subset_welch_undercovers_where_one_arms_seeds_dominate_and_the_chosen_rule_does_not():
    """A fast cell of results/coverage.md's map (fixed seeds, so the same numbers every run): 3 v 3 seeds, one arm's
    seeds varying far more than the other's, the study's situation against LoRA."""
    from preproj.analysis.stats import RULE

    coverage = _load("coverage")
    sd = coverage.SEED_SD["binary"]
    cell = coverage.cell_coverage("binary", 5000, (3, 3), (sd[1], sd[3]), 0.0, 0.0, sims=1500, seed=1)
    welch = cell["item-and-seed: subtract, Satterthwaite df"]["coverage"]
    chosen = cell[f"item-and-seed: {RULE}"]["coverage"]
    assert welch < 0.93 and chosen >= 0.95, (welch, chosen)
    assert cell[f"item-and-seed: {RULE}"]["width"] > cell["item-and-seed: subtract, Satterthwaite df"]["width"]
    # no seed variance: the chosen rule still covers (it pays for that elsewhere with width)
    none = coverage.cell_coverage("ratio", 62, (3, 3), (0.0, 0.0), 0.0, 0.0, sims=300, seed=2)
    assert none[f"item-and-seed: {RULE}"]["coverage"] >= 0.94


def test_equivalence_needs_every_tasks_interval_inside_its_margin(tmp_path):
    """scripts/equivalence.py: absolute and relative margins, every task must pass (intersection-union), a task that
    was not compared fails, and decision.json says so."""
    eq = _load("equivalence")
    plan = {"margins": {"lambada": 0.01, "wikitext": "1% of A's word perplexity"}}

    def row(metric, a, low, high):
        return {"metric": metric, "a": a, "b": a + (low + high) / 2, "effect": (low + high) / 2, "low": low,
                "high": high}

    inside = [row("lambada.acc", 0.4, -0.008, 0.009), row("wikitext.word_perplexity", 20.0, -0.15, 0.19)]
    assert eq.decide(plan, inside)["equivalent"]
    wide = [inside[0], row("wikitext.word_perplexity", 20.0, -0.15, 0.21)]  # the margin is 0.2 here
    found = eq.decide(plan, wide)
    assert not found["equivalent"] and [t["equivalent"] for t in found["tasks"]] == [True, False]
    assert not eq.decide(plan, inside[:1])["equivalent"]
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "paired.json").write_text(json.dumps({"paired": inside}))
    assert eq.main(str(tmp_path / "plan.json"), str(tmp_path / "paired.json")) == 0
    assert json.loads((tmp_path / "decision.json").read_text())["equivalent"] is True


def _vision_grid_fixture(out: Path) -> dict:
    """A from-scratch vision grid in miniature, as `preproj scaling` leaves it: three variants with three seeds of
    per-item files (loss and accuracy on 300 test digits), base@flops sharing base@params's runs, and the
    results.json that the grid's own analysis writes from them under a two-family plan."""
    import numpy as np

    from preproj.experiments.scaling_compare import paired_by_plan

    rng = np.random.default_rng(1)
    difficulty = rng.uniform(0.05, 2.0, 300)
    variants = {}
    for variant, shift in (("preproj+skip", -0.06), ("base@params", 0.0), ("skip", -0.02)):
        dirs = []
        for seed in range(3):
            run = out / "4x128" / variant / f"seed{seed}"
            run.mkdir(parents=True)
            loss = np.maximum(difficulty + shift + rng.normal(0, 0.3, 300) + 0.02 * seed, 0.001)
            rows = [{"task": "mnist", "index": i, "loss": float(x), "acc": float(x < 1.0)} for i, x in enumerate(loss)]
            (run / "items.mnist.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            dirs.append(str(run))
        variants[variant] = {"task": "mnist", "items": dirs, "validation_loss": [hash(variant) + s for s in range(3)]}
    variants["base@flops"] = variants["base@params"]
    sizes = {"4x128": {"variants": variants, "paired": {}}}
    plan = {"alpha": 0.05, "families": [
        {"name": "against the plain model of equal parameters", "correction": "holm", "reference": "base@params"},
        {"name": "against preproj+skip", "correction": "holm", "reference": "preproj+skip"}]}
    results = {"args": {"out": str(out)}, "plan": plan, "sizes": sizes, "comparisons": paired_by_plan(sizes, plan)}
    (out / "results.json").write_text(json.dumps(results))
    return results


def test_recompute_checks_a_vision_grid_from_its_item_files_and_catches_a_change(tmp_path, capsys):
    """The layout of a from-scratch grid: every entry (variant, reference, metric) is recomputed with its family's
    Holm adjustment and detectable effect; a changed item file is caught."""
    from preproj.analysis.stats import RULE

    results = _vision_grid_fixture(tmp_path)
    recompute = _load("recompute")
    assert recompute.as_compare_layout(tmp_path, results)["rule"] == RULE  # the script's default is preproj's
    assert {(e["method"], e["reference"], e["metric"]) for e in results["comparisons"]} == {
        (m, r, f"mnist.{k}") for m, r in (("preproj+skip", "base@params"), ("skip", "base@params"),
                                          ("skip", "preproj+skip")) for k in ("loss", "acc")}  # base@flops: shared
    assert any(e["fragile"] for e in results["comparisons"])  # calls the other seed-variance convention would not make
    assert recompute.main([str(tmp_path)]) == 0
    assert "6 paired entries recomputed" in capsys.readouterr().out
    path = tmp_path / "4x128" / "skip" / "seed1" / "items.mnist.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows[:30]:
        row["loss"] *= 0.5
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert recompute.main([str(tmp_path)]) == 1
    assert "4x128 skip - 4x128 base@params mnist.loss: effect" in capsys.readouterr().out


def test_recompute_checks_a_text_grid_from_its_seeds_losses(tmp_path, capsys):
    """A text grid compares one test loss per seed (a t interval over the seeds' differences): recompute.py finds
    every effect, interval, p, Holm adjustment and detectable effect from results.json's losses, and a changed loss."""
    from preproj.experiments.scaling_compare import default_plan, paired_by_plan

    losses = {"preproj+skip": [5.10, 5.14, 5.09], "base@params": [5.21, 5.22, 5.24], "skip": [5.12, 5.19, 5.11]}
    variants = {v: {"test_loss": x, "validation_loss": [y + 0.1 for y in x]} for v, x in losses.items()}
    sizes = {"2x96": {"variants": variants, "paired": {}}}
    plan = default_plan(list(variants))
    results = {"args": {"out": str(tmp_path)}, "plan": plan, "sizes": sizes, "comparisons": paired_by_plan(sizes, plan)}
    (tmp_path / "results.json").write_text(json.dumps(results))
    recompute = _load("recompute")
    assert recompute.main([str(tmp_path)]) == 0
    assert "3 paired entries recomputed from the seeds' losses in results.json" in capsys.readouterr().out
    results["sizes"]["2x96"]["variants"]["skip"]["test_loss"][1] = 5.29
    (tmp_path / "results.json").write_text(json.dumps(results))
    assert recompute.main([str(tmp_path)]) == 1
    assert "2x96 skip - 2x96 preproj+skip 2x96 test loss: effect" in capsys.readouterr().out


def test_a_packed_study_recomputes_and_pairs_as_the_plain_one(tmp_path, capsys):
    """pack_results turns per-item files into FILE.jsonl.xz; preproj's readers and recompute.py read them as before."""
    from preproj.analysis.pairing import paired_comparisons

    _study_fixture(tmp_path, "raw, separate quantiles")
    report = json.loads((tmp_path / "results.json").read_text())
    pack = _load("pack_results")
    for path in sorted(tmp_path.glob("*/*.jsonl")):
        packed = pack.pack(path)
        assert not path.exists() and packed.name.endswith(".jsonl.xz")
        assert packed.read_bytes()[:6] == b"\xfd7zXZ\x00"
    assert _load("recompute").main([str(tmp_path)]) == 0 and "all agree" in capsys.readouterr().out
    runs = [{"method": m, "seed": s, "run_dir": f"{m}-seed{s}"} for m, seeds in
            (("base", [42]), ("skip", [42, 43, 44]), ("lora", [42, 43, 44])) for s in seeds]
    again = paired_comparisons(runs, ["base", "skip", "lora"], "harness", tmp_path, report["plan"])
    assert [(e["metric"], e["effect"], e["low"]) for e in again] == [(e["metric"], e["effect"], e["low"])
                                                                     for e in report["paired"]]


def test_the_results_manifest_lists_every_committed_result_file_with_its_hash():
    pack = _load("pack_results")
    listed = json.loads(pack.MANIFEST.read_text())
    on_disk = pack.manifest(pack.tracked())
    assert set(listed) == set(on_disk), "run scripts/pack_results.py and commit what it changes"
    changed = [name for name in listed if listed[name] != on_disk[name]]
    assert not changed, f"results files differ from MANIFEST.json: {changed[:5]}"
    assert not [name for name in listed if name.endswith(".jsonl")], "per-item files are committed packed (.xz)"
    assert sum(e["bytes"] for e in listed.values()) < pack.BUDGET_BYTES, "a clone's results/ stays under the budget"


def test_the_study_regimes_fit_recovers_the_variance_components_simulate_uses():
    """coverage.study_cells fits each arm's latent mean, seed spread and interaction to a study's items: on arms that
    simulate() made with known ones, the fit finds them again."""
    import numpy as np

    coverage = _load("coverage")
    rng = np.random.default_rng(3)
    a, _, _ = coverage.simulate(rng, "binary", 40_000, (8, 8), (0.06, 0.0), 0.25, 0.0, beta=(-0.45, -0.40))
    beta, sd, tau = coverage._fit_binary(a)
    assert abs(beta + 0.45) < 0.05 and abs(tau - 0.25) < 0.03 and abs(sd - 0.06) < 0.03
    a, _, _ = coverage.simulate(rng, "ratio", 2000, (8, 8), (0.01, 0.0), 0.02, 0.0, beta=(-0.2, -0.1))
    beta, sd, tau = coverage._fit_ratio(a)
    assert abs(beta + 0.2) < 0.02 and abs(tau - 0.02) < 0.002 and abs(sd - 0.01) < 0.006


@pytest.mark.parametrize("rule", ["raw, separate quantiles", "raw, t(n-1) for all", "subtract, Satterthwaite df"])
def test_recompute_agrees_on_equivalence_tests_and_their_verdicts(tmp_path, capsys, rule):
    """A plan with margins: recompute.py (numpy and scipy only) finds every TOST p, its adjustment and the
    equivalent/undecided verdicts that compare wrote, and catches an edited one."""
    _study_fixture(tmp_path, rule, margins={"lambada.acc": 0.05, "wikitext.heldout_loss": 0.01})
    report = json.loads((tmp_path / "results.json").read_text())
    tested = [e for e in report["paired"] if "equivalence" in e]
    assert tested and any(e["verdict"].startswith(("equivalent", "undecided")) for e in tested)
    recompute = _load("recompute")
    assert recompute.main([str(tmp_path)]) == 0 and "all agree" in capsys.readouterr().out
    tested[0]["equivalence"]["p"] *= 1.01
    (tmp_path / "results.json").write_text(json.dumps(report))
    assert recompute.main([str(tmp_path)]) == 1
    assert "equivalence p" in capsys.readouterr().out


def test_a_result_drops_its_repeated_log_only_where_train_log_holds_the_same_and_compare_reads_it_back(tmp_path):
    from preproj.experiments.reuse import finished_run

    pack = _load("pack_results")
    log = [{"step": 0, "heldout_loss": 3.0}, {"step": 1, "loss": 2.9}]
    run = tmp_path / "skip-seed42"
    run.mkdir()
    (run / "train_log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in log))
    (run / "result.json").write_text(json.dumps({"method": "skip", "seed": 42, "lr": None, "tasks": {}, "log": log}))
    other = tmp_path / "lora-seed42"
    other.mkdir()
    (other / "train_log.jsonl").write_text(json.dumps(log[0]) + "\n")  # differs: the result keeps its own copy
    (other / "result.json").write_text(json.dumps({"method": "lora", "seed": 42, "lr": None, "tasks": {}, "log": log}))
    assert pack.drop_repeated_log(run / "result.json") and not pack.drop_repeated_log(other / "result.json")
    assert "log" not in json.loads((run / "result.json").read_text())
    assert json.loads((other / "result.json").read_text())["log"] == log
    pack.pack(run / "train_log.jsonl")
    found = finished_run(run, "skip", 42, None, swept=False, recorded_as=None, model="m", scored_as={})
    assert found["log"] == log
