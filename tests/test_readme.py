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
