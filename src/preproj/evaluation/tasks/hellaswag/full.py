"""HellaSwag's 10,042 validation items as llama.cpp ships them (the local set holds a sample of the harness's)."""

from __future__ import annotations

from ..base import Task, first
from . import reader, score_docs
from .reader import FULL_NOTE


def run(score, protocol: str, limit: int | None, data_dir, items: list | None = None,
        notes: list | None = None) -> dict:
    result = score_docs(score, first(reader.items(data_dir, full=True), limit), protocol, "hellaswag_full", items)
    if notes is not None:
        notes.append(FULL_NOTE)
    return result


TASK = Task("hellaswag_full", "HellaSwag, llama.cpp's 10,042 validation items", run, {"harness": (), "paper": ()},
            default=False)
