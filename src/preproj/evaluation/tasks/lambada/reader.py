"""LAMBADA's items: the OpenAI detokenised test set (lambada_openai), from the data directory or the Hub."""

from __future__ import annotations

from pathlib import Path

from ....data import Source, hub_rows, jsonl_rows, local_file

TEST = Source("lambada", "lambada/lambada_test.jsonl", ("EleutherAI/lambada_openai", "default", "test"))


def items(data_dir: Path | None = None) -> list[dict]:
    """[{'text'}]: the OpenAI detokenised test set (lambada_openai), 5153 passages."""
    path = local_file(TEST, data_dir)
    rows = jsonl_rows(path) if path else list(hub_rows(TEST, data_dir))
    return [{"text": r["text"]} for r in rows]


def harness_file(folder: Path, data_dir: Path, limit: int | None = None) -> Path:
    """The file its harness.yaml reads: the data directory's own (base.HarnessCopy)."""
    if limit is not None:
        raise ValueError("lambada's harness config reads the data directory's file; cut its items with the harness's "
                         "own limit.")
    return data_dir / TEST.file
