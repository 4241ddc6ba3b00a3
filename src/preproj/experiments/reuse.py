"""A finished (method, seed) of a comparison is reused only as it ran: trained and scored with the arguments this
comparison would use, so that a report never shows a run under arguments it did not run with."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from ..evaluation.tasks import default_tasks
from ..runtime.files import kept, read_jsonl
from ..training import TrainArgs
from ..training.args import changed_arguments

logger = logging.getLogger(__name__)


def finished_run(run_dir: Path, arm: str, seed: int, lr: float | None, *, swept: bool, recorded_as: TrainArgs | None,
                 model: str, scored_as: dict[str, dict]) -> dict:
    """A finished (arm, seed), refused when it was trained or scored otherwise than this comparison would: it would
    be reported under arguments it did not run with. Each changed field is named."""
    run = json.loads((run_dir / "result.json").read_text())
    trained_at = run["lr"]
    if swept and lr is not None and trained_at is not None and not math.isclose(trained_at, lr):
        keep_as = run_dir.parent / f"{arm}@{trained_at:g}-seed{seed}"
        raise ValueError(f"{run_dir} was trained at lr {trained_at:g} but the sweep now picks {lr:g} for {arm}: "
                         f"rename it to {keep_as} to keep it as that arm, then run again.")
    changed = [] if "model" not in run or run["model"] == model else [f"model {run['model']!r} -> {model!r}"]
    if recorded_as is not None:
        changed += changed_arguments(run_dir / "train_config.json", recorded_as)
    for task, setting in scored_as.items():
        done_task = run_dir / f"eval.{task}.json"
        scored = json.loads(done_task.read_text()).get("setting", {}) if done_task.is_file() else {}
        changed += [f"{task} {k} {scored[k]!r} -> {v!r}" for k, v in setting.items() if k in scored and scored[k] != v]
    if changed:
        raise ValueError(f"{run_dir} finished with other arguments than this comparison's ({'; '.join(changed)}), "
                         "and would be reported under the new ones: rerun with the recorded ones (its "
                         "train_config.json and eval.TASK.json), or give another --out.")
    if "log" not in run:  # a committed result keeps its log in train_log.jsonl only (scripts/pack_results.py)
        run["log"] = read_log(run_dir)
    run["method"], run["run_dir"] = arm, run_dir.name  # where it is now: a run may be moved to keep it as an arm
    logger.info(f"[compare] {arm} seed {seed}: already done, reusing {run_dir / 'result.json'}")
    return run


def read_log(run_dir: Path) -> list[dict]:
    """A run's training log, train_log.jsonl (or its packed copy); empty where the run kept none."""
    path = run_dir / "train_log.jsonl"
    return read_jsonl(path) if kept(path) else []


def eval_setting(task: str, eval_cfg: dict, limits: dict, eval_precision) -> dict:
    """How a task is scored in this comparison (the weights' digest is added where they are known)."""
    return {"protocol": eval_cfg["protocol"], "limit": limits.get(task if task in limits else task.split("_")[0]),
            "max_length": eval_cfg["max_length"], "precision": eval_precision.name}


def scored_tasks(eval_cfg: dict) -> tuple[str, ...]:
    """The tasks a comparison scores: those its evaluation names, else every default task, then its extra ones."""
    return (*(eval_cfg.get("tasks") or default_tasks()), *eval_cfg.get("extra_tasks", ()))
