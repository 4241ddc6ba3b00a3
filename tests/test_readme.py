"""Every Python block in README.md runs as a newcomer would paste it (on the embedded model)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_python_blocks():
    assert len(BLOCKS) >= 2


@pytest.mark.integration
@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_a_readme_python_block_runs_as_pasted(block, tmp_path, monkeypatch, smollm2):
    monkeypatch.chdir(tmp_path)  # the blocks write out/
    exec(compile(block, "README.md", "exec"), {"__name__": "readme"})


def _help(command: str) -> str:
    import contextlib
    import io

    from preproj.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main([command, "--help"])
    return out.getvalue()


def test_the_command_table_names_only_flags_each_command_has():
    text = README.read_text()
    rows = re.findall(r"^\| `preproj (\w+)([^`]*)` \|", text, flags=re.M)
    assert {name for name, _ in rows} >= {"inspect", "train", "eval", "compare", "paired", "harness", "pretrain", "scaling"}
    for name, usage in rows:
        flags = set(re.findall(r"--[a-z][a-z-]*", usage))
        missing = [f for f in flags if f not in _help(name)]
        assert not missing, f"README's command table shows {missing} for `preproj {name}`, whose --help lacks them"
    said = re.search(r"`inspect`, `train`, `eval`, `compare`, `pretrain` and `scaling` take `--device` and\s+`--precision`", text)
    assert said, "README no longer says which commands take --device and --precision; keep this test in step"
    for name in ("inspect", "train", "eval", "compare", "pretrain", "scaling"):
        assert "--device" in _help(name) and "--precision" in _help(name), name
    for name in ("paired", "harness"):
        assert "--precision" not in _help(name), name
    reporting = {name for name in ("train", "compare", "pretrain", "scaling") if "--report-to" in _help(name)}
    assert reporting == {"train", "compare", "pretrain"}


def test_the_study_tables_in_readme_are_the_ones_its_results_json_gives():
    import importlib.util

    spec = importlib.util.spec_from_file_location("study_tables", README.parent / "scripts" / "study_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = README.read_text()
    shown = text.split("<!-- study-tables:start -->\n", 1)[1].split("<!-- study-tables:end -->", 1)[0].strip()
    assert shown == module.tables(README.parent / "docs" / "study-cpu").strip(), \
        "README's study tables differ from results/study-cpu/results.json: run scripts/study_tables.py and paste its output"
