"""ARC-Easy: grade-school science questions, four choices; acc (and acc_norm under the harness)."""

from __future__ import annotations

from ..base import HarnessCopy, Task, accuracy_metric, first, multiple_choice
from . import reader
from .reader import harness_file


def run(score, protocol: str, limit: int | None, data_dir, items: list | None = None,
        notes: list | None = None) -> dict:
    if protocol == "harness":
        docs = first(reader.items(data_dir, "test"), limit)
        return multiple_choice(score, docs, lambda d: f"Question: {d['question']}\nAnswer:", lambda d: d["choices"],
                               "arc_easy", False, items)
    docs = first(reader.items(data_dir, "validation"), limit)
    return multiple_choice(score, docs, lambda d: d["question"], lambda d: d["choices"], "arc_easy (paper)", True,
                           items)


ACC = accuracy_metric("acc", "ARC-E acc")
TASK = Task("arc_easy", "ARC-Easy: science questions (harness: test split; paper: validation split)", run,
            {"harness": (ACC,), "paper": (ACC,)},
            harness=HarnessCopy(harness_file))
