"""A finished run trained again, to score a task added after it ran (`compare --fill-missing`): its weights are not
kept, so they are rebuilt from its recorded arguments and accepted only if they are the scored ones bit for bit.

The retrain follows the run's train_log.jsonl as it goes and stops at the first loss that differs in any bit, so a
machine that cannot repeat the run costs a step, not a training; at the end the weights' SHA-256 must equal the one
the run's evaluations recorded. It runs in a hidden directory beside the run, kept until the new tasks are scored, so
a fill stopped part-way resumes its retrain from the last checkpoint.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

import torch

from ..runtime.files import kept, read_jsonl
from ..runtime.loading import load_model, trained_weights_digest
from ..training import TrainArgs, train


class NotTheScoredWeights(RuntimeError):
    """The retrain cannot give the weights the run scored; the message says where it parted and why."""


class DepartsFromRecord(NotTheScoredWeights):
    """A retrain whose log differs from the run it repeats (another CPU's kernels, another library version)."""


def retrained(model_name: str, method: str, run_dir: Path, precision, device, progress: bool):
    """(model, tokenizer, SHA-256 of its trained weights) of the run in run_dir, trained again; the base is loaded.
    Raises NotTheScoredWeights when they cannot be, or are not, the weights the run's evaluations recorded."""
    recorded = {json.loads(f.read_text())["setting"].get("weights") for f in run_dir.glob("eval.*.json")} - {None}
    model, tokenizer = load_model(model_name, dtype=precision.weights, device=device)
    if method == "base":
        return model, tokenizer, trained_weights_digest(model)
    if not recorded:
        raise NotTheScoredWeights("no task recorded its weights")
    config = json.loads((run_dir / "train_config.json").read_text())
    known = {f.name for f in fields(TrainArgs)}
    place = retrain_dir(run_dir)  # kept until scored, so a fill stopped part-way resumes its retrain
    args = TrainArgs(**{**{k: v for k, v in config.items() if k in known}, "out": str(place), "resume": True})
    try:
        _, model = train(args, model, tokenizer, progress=progress, on_record=following(run_dir))
        weights = trained_weights_digest(model)
        if recorded != {weights}:
            raise NotTheScoredWeights("the retrained weights differ from the scored ones")
    except NotTheScoredWeights:
        shutil.rmtree(place, ignore_errors=True)  # a retrain that cannot give the scored weights is not resumed
        raise
    return model, tokenizer, weights


def retrain_dir(run_dir: Path) -> Path:
    """Where run_dir's retrain runs; hidden, and ignored by git, beside it. Removed once its tasks are scored."""
    return run_dir.parent / f".{run_dir.name}.retrain"


def following(run_dir: Path) -> Callable[[dict], None] | None:
    """A train() on_record that raises DepartsFromRecord at the first loss differing from run_dir's train_log.jsonl
    (None where the run kept no log)."""
    log = run_dir / "train_log.jsonl"
    if not kept(log):
        return None
    recorded = {r["step"]: r for r in read_jsonl(log)}

    def check(record: dict) -> None:
        for key in ("heldout_loss", "loss"):
            was = recorded.get(record["step"], {}).get(key)
            if key in record and was is not None and record[key] != was:
                raise DepartsFromRecord(f"the retrain departs from the recorded run (step {record['step']} {key} "
                                        f"{record[key]!r}, recorded {was!r}), so its weights cannot be the scored "
                                        f"ones; {kernels_hint(run_dir)}")
    return check


def kernels_hint(run_dir: Path) -> str:
    """Where a retrain's first bits differ, the usual cause is the CPU kernels torch chose; it can be told to use
    another set (ATEN_CPU_CAPABILITY, read when torch starts)."""
    summary = run_dir / "summary.json"
    trained = json.loads(summary.read_text()).get("cpu_capability") if summary.is_file() else None
    here = torch.backends.cpu.get_cpu_capability()
    if trained and trained != here:
        return (f"it was trained with {trained} kernels, this process runs {here}: "
                f"rerun with ATEN_CPU_CAPABILITY={trained.lower()}")
    if trained:
        return "it was trained with the kernels this process runs, so something else changed (torch, data, code)"
    return (f"its kernels were not recorded; this process runs {here}, "
            "and ATEN_CPU_CAPABILITY=avx2 (or default) selects others")
