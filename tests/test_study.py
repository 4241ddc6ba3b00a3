"""Study files (experiments/study.py): loading and checking, METHOD@common, seeds by name, the declared plan's
guard, and a tiny study run end to end through the CLI."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import data_dir
from test_compare import tiny_real_vocab_model  # noqa: F401 (a fixture)

from preproj.cli import main
from preproj.experiments.arms import arm_method_lr, run_plan
from preproj.experiments.study import (
    StudyFileError,
    check_declared,
    load_study,
    runs_older_than_plan,
)
from preproj.experiments.sweep import common_rate

ROOT = Path(__file__).resolve().parents[1]


def _tiny_budget(corpus: Path) -> str:
    """A study file's [train] table for runs of two steps on `corpus` with a tiny model."""
    return "\n".join(["[train]", f'data = "{corpus}"', "seq_len = 32", "batch_size = 2", "steps = 2", "warmup = 1",
                      "eval_every = 2", "save_every = 2", ""])


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_study_file_compiles_to_compares_arguments_and_a_preset_of_its_own(tmp_path):
    study = load_study(_write(tmp_path / "s.toml", """
name = "s"
preset = "study"
out = "somewhere"
methods = ["base", "skip", "lora@common"]
seeds = [45, 46]
precision = "bf16-frozen"
[train]
steps = 10
[eval]
limits = {lambada = 5}
[sweep]
rates = [1e-4, 3e-3]
steps = 4
seeds = 2
common = ["skip", "lora"]
[plan]
alpha = 0.05
"""), data_dir="d")
    assert study.args.out == "somewhere" and study.args.data_dir == "d" and study.args.preset == "study"
    p = study.preset
    assert p["methods"] == "base,skip,lora@common" and p["seeds"] == [45, 46] and p["precision"] == "bf16-frozen"
    assert p["train"]["steps"] == 10 and p["train"]["seq_len"] == 256  # the preset's, overridden field by field
    assert p["eval"]["limits"] == {"lambada": 5} and p["eval"]["protocol"] == "harness"
    assert (p["lr_sweep"], p["sweep_steps"], p["sweep_seeds"], p["common_rate_of"]) == ("0.0001,0.003", 4, 2,
                                                                                        ["skip", "lora"])
    assert study.plan == {"alpha": 0.05} and not study.declared and len(study.sha256) == 64


@pytest.mark.parametrize("text, message", [
    ("lr_sweep = '1e-3'", r"unknown key\(s\) lr_sweep; a study file takes"),
    ("[train]\nsteeps = 3", r"unknown key\(s\) in \[train\]: steeps"),
    ("seeds = [1, 1]", "seeds must be a count"),
    ("seeds = 0", "seeds must be a count"),
    ("preset = 'huge'", "preset must be one of"),
    ("[sweep]\nrates = 1e-3", "sweep.rates must be a list"),
    ("name = ", "is not valid TOML"),
    ("methods = ['skip']\n[arms.skip]\nmethod = 'skip'", "must differ from every method"),
    ("methods = ['a']\n[arms.a]\nmethod = 'skip'\nrate = 1e-3", r"arms.a: unknown key\(s\) rate"),
    ("methods = ['a']\n[arms.a]\nlr = 1e-3", "arms.a: no method"),
    ("methods = ['a']\n[arms.a]\nmethod = 'skip'\nprecision = 'bf16'", "arms.a: precision must be"),
    ("methods = ['b']\n[arms.a]\nmethod = 'skip'", "arms.a is not in methods"),
    ("[eval]\ntasks = ['lambda']", "eval.tasks must be a list of tasks from lambada"),
    ("[eval]\ntasks = []", "eval.tasks is empty"),
])
def test_a_study_file_that_cannot_run_says_which_key_and_what_to_write(tmp_path, text, message):
    with pytest.raises(StudyFileError, match=message):
        load_study(_write(tmp_path / "s.toml", text))


def test_named_arms_give_one_method_a_rate_and_precisions_of_its_own(tmp_path):
    from preproj.experiments.arms import Arm, arm, arm_precisions
    from preproj.runtime.precision import PRECISIONS

    study = load_study(_write(tmp_path / "s.toml", """
methods = ["base", "pure", "masters", "skip@1e-3"]
[arms.pure]
method = "preproj+skip"
lr = 1e-5
precision = "bf16-true"
[arms.masters]
method = "preproj+skip"
precision = "bf16-frozen"
[eval]
tasks = ["wikitext"]
"""))
    named = study.preset["arms"]
    assert named["pure"] == Arm("pure", "preproj+skip", 1e-5, "bf16-true", None)
    assert arm("masters", named) == Arm("masters", "preproj+skip", None, "bf16-frozen", None)
    assert arm("skip@1e-3", named) == Arm("skip@1e-3", "skip", 1e-3)
    assert study.preset["eval"]["tasks"] == ["wikitext"]
    # an arm scored on another base than the one it trained on is refused, naming the arm
    fp32, bf16 = PRECISIONS["fp32"], PRECISIONS["bf16-true"]
    assert arm_precisions(named["pure"], fp32, bf16, "cpu") == (bf16, bf16)
    with pytest.raises(ValueError, match=r"\(arm pure\): pick two that load the base alike"):
        arm_precisions(named["pure"], fp32, fp32, "cpu")


def test_the_bf16_question_reports_from_its_committed_item_files_as_committed(tmp_path, capsys):
    """studies/bf16-question.toml (named arms in two precisions, one task under the paper's protocol) over a copy of
    results/bf16-question: reused, not rerun, and paired as the committed paired.json (made by `preproj paired`
    before the study file existed) and docs/results/bf16-question.md have it."""
    import shutil

    from preproj.analysis.pairing import paired_between

    copy = tmp_path / "bf16-question"
    shutil.copytree(ROOT / "results" / "bf16-question", copy)
    text = (ROOT / "studies" / "bf16-question.toml").read_text().replace('"results/bf16-question"', f'"{copy}"')
    assert main(["study", "report", str(_write(tmp_path / "q.toml", text)), "--data-dir", str(tmp_path)]) == 0
    results = json.loads((copy / "results.json").read_text())
    assert results["pending"] == [] and results["new_runs"] == 0
    assert results["arms"]["bf16-frozen"] == {"method": "preproj+skip", "precision": "bf16-frozen",
                                              "eval_precision": "bf16-true"}
    assert set(results["methods"]["base"]["metrics"]) == {"wikitext.perplexity"}
    paired = {(p["method"], p["reference"]): p for p in results["paired"]}
    committed = json.loads((ROOT / "results" / "bf16-question" / "paired.json").read_text())["paired"][0]
    question = paired["bf16-frozen", "bf16-true"]
    for key in ("a", "b", "effect", "items"):
        assert question[key] == pytest.approx(committed[key], rel=1e-12), key
    # the arms share seeds 42-44, so the study pairs them seed by seed too; `preproj paired` did not
    files = {arm: {"wikitext": [copy / f"{arm}-seed{s}" / "items.wikitext.jsonl" for s in (42, 43, 44)]}
             for arm in ("bf16-true", "bf16-frozen")}
    (seed_paired,) = paired_between(files["bf16-true"], files["bf16-frozen"], "paper", seed_paired=True)
    (unpaired,) = paired_between(files["bf16-true"], files["bf16-frozen"], "paper")
    assert (question["low"], question["high"]) == pytest.approx((seed_paired.low, seed_paired.high), rel=1e-12)
    assert (unpaired.low, unpaired.high) == pytest.approx((committed["low"], committed["high"]), rel=1e-12)
    assert question["verdict"] == "better" and question["decided_by"] == "question"
    assert "bf16-frozen" in (copy / "report.md").read_text()


def test_the_bf16_frozen_check_reports_from_its_committed_item_files_as_decided(tmp_path):
    """studies/bf16-frozen-check.toml over a copy of results/bf16-frozen-check: every difference and interval is the
    committed paired.json's, and the declared decision (each 95% interval inside its margin) holds as TOST at 0.025,
    the LAMBADA drop detectable and inside its margin."""
    import shutil

    copy = tmp_path / "check"
    shutil.copytree(ROOT / "results" / "bf16-frozen-check", copy)
    text = (ROOT / "studies" / "bf16-frozen-check.toml").read_text().replace('"results/bf16-frozen-check"',
                                                                             f'"{copy}"')
    assert main(["study", "report", str(_write(tmp_path / "c.toml", text)), "--data-dir", str(tmp_path)]) == 0
    results = json.loads((copy / "results.json").read_text())
    assert results["new_runs"] == 0
    found = {p["metric"]: p for p in results["paired"]}
    committed = json.loads((ROOT / "results" / "bf16-frozen-check" / "paired.json").read_text())["paired"]
    assert sorted(found) == sorted(p["metric"] for p in committed)
    for p in committed:
        assert [found[p["metric"]][k] for k in ("effect", "low", "high")] == pytest.approx(
            [p["effect"], p["low"], p["high"]], rel=1e-12), p["metric"]
    decision = json.loads((ROOT / "results" / "bf16-frozen-check" / "decision.json").read_text())
    for task in decision["tasks"]:
        assert found[task["metric"]]["equivalence"]["p"] < 0.025, task["metric"]
    assert found["lambada.acc"]["verdict"] == "worse"
    assert "lambada.acc: worse (-0.004 [-0.007, -0.001], inside ±0.01)" in (copy / "report.md").read_text()


def test_seeds_by_name_and_arms_at_the_common_rate():
    assert run_plan(["base", "skip"], [45, 46], "skip") == [("base", 45), ("skip", 45), ("skip", 46)]
    assert run_plan(["base", "skip"], 2, "skip") == [("base", 42), ("skip", 42), ("skip", 43)]
    assert arm_method_lr("lora@common") == ("lora", "common")
    with pytest.raises(ValueError, match="METHOD@LR"):
        arm_method_lr("base@common")
    sweep = {"candidates": [1e-4, 1e-3, 1e-2],
             "heldout_loss": {"skip": {"0.0001": 3.0, "0.001": 2.0, "0.01": 2.5},
                              "lora": {"0.0001": 2.6, "0.001": 2.9, "0.01": 2.2}},
             # the finalists' further seeds enter their mean: skip at 1e-2 was unlucky at seed 42
             "finalists": {"skip": {"0.001": [2.0, 2.2], "0.01": [2.5, 2.1]}}}
    common = common_rate(sweep, ["skip", "lora"])
    assert common["mean_heldout_loss"] == pytest.approx({"0.0001": 2.8, "0.001": 2.5, "0.01": 2.25})
    assert common["rate"] == 1e-2
    with pytest.raises(ValueError, match="no points for preproj"):
        common_rate(sweep, ["skip", "preproj"])


def _git(repo: Path, *argv: str) -> None:
    subprocess.run(["git", "-C", str(repo), *argv], check=True, capture_output=True)


def test_a_declared_study_runs_only_from_its_committed_file_and_finds_runs_older_than_it(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@t")
    _git(repo, "config", "user.name", "t")
    path = _write(repo / "s.toml", f"declared = true\nout = '{tmp_path / 'out'}'\n")
    with pytest.raises(StudyFileError, match="declared .* not committed: commit it"):
        check_declared(load_study(path))
    _git(repo, "add", "s.toml")
    _git(repo, "commit", "-q", "-m", "plan")
    study = load_study(path)
    check_declared(study)
    record = study.record()
    assert record["plan_commit"] and record["file_modified"] is False and record["sha256"] == study.sha256
    runs = {"before": "2000-01-01T00:00:00Z", "after": "2999-01-01T00:00:00Z"}
    for name, when in runs.items():
        (tmp_path / "out" / name).mkdir(parents=True)
        _write(tmp_path / "out" / name / "result.json",
               json.dumps({"provenance": {"recorded_at": when, "study": {"sha256": study.sha256}}}))
    (tmp_path / "out" / "elsewhere").mkdir()
    _write(tmp_path / "out" / "elsewhere" / "result.json", json.dumps({"provenance": {"recorded_at": runs["after"]}}))
    problems = runs_older_than_plan(study)
    assert len(problems) == 2 and problems[0].startswith("before: recorded 2000-01-01") \
        and problems[1] == "elsewhere: made under no study file"
    _write(path, path.read_text() + "# amended\n")
    with pytest.raises(StudyFileError, match="modified since its commit"):
        check_declared(load_study(path))


def test_a_scaling_run_still_being_scored_is_not_counted_as_made_under_no_plan(tmp_path):
    """Training writes its own summary.json before pretrain's last phase (scoring) replaces it with the run's, which
    records the study: a run caught in between has no result yet, and only finished runs are checked."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for argv in (("init", "-q"), ("config", "user.email", "t@t"), ("config", "user.name", "t")):
        _git(repo, *argv)
    path = _write(repo / "s.toml", f"declared = true\nrunner = 'scaling'\nout = '{tmp_path / 'out'}'\n")
    _git(repo, "add", "s.toml")
    _git(repo, "commit", "-q", "-m", "plan")
    study = load_study(path)
    finished = {"loss": {"test": 1.0}, "provenance": {"recorded_at": "2999-01-01T00:00:00Z",
                                                      "study": {"sha256": study.sha256}}}
    for run, summary in (("done", finished), ("scoring", {"provenance": {"recorded_at": "2999-01-01T00:00:00Z"}}),
                         ("elsewhere", {"loss": {"test": 1.0}, "provenance": {"recorded_at": "2999-01-01T00:00:00Z"}})):
        (tmp_path / "out" / "4x8" / run / "seed0").mkdir(parents=True)
        _write(tmp_path / "out" / "4x8" / run / "seed0" / "summary.json", json.dumps(summary))
    assert runs_older_than_plan(study) == ["4x8/elsewhere/seed0: made under no study file"]


def test_resuming_a_study_on_other_code_than_its_runs_warns_and_says_how_to_finish_on_theirs(tmp_path):
    from preproj.experiments.study import mixed_code

    study = load_study(_write(tmp_path / "s.toml", f"runner = 'scaling'\nout = '{tmp_path / 'out'}'\n"))
    made = {"git_commit": "ef7293c758e45e80", "git_dirty": False}
    for run, summary in (("a", {"loss": {}, "provenance": made}), ("b", {"loss": {}, "provenance": made}),
                         ("c", {"provenance": {"git_commit": "1234567"}})):  # c is still being scored: not counted
        (tmp_path / "out" / "4x8" / run / "seed0").mkdir(parents=True)
        _write(tmp_path / "out" / "4x8" / run / "seed0" / "summary.json", json.dumps(summary))
    assert mixed_code(study, made) is None
    warning = mixed_code(study, {"git_commit": "3e81911aaaa", "git_dirty": True})
    assert warning.startswith(f"2 finished run(s) in {tmp_path / 'out'} were made by other code (ef7293c: 2) than "
                              "this process runs (3e81911 (modified))")
    assert "git worktree add --detach ../study-code ef7293c, then PYTHONPATH=../study-code/src" in warning
    assert mixed_code(study, {**made, "git_dirty": True}).startswith("2 finished run(s)")  # uncommitted code too
    unrecorded = mixed_code(study, {})  # a process outside a checkout: the runs' own commit still gives the recipe
    assert "(ef7293c: 2) than this process runs (no recorded commit)" in unrecorded and "worktree" in unrecorded
    (tmp_path / "out" / "4x8" / "c" / "seed0" / "summary.json").write_text(json.dumps({"loss": {}}))
    (tmp_path / "out" / "4x8" / "a" / "seed0" / "summary.json").write_text(json.dumps({"loss": {}}))
    warning = mixed_code(study, made)  # now most runs other than this code's recorded no commit: no recipe
    assert "(no recorded commit: 2) than this process runs (ef7293c)" in warning and "worktree" not in warning


@pytest.mark.parametrize("path", sorted((ROOT / "studies").glob("*.toml")), ids=lambda p: p.stem)
def test_every_committed_study_loads_and_its_runs_were_made_under_its_plan(path):
    """A declared study's every run must name this file as committed and come after the commit that declared it:
    a result older than the plan it is scored under fails here."""
    study = load_study(path)
    assert study.about, f"{path.name} says what it asks"
    if study.declared:
        assert runs_older_than_plan(study) == []


def test_study_command_refuses_a_bad_file_in_one_line(tmp_path, capsys):
    assert main(["study", "run", str(_write(tmp_path / "s.toml", "seeds = 'many'"))]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "seeds must be a count" in err
    assert main(["study", "report", str(tmp_path / "missing.toml")]) == 2
    assert "cannot read the study file" in capsys.readouterr().err


@pytest.mark.integration
def test_a_study_runs_seeds_by_name_at_the_common_rate_and_records_its_plan(tmp_path, tiny_real_vocab_model,  # noqa: F811
                                                                            capsys):
    assert data_dir() is not None, "../shared/data or $PREPROJ_DATA_DIR is needed"
    corpus = _write(tmp_path / "corpus.txt", "\n".join(f"line {i}: the quick brown fox jumps over the lazy dog {i}"
                                                         for i in range(400)))
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@t")
    _git(repo, "config", "user.name", "t")
    out = tmp_path / "out"
    path = _write(repo / "tiny.toml", f"""
name = "tiny"
about = "skip against lora at each one's own rate and at the common one"
declared = true
model = "{tiny_real_vocab_model}"
out = "{out}"
methods = ["base", "skip", "lora", "skip@common", "lora@common"]
seeds = [7, 8]
seeded_methods = ["skip", "lora", "skip@common", "lora@common"]
precision = "fp32"
eval_precision = "fp32"
compile = false
{_tiny_budget(corpus)}[eval]
limits = {{lambada = 3, hellaswag = 2, arc_easy = 2, wikitext = 1}}
max_length = 256
[sweep]
rates = [1e-4, 3e-2]
steps = 2
common = ["skip", "lora"]
[plan]
alpha = 0.05
comparisons = [{{method = "skip@common", reference = "lora@common"}}]
families = [{{name = "primary", correction = "holm", members = [
  {{method = "skip@common", reference = "lora@common", metric = "lambada.acc"}}]}}]
""")
    argv = ["study", "run", str(path), "--data-dir", str(data_dir())]
    assert main(argv) == 2
    assert "declared (declared = true) but is not committed" in capsys.readouterr().err
    assert not out.exists(), "a refused study leaves nothing behind"
    _git(repo, "add", "tiny.toml")
    _git(repo, "commit", "-q", "-m", "plan")
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    sweep = results["sweep"]
    common = sweep["common"]["rate"]
    assert common in (1e-4, 3e-2) and sweep["common"]["methods"] == ["skip", "lora"]
    for arm, method in (("skip@common", "skip"), ("lora@common", "lora")):
        row = results["methods"][arm]
        assert row["lr"] == common and row["seeds"] == [7, 8]
        # an arm at the common rate that is also the method's own rate is the same training: run once, named twice
        shared = sweep["chosen"][method] == common
        assert (out / f"{arm}-seed7").is_dir() is not shared
        if shared:
            assert row["metrics"] == results["methods"][method]["metrics"]
    assert results["methods"]["base"]["seeds"] == [7]
    plan = json.loads((out / "analysis_plan.json").read_text())
    assert plan["study_sha256"] == load_study(path).sha256
    assert [p["decided_by"] for p in results["paired"] if p["metric"] == "lambada.acc"] == ["primary"]
    made = json.loads((out / "skip-seed8" / "result.json").read_text())["provenance"]["study"]
    assert made["sha256"] == plan["study_sha256"] and made["declared"] and len(made["plan_commit"]) == 40
    assert results["study"]["file"] == str(path) and "every run finished" in capsys.readouterr().out
    assert runs_older_than_plan(load_study(path)) == []
    # A report-only pass runs nothing and writes the same numbers; an amended plan must be committed to run.
    assert main(["study", "report", str(path)]) == 0
    assert json.loads((out / "results.json").read_text())["methods"] == results["methods"]
    # a run still to come is listed once, under the arm that trains it, however many arms name that training
    (out / "skip-seed8" / "result.json").rename(out / "skip-seed8" / "result.json.kept")
    assert main(["study", "report", str(path)]) == 0
    assert json.loads((out / "results.json").read_text())["pending"] == ["skip-seed8"]
    (out / "skip-seed8" / "result.json.kept").rename(out / "skip-seed8" / "result.json")
    _write(path, path.read_text().replace("alpha = 0.05", "alpha = 0.01"))
    assert main(argv) == 2 and "modified since its commit" in capsys.readouterr().err


@pytest.mark.integration
def test_named_arms_train_one_method_in_two_precisions_and_score_the_tasks_named(tmp_path,
                                                                                 tiny_real_vocab_model):  # noqa: F811
    assert data_dir() is not None, "../shared/data or $PREPROJ_DATA_DIR is needed"
    corpus = _write(tmp_path / "corpus.txt", "\n".join(f"line {i}: the quick brown fox {i}" for i in range(200)))
    out = tmp_path / "out"
    path = _write(tmp_path / "arms.toml", f"""
model = "{tiny_real_vocab_model}"
out = "{out}"
methods = ["base", "fp", "mixed", "frozen"]
precision = "fp32"
eval_precision = "fp32"
compile = false
[arms.fp]
method = "skip"
lr = 1e-3
[arms.mixed]
method = "skip"
lr = 1e-3
precision = "bf16-mixed"
[arms.frozen]  # trained on a bf16 base, scored on the float32 one
method = "skip"
lr = 1e-3
precision = "bf16-frozen"
eval_precision = "fp32"
{_tiny_budget(corpus)}[eval]
tasks = ["lambada"]
limits = {{lambada = 3}}
max_length = 256
""")
    assert main(["study", "run", str(path), "--data-dir", str(data_dir())]) == 0
    results = json.loads((out / "results.json").read_text())
    assert list(results["methods"]) == ["base", "fp", "mixed", "frozen"]
    assert results["arms"] == {"fp": {"method": "skip", "precision": "fp32", "eval_precision": "fp32"},
                               "mixed": {"method": "skip", "precision": "bf16-mixed", "eval_precision": "fp32"},
                               "frozen": {"method": "skip", "precision": "bf16-frozen", "eval_precision": "fp32"}}
    # the frozen arm's saved adapter, loaded onto the float32 base as `preproj eval --adapter` loads it, scores the
    # same numbers as the arm's own evaluation
    from preproj import EvalArgs, evaluate

    again = evaluate(EvalArgs(model=str(tiny_real_vocab_model), adapter=str(out / "frozen-seed42"), tasks="lambada",
                              limit=3, max_length=256, precision="fp32", compile=False, data_dir=str(data_dir())),
                     progress=False)
    assert again["tasks"]["lambada"]["acc"] == results["methods"]["frozen"]["metrics"]["lambada.acc"]["mean"]
    assert json.loads((out / "frozen-seed42" / "eval.lambada.json").read_text())["result"] == again["tasks"]["lambada"]
    for name, precision in (("fp", "fp32"), ("mixed", "bf16-mixed"), ("frozen", "bf16-frozen")):
        run = out / f"{name}-seed42"
        assert (run / "result.json").is_file()
        assert json.loads((run / "train_config.json").read_text())["precision"] == precision
        assert sorted(p.name for p in run.glob("items.*")) == ["items.lambada.jsonl"]
    # two precisions are two trainings (each has its run directory above): one method, rate and seed do not make
    # them one run, as they do for METHOD@common at the method's own rate
    assert set(results["methods"]["mixed"]["metrics"]) == {"lambada.acc"}


def test_verbose_shows_where_a_plain_value_error_came_from_and_not_a_study_files(tmp_path, capsys, monkeypatch):
    import preproj.experiments.study as study_module

    bad = _write(tmp_path / "s.toml", "seeds = 'many'")
    assert main(["study", "report", str(bad), "--verbose"]) == 2
    assert "Traceback" not in capsys.readouterr().err  # the project's own error: one line, even under --verbose

    def broken(*args, **kwargs):
        raise ValueError("a bug, not bad input")

    monkeypatch.setattr(study_module, "run_study", broken)
    assert main(["study", "report", str(bad)]) == 2
    assert "Traceback" not in capsys.readouterr().err
    assert main(["study", "report", str(bad), "--verbose"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("preproj study: error: a bug, not bad input") and "Traceback" in err and "broken" in err


def test_a_study_that_fixes_its_kernels_runs_only_with_them(tmp_path, monkeypatch):
    import torch

    from preproj.experiments.study import check_kernels

    path = _write(tmp_path / "s.toml", "cpu_capability = 'avx2'\ndevice = 'cpu'\n")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    with pytest.raises(StudyFileError, match="run it as ATEN_CPU_CAPABILITY=avx2 preproj study run"):
        check_kernels(load_study(path))
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    check_kernels(load_study(path))


def test_a_scaling_study_takes_preproj_scalings_keys_and_reproduces_a_committed_report(tmp_path, capsys):
    """runner = "scaling": the keys are ScalingArgs' (lists allowed), and a report-only pass over a copy of
    results/variants-cpu rewrites its report byte for byte."""
    import shutil

    from preproj.experiments.scaling import ScalingArgs

    study = load_study(_write(tmp_path / "s.toml", "runner = 'scaling'\nvariants = ['preproj+skip', 'gate']\n"
                                                    "sizes = '2x64'\nseeds = 2\n"))
    assert isinstance(study.args, ScalingArgs) and study.args.variants == "preproj+skip,gate" and study.preset is None
    with pytest.raises(StudyFileError, match="unknown key.*steps"):
        load_study(_write(tmp_path / "s.toml", "runner = 'scaling'\nsteps = 3\n"))
    copy = tmp_path / "variants-cpu"
    shutil.copytree(ROOT / "results" / "variants-cpu", copy)
    text = (ROOT / "studies" / "variants-cpu.toml").read_text().replace('"results/variants-cpu"', f'"{copy}"')
    assert main(["study", "report", str(_write(tmp_path / "v.toml", text))]) == 0
    assert (copy / "report.md").read_text() == (ROOT / "results" / "variants-cpu" / "report.md").read_text()
    assert "13 comparison(s)" in capsys.readouterr().out
