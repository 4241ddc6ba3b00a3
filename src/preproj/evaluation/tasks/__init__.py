"""The task table: every evaluation task, one folder each, in the order of compare's columns.

A task is a folder, `tasks/<name>/`, that holds everything about it:

- `__init__.py`: its `TASK`, how its items are scored under each protocol and which metrics it has (name, header,
  higher-is-better, statistic);
- `reader.py`: its items, read from the data directory or the Hub and preprocessed (data.py keeps only the data
  directory's lookups, the training corpora and the WikiText files that training reads too);
- `harness.yaml`: its lm-evaluation-harness config, where it has one, which `harness.write_local_tasks` writes out
  as the TASK's `harness` declaration says (the data file it reads, the lm_eval helper modules it imports);
- `README.md`: what it measures under each protocol, its metrics and their statistic, after docs/method.md.

A variant of a task lives in its parent's folder: hellaswag/full.py (hellaswag_full) and wikitext/file.py
(wikitext_file). To add a task, copy the lambada folder and add its TASK below (or call register_task).

The declarations (this table, base.py's Task and Metric, and read_items for the per-item records) sit below the
scoring engine and the runner: analysis (paired comparisons, compare's report, the paper's claims) imports them from
here and nothing else of evaluation, and `preproj eval` reads the same ones.

protocol "harness" (default): the metric definitions of lm-evaluation-harness 0.4.x (lambada_openai, wikitext,
hellaswag, arc_easy), including its tokenisation of (context, continuation) pairs and its rolling windows for
perplexity. protocol "paper": the definitions of docs/method.md: the frozen probe.
"""

from __future__ import annotations

from pathlib import Path

from . import arc_easy, hellaswag, lambada, wikitext
from .base import PAPER_LIMIT, PROTOCOLS, HarnessCopy, Metric, Task, mean_stderr, ratio_stderr, read_items
from .hellaswag import full as hellaswag_full
from .wikitext import file as wikitext_file

TASK_TABLE: dict[str, Task] = {t.TASK.name: t.TASK for t in (lambada, hellaswag, arc_easy, wikitext, wikitext_file,
                                                               hellaswag_full)}


def register_task(task: Task) -> None:
    """Add a task to the table (a task defined outside preproj); its name must be new."""
    if task.name in TASK_TABLE:
        raise ValueError(f"a task named {task.name!r} is already registered.")
    TASK_TABLE[task.name] = task


def default_tasks() -> tuple[str, ...]:
    """The tasks run unless tasks are named."""
    return tuple(name for name, t in TASK_TABLE.items() if t.default)


def task(name: str) -> Task:
    if name not in TASK_TABLE:
        raise ValueError(f"Unknown task {name!r}; choose from {', '.join(TASK_TABLE)}.")
    return TASK_TABLE[name]


def columns(protocol: str) -> list[tuple[str, Metric]]:
    """(task, metric) of each column of compare's table: the first metric of every default task."""
    return [(name, t.metrics[protocol][0]) for name, t in TASK_TABLE.items()
            if t.default and t.metrics.get(protocol)]


def paired_metrics(protocol: str) -> list[tuple[str, Metric]]:
    """(task, metric) of every metric compared pairwise under `protocol`, in table order."""
    return [(name, m) for name, t in TASK_TABLE.items() for m in t.metrics.get(protocol, ())]


def run_task(score, name: str, protocol: str, limit: int | None, data_dir: Path | None, items: list | None = None,
             notes: list | None = None) -> dict:
    """The task's metrics; with `items`, also one record per item (appended) for paired comparisons, and with
    `notes`, what the reader should know about the data used (appended)."""
    if protocol == "paper" and limit is None:
        limit = PAPER_LIMIT
    return task(name).run(score, protocol, limit, data_dir, items, notes)


__all__ = ["TASK_TABLE", "Task", "Metric", "HarnessCopy", "register_task", "default_tasks", "task", "columns",
           "paired_metrics", "run_task", "read_items", "PROTOCOLS", "PAPER_LIMIT", "mean_stderr", "ratio_stderr"]
