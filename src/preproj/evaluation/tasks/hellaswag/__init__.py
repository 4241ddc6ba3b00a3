"""HellaSwag: choose the ending of a situation; acc and acc_norm (harness), mean per-token acc (paper). Its variant
hellaswag_full (llama.cpp's 10,042 items) is full.py."""

from __future__ import annotations

from ..base import HarnessCopy, Task, accuracy_metric, first, multiple_choice
from . import reader
from .reader import harness_file


def score_docs(score, docs: list[dict], protocol: str, desc: str, items: list | None) -> dict:
    if protocol == "harness":
        return multiple_choice(score, docs, lambda d: d["query"], lambda d: d["choices"], desc, False, items)
    return multiple_choice(score, docs, lambda d: d["raw_ctx"], lambda d: d["raw_endings"], desc + " (paper)", True,
                           items)


def run(score, protocol: str, limit: int | None, data_dir, items: list | None = None,
        notes: list | None = None) -> dict:
    if protocol == "paper":  # the author's first N, in the validation set's order
        docs, source = reader.items_in_order(data_dir)
        if notes is not None:
            notes.append(source)
    else:
        docs = reader.items(data_dir)
    return score_docs(score, first(docs, limit), protocol, "hellaswag", items)


TASK = Task("hellaswag", "HellaSwag validation: choose the ending", run,
            {"harness": (accuracy_metric("acc_norm", "HellaSwag acc_norm"),),
             "paper": (accuracy_metric("acc", "HellaSwag acc"),)},
            harness=HarnessCopy(harness_file, ("hellaswag/utils.py",)))
