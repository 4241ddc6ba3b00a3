"""README and the documentation pages say what is true: every Python block runs as pasted (on the embedded
model), the command tables name only flags the commands have, the results tables are the ones the committed
results give, and README stays a front door."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
BLOCKS = [(page, block) for page in PAGES for block in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)]


def test_readme_and_the_docs_have_python_blocks():
    assert sum(page == README for page, _ in BLOCKS) >= 1 and len(BLOCKS) >= 4


def test_readme_is_a_front_door():
    assert len(README.read_text().splitlines()) < 200


@pytest.mark.integration
@pytest.mark.parametrize("page, block", BLOCKS, ids=[f"{p.relative_to(ROOT)}-{i}" for i, (p, _) in enumerate(BLOCKS)])
def test_a_python_block_runs_as_pasted(page, block, tmp_path, monkeypatch, smollm2, registries):
    monkeypatch.chdir(tmp_path)  # the blocks write out/
    exec(compile(block, str(page.relative_to(ROOT)), "exec"), {"__name__": "docs"})


def _help(command: str) -> str:
    import contextlib
    import io

    from preproj.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main([command, "--help"])
    return out.getvalue()


@pytest.mark.parametrize("page", [README, ROOT / "docs" / "guide" / "commands.md"], ids=["README", "commands"])
def test_the_command_table_names_only_flags_each_command_has(page):
    text = page.read_text()
    rows = re.findall(r"^\| `preproj (\w+)([^`]*)` \|", text, flags=re.M)
    assert {name for name, _ in rows} >= {"inspect", "train", "eval", "compare", "paired", "harness", "pretrain",
                                          "scaling"}
    for name, usage in rows:
        flags = set(re.findall(r"--[a-z][a-z-]*", usage))
        missing = [f for f in flags if f not in _help(name)]
        assert not missing, f"{page.name}'s command table shows {missing} for `preproj {name}`, whose --help lacks them"
    said = re.search(r"`inspect`, `train`, `eval`, `compare`, `pretrain` and `scaling` take `--device` and"
                     r"\s+`--precision`", text)
    assert said, f"{page.name} no longer says which commands take --device and --precision; keep this test in step"
    for name in ("inspect", "train", "eval", "compare", "pretrain", "scaling"):
        assert "--device" in _help(name) and "--precision" in _help(name), name
    for name in ("paired", "harness"):
        assert "--precision" not in _help(name), name
    reporting = {name for name in ("train", "compare", "pretrain", "scaling") if "--report-to" in _help(name)}
    assert reporting == {"train", "compare", "pretrain"}


def _results_tables():
    import importlib.util

    spec = importlib.util.spec_from_file_location("results_tables", ROOT / "scripts" / "results_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_results_tables_are_the_ones_the_committed_results_give():
    assert _results_tables().stale() == [], "run scripts/results_tables.py: these pages differ from their results JSON"


def test_a_baseline_table_shows_a_task_not_yet_scored_as_a_dash(tmp_path):
    base = ROOT / "results" / "study-cpu" / "base-seed42"
    part = tmp_path / "part"
    part.mkdir()
    (part / "eval.lambada.json").write_text((base / "eval.lambada.json").read_text())
    rows = _results_tables().baseline_table({"whole": base, "part": part}).splitlines()
    assert rows[2].startswith("| LAMBADA (lambada_openai) | 5153 | acc | 0.2944 ± 0.0063 | 0.2944 ± 0.0063 |")
    assert rows[4].startswith("| HellaSwag") and rows[4].endswith("0.4130 ± 0.0156 | – |")  # not scored in part
    assert len(rows) == 2 + 6


def test_readme_links_point_at_files_that_exist():
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    missing = [t for t in targets if not t.startswith("http") and not (ROOT / t).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_a_sweep_table_is_current_while_the_sweep_runs(tmp_path):
    def point(name: str, method: str, lr: float, seed: int, loss: float | None) -> None:
        (tmp_path / "sweep" / name).mkdir(parents=True)
        (tmp_path / "sweep" / name / "train_config.json").write_text(json.dumps({"method": method, "lr": lr,
                                                                                 "seed": seed}))
        if loss is not None:  # None: running, no summary yet
            (tmp_path / "sweep" / name / "summary.json").write_text(json.dumps({"final_heldout_loss": loss}))

    point("preproj+skip-lr1e-05", "preproj+skip", 1e-5, 42, 2.98)
    point("preproj+skip-lr1e-05-seed43", "preproj+skip", 1e-5, 43, 2.97)
    point("preproj+skip-lr0.0001", "preproj+skip", 1e-4, 42, 3.05)
    point("lora-lr0.0001", "lora", 1e-4, 42, 2.92)
    point("lora-lr1e-05", "lora", 1e-5, 42, None)
    rows = _results_tables().sweep_table(tmp_path).splitlines()
    assert rows[0] == "| method | 1e-05 | 0.0001 | chosen |"
    assert rows[2:] == ["| lora | – | 2.9200 | – |", "| preproj+skip | 2.9800 (2.9700) | 3.0500 | – |"]
    (tmp_path / "sweep" / "sweep.json").write_text(json.dumps({"chosen": {"preproj+skip": 1e-5, "lora": 1e-4}}))
    rows = _results_tables().sweep_table(tmp_path).splitlines()
    assert rows[2] == "| preproj+skip | 2.9800 (2.9700) | 3.0500 | 1e-05 |"  # the chosen rates' order


def test_the_runs_table_counts_each_finished_run_by_the_cpu_that_began_and_the_one_that_finished_it(tmp_path):
    xeon = {"cpu": "Intel Xeon", "isa": ["avx512f", "amx_bf16", "avx512_bf16"], "git_commit": "ef7293c758e45e80"}
    epyc = {"cpu": "AMD EPYC", "isa": ["avx2", "avx512f", "avx512_bf16"], "git_commit": "ef7293c758e45e80"}
    for run, began, summary in (("a/seed0", xeon, {"loss": {}, "provenance": xeon}),
                                ("a/seed1", xeon, {"loss": {}, "provenance": epyc}),  # resumed on the EPYC
                                ("b/seed0", epyc, {"loss": {}, "provenance": epyc}),
                                ("b/seed1", epyc, {"steps": 3, "provenance": epyc})):  # trained, not scored yet
        (tmp_path / "study" / run).mkdir(parents=True)
        (tmp_path / "study" / run / "train_config.json").write_text(json.dumps({"provenance": began}))
        (tmp_path / "study" / run / "summary.json").write_text(json.dumps(summary))
    rows = _results_tables().runs_table(tmp_path / "study").splitlines()
    assert rows[2] == ("| study | 3 | ef7293c758e4: 3 "
                       "| AMD EPYC (avx512_bf16): 1; Intel Xeon (amx_bf16, avx512_bf16): 2 "
                       "| AMD EPYC (avx512_bf16): 2; Intel Xeon (amx_bf16, avx512_bf16): 1 |")


def test_the_package_metadata_reads_without_a_setuptools_warning():
    """pyproject.toml as setuptools reads it when installing, every warning an error (a licence given as a TOML table
    is deprecated; an SPDX expression is the form)."""
    import warnings

    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert dist.metadata.license_expression == "MIT"


def test_the_public_api_is_what_docs_api_documents():
    """`from preproj import *` gives exactly the objects docs/api.md documents (the PEFT config, which needs peft,
    is imported from preproj.peft)."""
    import preproj

    documented = re.findall(r"^::: (\S+)$", (ROOT / "docs" / "api.md").read_text(), flags=re.M)
    names = [d.rpartition(".")[2] for d in documented if not d.startswith("preproj.peft.")]
    assert sorted(preproj.__all__) == sorted(names)
    for name, path in zip(names, [d for d in documented if not d.startswith("preproj.peft.")]):
        module, _, attr = path.rpartition(".")
        assert getattr(preproj, name) is getattr(__import__(module, fromlist=[attr]), attr), path


def test_the_source_cites_the_projects_own_method_page_not_files_outside_it():
    """src/ cites docs/method.md, which the repository holds; PAPER.md and the issue tracker are outside it."""
    import re

    src = ROOT / "src" / "preproj"
    outside = [f"{p.relative_to(src)}:{n}" for p in src.rglob("*.py") for n, line in
               enumerate(p.read_text().splitlines(), 1) if "PAPER.md" in line or re.search(r"\bissue \d+", line)]
    assert not outside, f"cite docs/method.md (or say it in words) instead: {outside}"
    assert (ROOT / "docs" / "method.md").is_file()
