"""compare's learning-rate sweep: each method at the rate with the lowest held-out loss on the training data's
validation text, never on the reported text; finished sweep points are reused."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..runtime import distributed as ddist
from ..runtime.files import write_json
from ..runtime.loading import load_model
from ..training import TrainArgs, train

if TYPE_CHECKING:
    from .compare import CompareArgs

logger = logging.getLogger(__name__)


def sweep_learning_rates(args: CompareArgs, methods: list[str], train_args: dict, lr_sweep: str, steps: int,
                         n_seeds: int, precision, device, progress: bool) -> dict:
    """Each trained method's peak learning rate: the candidate whose run (seed 42, `steps` steps) ends with the
    lowest held-out loss on the training data's validation text, never on the reported text; with n_seeds > 1 the
    best two get further seeds and the lower mean decides."""
    out = Path(args.out) / "sweep"
    try:
        candidates = [float(x) for x in lr_sweep.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--lr-sweep must be comma-separated learning rates, got {lr_sweep!r}.") from None
    if not candidates or any(not lr > 0 for lr in candidates):
        raise ValueError(f"--lr-sweep needs learning rates > 0, got {lr_sweep!r}.")
    trained_in: set[str] = set()

    def point(method: str, lr: float, seed: int) -> float:
        """The held-out loss of one sweep run, trained now unless a finished run is on disk."""
        run_dir = out / (f"{method}-lr{lr:g}" + (f"-seed{seed}" if seed != 42 else ""))
        if not (run_dir / "summary.json").is_file():
            logger.info(f"[compare] sweep {method} lr {lr:g} seed {seed} ({steps} steps) ...")
            model, tokenizer = load_model(args.model, dtype=precision.weights, device=device)
            targs = TrainArgs(**{**train_args, "model": args.model, "method": method, "out": str(run_dir), "seed": seed,
                                 "lr": lr, "steps": steps, "warmup": min(train_args["warmup"], steps // 4),
                                 "eval_every": steps, "save_every": steps, "resume": True, "data_dir": args.data_dir,
                                 "precision": precision.name, "device": str(device), "strategy": args.strategy,
                                 "compile": args.compile})
            train(targs, model, tokenizer, progress=progress)
        trained_in.add(json.loads((run_dir / "train_config.json").read_text())["precision"])
        return json.loads((run_dir / "summary.json").read_text())["final_heldout_loss"]

    loss = {m: {f"{lr:g}": point(m, lr, 42) for lr in candidates} for m in methods}  # seed 42: every candidate
    by_seed: dict[str, dict[str, list[float]]] = {}
    for method, by_lr in loss.items():  # further seeds: the best two of seed 42, then the lower mean decides
        finalists = sorted(by_lr, key=by_lr.get)[:2] if n_seeds > 1 else [min(by_lr, key=by_lr.get)]
        by_seed[method] = {lr: [by_lr[lr]] + [point(method, float(lr), 42 + k) for k in range(1, n_seeds)]
                           for lr in finalists}
    chosen = {m: float(min(means, key=lambda lr: np.mean(means[lr]))) for m, means in by_seed.items()}
    # A point is reused whatever precision it was trained in (a study made in parts may span machines); the
    # report says which.
    sweep = {"candidates": candidates, "steps": steps, "heldout_loss": loss, "chosen": chosen,
             "precisions": sorted(trained_in), "seeds": n_seeds, "finalists": by_seed}
    if ddist.ranks().is_main:
        write_json(out / "sweep.json", _merged_with_file(sweep, out / "sweep.json"))
    logger.info("[compare] learning rates: " + ", ".join(f"{m} {lr:g}" for m, lr in chosen.items()))
    return sweep


def _merged_with_file(sweep: dict, path: Path) -> dict:
    """The sweep plus the rows of methods that an earlier comparison in the same directory swept with the same
    candidates and steps, so that comparing a subset of methods never drops the others' rows from the file."""
    old = json.loads(path.read_text()) if path.is_file() else {}
    if (old.get("candidates"), old.get("steps")) != (sweep["candidates"], sweep["steps"]):
        return sweep
    return {**sweep, "heldout_loss": {**old["heldout_loss"], **sweep["heldout_loss"]},
            "chosen": {**old["chosen"], **sweep["chosen"]},
            "finalists": {**old.get("finalists", {}), **sweep.get("finalists", {})},
            "precisions": sorted(set(old.get("precisions", [])) | set(sweep["precisions"]))}


def common_rate(sweep: dict, methods: list[str]) -> dict:
    """The one candidate rate that suits `methods` together: the lowest average over them of each method's mean
    held-out loss at that rate (over the seeds the sweep ran it with: the finalists' several, the others' seed 42).
    Chosen on held-out loss like each method's own rate, never on the reported text."""
    missing = [m for m in methods if m not in sweep["heldout_loss"]]
    if missing:
        raise ValueError(f"the common rate averages over {', '.join(methods)}, but the sweep has no points for "
                         f"{', '.join(missing)}.")

    def mean_loss(method: str, lr: str) -> float:
        seeds = sweep.get("finalists", {}).get(method, {}).get(lr) or [sweep["heldout_loss"][method][lr]]
        return float(np.mean(seeds))

    average = {f"{lr:g}": float(np.mean([mean_loss(m, f"{lr:g}") for m in methods])) for lr in sweep["candidates"]}
    return {"methods": list(methods), "mean_heldout_loss": average, "rate": float(min(average, key=average.get))}
