"""What a task declares: how its items are read and scored under each protocol, and its metrics; and the per-item
records, read back by task."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...runtime.files import read_jsonl

PROTOCOLS = ("harness", "paper")
PAPER_LIMIT = 500  # docs/method.md, the frozen probe: the first 500 items of each task
# docs/method.md, the frozen probe: longer items are skipped (LAMBADA) or truncated (WikiText rows)
PAPER_MAX_TOKENS = 512


@dataclass(frozen=True)
class Metric:
    """One metric of a task, as tables, paired comparisons and the paper's claims read it."""

    name: str
    """Its key in the task's results, e.g. acc_norm."""
    header: str
    """Its column header, naming the metric, e.g. HellaSwag acc_norm."""
    higher_is_better: bool
    """Direction of a better result."""
    statistic: str
    """How items combine into it, for paired comparisons: accuracy (a mean), ratio_of_sums, or perplexity
    (exp of a ratio of sums); analysis.stats.STATISTICS holds each."""
    item_value: Callable[[dict], float | tuple[float, float]]
    """The value one item record contributes: a number, or (numerator, denominator) for a ratio of sums."""


@dataclass(frozen=True)
class HarnessCopy:
    """How `harness.write_local_tasks` lays a task out for lm-evaluation-harness: the task folder's harness.yaml,
    with {path} replaced by the data file `data_file` names, and the helper modules of lm_eval's own config for the
    task that the YAML imports, copied beside it."""

    data_file: Callable[[Path, Path, int | None], Path]
    """(folder, data directory, limit) -> the file the config reads: the data directory's own, or one written into
    folder in the columns the config expects. `limit` keeps the first N items of a file written here; a task that
    reads the data directory's file refuses one (the harness's own limit cuts it)."""
    helpers: tuple[str, ...] = ()
    """Paths under lm_eval/tasks of the modules the YAML imports (`!function module.name`)."""
    config: str | None = None
    """The YAML itself, {path} where the data file's path goes; default: harness.yaml in the task's folder under
    evaluation/tasks (a task registered from outside preproj gives its own)."""


@dataclass(frozen=True)
class Task:
    """One evaluation task: the folder evaluation/tasks/<name>/ declares it as its TASK (a variant, in its parent's
    folder)."""

    name: str
    """The name `--tasks` takes."""
    help: str
    """One line for `--help` and the docs."""
    run: Callable[..., dict]
    """(score: LogLikelihood, protocol, limit, data_dir, items, notes) -> the metrics dict; with `items`, also one
    record per item (appended) for paired comparisons; with `notes`, what a reader should know (appended)."""
    metrics: dict[str, tuple[Metric, ...]]
    """Per protocol, the metrics compared pairwise; the first is the task's column in compare's table. A protocol
    missing here is one the task does not have."""
    default: bool = True
    """Run unless tasks are named, with a column in compare's table; False for variants asked for by name."""
    harness: HarnessCopy | None = None
    """Its local copy for lm-evaluation-harness (`preproj harness`, the parity test); None where it has none."""


def read_items(path: str | Path) -> dict[str, list[dict]]:
    """{task: [record, ...]} from a file that `evaluate(..., items_out=...)` wrote: the records each task's run
    appended, which its metrics' item_value read."""
    by_task: dict[str, list[dict]] = {}
    for record in read_jsonl(path):
        by_task.setdefault(record.pop("task"), []).append(record)
    return by_task


def first(items: list, limit: int | None) -> list:
    return items if limit is None else items[:limit]


def mean_stderr(values) -> float:
    """Standard error of a mean (sample std, ddof=1), the harness's mean_stderr."""
    values = np.asarray(values, dtype=np.float64)
    return float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else float("nan")


def ratio_stderr(numerators, denominators) -> float:
    """Delta-method standard error of sum(num) / sum(den) over documents (a ratio estimator)."""
    x, w = np.asarray(numerators, dtype=np.float64), np.asarray(denominators, dtype=np.float64)
    n = len(x)
    if n < 2:
        return float("nan")
    r = x.sum() / w.sum()
    return float(math.sqrt(((x - r * w) ** 2).sum() / (n * (n - 1))) / w.mean())


def accuracy_metric(name: str, header: str) -> Metric:
    return Metric(name, header, True, "accuracy", lambda r: r[name])


def paper_pair(score, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """The paper's split: tokenise context + continuation, score what follows the context's tokens."""
    ctx = score.encode_special(context)
    return ctx, score.encode_special(context + continuation)[len(ctx):]


def multiple_choice(score, docs: list[dict], context_of, choices_of, desc: str, mean_per_token: bool,
                    items: list | None = None) -> dict:
    """acc (and under the harness acc_norm) of choosing the gold continuation by log-likelihood: the harness sums
    it (acc_norm over the choice's length in characters), the paper takes its mean per token (docs/method.md: the
    frozen probe)."""
    pairs, spans, groups = [], [], []
    for doc in docs:
        ctx, choices = context_of(doc), choices_of(doc)
        spans.append((len(pairs), len(choices)))
        mine = [score.encode_pair(ctx, " " + c) if not mean_per_token else paper_pair(score, ctx, " " + c)
                for c in choices]
        pairs += mine
        if all(c == mine[0][0] for c, _ in mine):  # one context for every choice: scored once
            groups.append((mine[0][0], [cont for _, cont in mine]))
        else:
            groups += [(c, [cont]) for c, cont in mine]
    results = score.choices(groups, desc=desc)
    acc, acc_norm = [], []
    for index, (doc, (start, k)) in enumerate(zip(docs, spans, strict=True)):
        lls = np.array([results[start + j][0] for j in range(k)])
        tokens = [len(pairs[start + j][1]) for j in range(k)]
        record = {"index": index, "gold": int(doc["gold"]), "lls": lls.tolist(), "tokens": tokens}
        if mean_per_token:
            acc.append(float(np.argmax(lls / np.array(tokens, dtype=np.float64)) == doc["gold"]))
        else:
            lens = np.array([float(len(c)) for c in choices_of(doc)])
            acc.append(float(np.argmax(lls) == doc["gold"]))
            acc_norm.append(float(np.argmax(lls / lens) == doc["gold"]))
            record.update(chars=lens.astype(int).tolist(), acc_norm=acc_norm[-1])
        if items is not None:
            items.append({**record, "acc": acc[-1]})
    out = {"acc": float(np.mean(acc)), "n": len(docs), "acc_stderr": mean_stderr(acc)}
    if acc_norm:
        out.update(acc_norm=float(np.mean(acc_norm)), acc_norm_stderr=mean_stderr(acc_norm))
    return out


def no_protocol(task: str, protocol: str, why: str) -> ValueError:
    return ValueError(f"{task} has no {protocol} protocol: {why}")

