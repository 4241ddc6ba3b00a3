"""`preproj compare`: the paper's experiment on any model, every method under one budget, one report.

Trains each method (seeds x methods), evaluates each with `preproj eval`, and writes report.md
(a Table 2 with 95% intervals, the paper's numbers beneath, paired differences and a verdict on each of
the paper's claims), results.json, skip_norms.{png,json}, paired.png and training_curves.png.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ..analysis.pairing import analysis_plan, column_names, paired_comparisons
from ..analysis.paper import (
    PAPER_SKIP_NORMS,
    check_claims,
    check_depth,
)
from ..analysis.plots import plot_paired, plot_skip_norms, plot_training_curves
from ..analysis.report import mean_known, render_report
from ..analysis.stats import (
    RULE,
    t_interval,
    two_seeds_note,
)
from ..evaluation.runner import evaluate, load_scored
from ..evaluation.tasks import columns
from ..methods.lora import merged_for_evaluation
from ..methods.registry import METHODS, default_methods
from ..runtime import distributed as ddist
from ..runtime.files import atomic_write, kept, write_json
from ..runtime.loading import load_model
from ..runtime.precision import Precision, resolve_device
from ..runtime.precision import precision as as_precision
from ..runtime.provenance import describe, provenance
from ..runtime.validation import check_args
from ..training import TrainArgs, train
from ..training.loop import resolved_args
from .arms import COMMON, Arm, arm, arm_precisions, named_arms_record, run_plan, seed_list
from .compare_args import PRESETS, CompareArgs
from .retrain import NotTheScoredWeights, retrain_dir, retrained, trained_weights_digest
from .reuse import eval_setting, finished_run, read_log, scored_tasks
from .sweep import common_rate, sweep_learning_rates

logger = logging.getLogger(__name__)


def _interval(values: list[float], stderr: float | None) -> float | None:
    """Half-width of a 95% interval: over seeds (t) when there are several, else 1.96 x the metric's stderr."""
    if len(values) > 1:
        return t_interval(values)[1]
    return None if stderr is None or not math.isfinite(stderr) else 1.96 * stderr


def run_compare(args: CompareArgs, progress: bool = True, *, preset: dict | None = None,
                study: dict | None = None) -> dict:
    """`preset`: the budget, evaluation, sweep and seeds in PRESETS' form, in place of PRESETS[args.preset] (a study
    file's, experiments/study.py); `study`: the study file's record, kept in every run it starts and in results.json."""
    check_args(args)
    if preset is None and args.preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {args.preset!r}.")
    preset = preset or PRESETS[args.preset]
    methods = [m.strip() for m in (args.methods or preset.get("methods") or ",".join(default_methods())).split(",")
               if m.strip()]
    if not methods:
        raise ValueError(f"--methods is empty; choose from {', '.join(METHODS)}.")
    arms = {name: arm(name, preset.get("arms")) for name in methods}
    device = resolve_device(args.device)
    precision = as_precision(args.precision or preset["precision"], device)
    eval_precision = as_precision(args.eval_precision or preset["eval_precision"], device)
    precisions = {name: arm_precisions(a, precision, eval_precision, device) for name, a in arms.items()}
    r = ddist.setup(device)
    if args.strategy == "fsdp" and r.enabled:
        raise ValueError("compare evaluates every method with the whole model on each process, which --strategy fsdp "
                         "exists to avoid; use --strategy ddp, or train with `preproj train --strategy fsdp` and "
                         "evaluate the saved adapter.")
    lr_sweep = args.lr_sweep or preset.get("lr_sweep")
    if lr_sweep == "none":
        lr_sweep = None
    if lr_sweep and preset["train"]["data"] == "wikitext2":
        raise ValueError("--lr-sweep selects on the training data's held-out text, which for --data wikitext2 is the "
                         "reported WikiText-2 test; use --preset study (WikiText-2 train, selection on raw valid).")
    note = two_seeds_note(len(seed_list(args.seeds or preset.get("seeds", 1))),
                          analysis_plan(Path(args.out), methods, preset["eval"]["protocol"]).get("rule", RULE))
    if note and r.is_main and not args.report_only:
        logger.warning(f"[compare] {note}")
    # A report-only pass reads finished runs and writes only the report's own files, never a run's, so it may run
    # beside the comparison that owns the directory.
    with nullcontext() if args.report_only else ddist.owned(Path(args.out), "preproj compare", device):
        return _compare(args, methods, preset, precision, eval_precision, device, r, progress, lr_sweep, study,
                        {name: (a, *precisions[name]) for name, a in arms.items()})



@dataclass(frozen=True)
class _Pass:
    """What every run of one compare pass shares: its arguments, the training budget, how each task is scored,
    the precisions, where it runs and the study file it belongs to."""

    args: CompareArgs
    train_args: dict
    eval_cfg: dict
    limits: dict
    precision: Precision
    eval_precision: Precision
    device: torch.device
    ranks: ddist.Ranks
    progress: bool
    study: dict | None
    arms: dict[str, tuple[Arm, Precision, Precision]]
    """Each arm with its training and evaluation precisions."""


def _compare(args: CompareArgs, methods: list[str], preset: dict, precision, eval_precision, device, r, progress: bool,
             lr_sweep: str | None, study: dict | None, arms: dict) -> dict:
    out = Path(args.out)
    eval_cfg = preset["eval"]
    limits = {t: args.limit for t in scored_tasks(eval_cfg)} if args.limit else eval_cfg["limits"]
    start = time.monotonic()
    seeds = args.seeds or preset.get("seeds", 1)
    train_args = {**preset["train"], **{k: v for k, v in (("steps", args.steps), ("lr", args.lr)) if v}}
    this = _Pass(args, train_args, eval_cfg, limits, precision, eval_precision, device, r, progress, study, arms)
    sweep = _learning_rates(this, methods, preset, lr_sweep)
    if any(a.lr == COMMON for a, _, _ in arms.values()) and not (sweep and "common" in sweep):
        raise ValueError("METHOD@common needs a learning-rate sweep and the methods whose average picks the common "
                         "rate (a study file's sweep.common); give METHOD@LR for a rate of your own.")

    runs, pending = [], []  # runs: one per finished (method, seed); pending: those a report-only pass finds unfinished
    reused, all_tasks = 0, scored_tasks(eval_cfg)
    # (method, lr, seed, precisions) -> its run, None while it is still to come: arms that name one training share it
    trained: dict[tuple, dict | None] = {}
    for name, seed in run_plan(methods, seeds,
                               (args.seeded_methods or preset.get("seeded_methods") or ",".join(methods))):
        a, train_p, eval_p = arms[name]
        method = a.method
        lr = None if method == "base" else (sweep["common"]["rate"] if a.lr == COMMON else a.lr) or \
            (sweep["chosen"][method] if sweep else train_args["lr"])
        key = (method, lr, seed, train_p.name, eval_p.name)
        if key in trained:
            if trained[key] is not None:
                runs.append({**trained[key], "method": name, "same_run_as": trained[key]["method"]})
            continue
        run_dir = out / f"{name}-seed{seed}"
        if (run_dir / "result.json").is_file():  # resumable: a finished (arm, seed) is not redone
            run = finished_run(run_dir, name, seed, lr, swept=bool(sweep) and a.lr in (None, COMMON),
                                recorded_as=_run_train_args(this, name, seed, lr, run_dir, resolved=True),
                                model=args.model,
                                scored_as={t: eval_setting(t, eval_cfg, limits, eval_p) for t in all_tasks})
            missing = [t for t in all_tasks if t not in run["tasks"]]
            if args.fill_missing and missing and not args.report_only:
                run = _fill_missing(this, run, name, run_dir, missing)
            runs.append(run)
            reused += 1
        elif args.report_only:  # an arm that is another's training (METHOD@common at its own rate) is listed once
            pending.append(run_dir.name)
            trained[key] = None
        else:
            runs.append(_run_arm(this, name, seed, lr, run_dir))
        if runs and runs[-1]["run_dir"] == run_dir.name:
            trained[key] = runs[-1]

    if args.report_only:
        methods = [m for m in methods if any(r["method"] == m for r in runs)]
        if not methods:
            raise ValueError(f"No (method, seed) run has finished in {out} yet (METHOD-seedN/result.json); run the "
                             "comparison without --report-only first.")
        seeds = max(sum(r["method"] == m for r in runs) for m in methods)
    seeds = len(seed_list(seeds))
    # The comparison's wall time, summed over the processes that ran its parts: a pass that runs nothing new (a
    # report-only pass, or a rerun of a finished comparison) keeps the recorded total.
    new_runs = 0 if args.report_only else sum("same_run_as" not in run for run in runs) - reused
    seconds = _recorded(out, "wall_seconds")
    if new_runs:
        seconds = (seconds or 0.0) + time.monotonic() - start
    report = summarise(runs, methods, args, eval_cfg["protocol"], limits, seconds, train_args, seeds)
    report.update(pending=pending, new_runs=new_runs, sweep=sweep, precision=precision.name,
                  eval_precision=eval_precision.name, device=str(device), **({"study": study} if study else {}))
    report.update(named_arms_record(arms, preset.get("arms")))
    _add_comparisons(report, runs, methods, eval_cfg["protocol"], out)
    if r.is_main:
        _write_report(report, runs, methods, out, Path(args.model).name)
    return report


def _recorded(out: Path, key: str):
    """A field of the comparison's last results.json (None when there is none)."""
    try:
        return json.loads((out / "results.json").read_text()).get(key)
    except (OSError, ValueError):
        return None


def _learning_rates(this: _Pass, methods: list[str], preset: dict, lr_sweep: str | None) -> dict | None:
    """The sweep's results: run now (finished points reused), read back for a report-only pass, or None."""
    if not lr_sweep:
        return None
    args, train_args = this.args, this.train_args
    common_of = preset.get("common_rate_of", [])
    if args.report_only:  # the sweep's own record, else the one the last report kept
        sweep_file = Path(args.out) / "sweep" / "sweep.json"
        sweep = json.loads(sweep_file.read_text()) if sweep_file.is_file() else _recorded(Path(args.out), "sweep")
    else:
        swept = list(dict.fromkeys([*(a.method for a, _, _ in this.arms.values()
                                      if a.method != "base" and a.lr in (None, COMMON)), *common_of]))
        steps = args.sweep_steps or preset.get("sweep_steps") or max(1, train_args["steps"] // 4)
        n_seeds = args.sweep_seeds or preset.get("sweep_seeds") or 1
        sweep = sweep_learning_rates(args, swept, train_args, lr_sweep, steps, n_seeds, this.precision, this.device,
                                     this.progress)
    return {**sweep, "common": common_rate(sweep, common_of)} if sweep and common_of else sweep


def _run_train_args(this: _Pass, name: str, seed: int, lr: float | None, run_dir: Path,
                    resolved: bool = False) -> TrainArgs | None:
    """The TrainArgs arm `name` trains with (None for the base); `resolved`: as train() records them."""
    a, precision, _ = this.arms[name]
    if a.method == "base":
        return None
    args = this.args
    targs = TrainArgs(model=args.model, method=a.method, out=str(run_dir), seed=seed, data_dir=args.data_dir,
                      resume=True, precision=precision.name, device=str(this.device), strategy=args.strategy,
                      report_to=args.report_to, compile=args.compile, **{**this.train_args, "lr": lr})
    return resolved_args(targs, this.device) if resolved else targs


def _run_arm(this: _Pass, arm: str, seed: int, lr: float | None, run_dir: Path) -> dict:
    """Train one (arm, seed) (the base trains nothing), evaluate it task by task, and write its result.json."""
    logger.info(f"[compare] {arm} seed {seed} ...")
    model, tokenizer = load_model(this.args.model, dtype=this.arms[arm][1].weights, device=this.device)
    summary = None
    targs = _run_train_args(this, arm, seed, lr, run_dir)
    if targs is not None:
        summary, model = train(targs, model, tokenizer, progress=this.progress)
    weights = trained_weights_digest(model)
    tasks, task_seconds = _evaluate_arm(this, arm, _scored(this, arm, model, run_dir), tokenizer, run_dir, weights)
    study = this.study
    result = {"method": arm, "seed": seed, "model": this.args.model, "tasks": tasks, "run_dir": run_dir.name,
              "lr": lr if summary else None,
              "trainable_params": summary["trainable_params"] if summary else 0,
              "train_tokens": summary["tokens_seen"] if summary else 0,
              # None where a part ran before times were kept across a resume
              "train_seconds": summary.get("train_seconds") if summary else 0.0,
              "eval_seconds": None if None in task_seconds.values() else sum(task_seconds.values()),
              "skip_norms": summary["skip_norms"] if summary else None,
              "log": read_log(run_dir) if summary else [],
              "provenance": {**provenance(), **({"study": study} if study else {})}}
    if this.ranks.is_main:
        write_json(run_dir / "result.json", result)
    logger.info(f"[compare] {arm} seed {seed}: " + ", ".join(
        f"{t} {m.name}={tasks[t][m.name]:.4g}" for t, m in columns(this.eval_cfg["protocol"]) if t in tasks))
    return result


def _scored(this: _Pass, arm: str, model, adapter_dir: Path):
    """The model an arm's tasks score: a LoRA merged (the base's cost; the weights' digest is of what was trained),
    and where the arm scores on a base loaded in another dtype, its saved adapter on that base."""
    a, precision, eval_precision = this.arms[arm]
    if eval_precision.weights != precision.weights:
        model = load_scored(this.args.model, None if a.method == "base" else str(adapter_dir), eval_precision.name,
                            str(this.device))[0]
    return merged_for_evaluation(model)


def _fill_missing(this: _Pass, run: dict, arm: str, run_dir: Path, missing: list[str]) -> dict:
    """A finished run's tasks added since it ran (its weights are not kept): scored on the run retrained from its
    recorded arguments only if that gives the scored weights bit for bit; else the run is left as it was and says
    why. The base retrains nothing."""
    a, precision, _ = this.arms[arm]
    logger.info(f"[compare] {run_dir.name}: scoring {', '.join(missing)}" + ("" if a.method == "base" else
                " on its weights trained again, checked step by step against its train_log.jsonl"))
    try:
        model, tokenizer, weights = retrained(this.args.model, a.method, run_dir, precision, this.device,
                                              this.progress)
    except NotTheScoredWeights as why:
        logger.warning(f"[compare] {run_dir.name}: {', '.join(missing)} not scored: {why} (the other tasks stand).")
        return {**run, "unfilled": {"tasks": missing, "why": str(why)}}
    scored = _evaluate_arm(this, arm, _scored(this, arm, model, retrain_dir(run_dir)), tokenizer, run_dir, weights,
                           only=missing)[0]
    run = {**run, "tasks": {**run["tasks"], **scored}}
    if this.ranks.is_main:
        write_json(run_dir / "result.json", run)
        shutil.rmtree(retrain_dir(run_dir), ignore_errors=True)
    return run


def _evaluate_arm(this: _Pass, arm: str, model, tokenizer, run_dir: Path, weights: str,
                  only: list[str] | None = None) -> tuple[dict, dict]:
    """Every task's metrics and seconds. Each finished task is kept, and each scored batch of the task in progress
    (`.eval.TASK.journal`), so an evaluation stopped part-way resumes at the batch it was in, if the weights are the
    very ones it scored (a run retrained elsewhere may differ in the last bit). A resumed task's seconds are those
    of its last process."""
    args, eval_cfg, progress, eval_precision = this.args, this.eval_cfg, this.progress, this.arms[arm][2]
    tasks, task_seconds = {}, {}
    for task in only or scored_tasks(eval_cfg):
        done_task, items = run_dir / f"eval.{task}.json", run_dir / f"items.{task}.jsonl"
        setting = {**eval_setting(task, eval_cfg, this.limits, eval_precision), "weights": weights}
        limit = setting["limit"]  # a variant takes its task's limit
        recorded = json.loads(done_task.read_text()) if done_task.is_file() and kept(items) else {}
        if recorded.get("setting") == setting:
            tasks[task], task_seconds[task] = recorded["result"], recorded.get("seconds")
            continue
        t0 = time.monotonic()
        res = evaluate(model, tokenizer, [task], protocol=eval_cfg["protocol"], limit=limit, data_dir=args.data_dir,
                       max_length=eval_cfg["max_length"], precision=eval_precision.name, progress=progress,
                       items_out=items, journal=run_dir / f".eval.{task}.journal", compile=args.compile,
                       journal_key=json.dumps(setting, sort_keys=True))
        tasks[task], task_seconds[task] = res["tasks"][task], time.monotonic() - t0
        if this.ranks.is_main:
            write_json(done_task, {"setting": setting, "result": tasks[task], "seconds": task_seconds[task]})
    return tasks, task_seconds


def _add_comparisons(report: dict, runs: list[dict], methods: list[str], protocol: str, out: Path) -> None:
    """The analysis plan's paired comparisons, the paper's claims and the depth claim, into the report."""
    plan = analysis_plan(out, methods, protocol)
    report.update(plan=plan, rule=plan.get("rule", RULE), paired=paired_comparisons(runs, methods, protocol, out, plan))
    report.update(claims=check_claims(report["paired"], plan, column_names(protocol)),
                  depth=check_depth([r["skip_norms"] for r in runs
                                     if r["method"] == "preproj+skip" and r["skip_norms"]]))


def _write_report(report: dict, runs: list[dict], methods: list[str], out: Path, model_name: str) -> None:
    write_json(out / "results.json", report)
    norms = {m: report["methods"][m]["skip_norms"] for m in methods if report["methods"][m]["skip_norms"]}
    write_json(out / "skip_norms.json", {"ours": norms, "paper": PAPER_SKIP_NORMS})
    plot_skip_norms(norms, out / "skip_norms.png", model_name)
    if any(r["log"] for r in runs):  # an interim report with only the base has no curve to draw
        plot_training_curves(runs, out / "training_curves.png")
    if report["paired"]:
        plot_paired(report["paired"], out / "paired.png")
    text = render_report(report)
    atomic_write(out / "report.md", lambda tmp: Path(tmp).write_text(text))


def summarise(runs: list[dict], methods: list[str], args: CompareArgs, protocol: str, limits: dict,
              seconds: float | None, train_args: dict, seeds: int) -> dict:
    table = {}
    for method in methods:
        mine = [r for r in runs if r["method"] == method]
        cells = {}
        for task, metric in columns(protocol):
            if task not in mine[0]["tasks"]:  # a study that scores some tasks only
                continue
            values = [r["tasks"][task][metric.name] for r in mine]
            stderr = mine[0]["tasks"][task].get(metric.name + "_stderr") if len(mine) == 1 else None
            cells[f"{task}.{metric.name}"] = {"mean": float(np.mean(values)), "ci95": _interval(values, stderr),
                                         "values": values, "n_items": mine[0]["tasks"][task]["n"]}
        norms = [r["skip_norms"] for r in mine if r["skip_norms"]]
        table[method] = {
            "trainable_params": mine[0]["trainable_params"], "seeds": [r["seed"] for r in mine], "metrics": cells,
            "run_dirs": [r["run_dir"] for r in mine],
            "train_tokens": mine[0]["train_tokens"], "train_seconds": mean_known([r["train_seconds"] for r in mine]),
            "eval_seconds": mean_known([r["eval_seconds"] for r in mine]),
            "skip_norms": np.mean(norms, axis=0).tolist() if norms else None,
            "lr": mine[0].get("lr"),
        }
    made: dict[str, list[str]] = {}  # each run's record of what made it, runs with the same record together
    for r in runs:
        made.setdefault(describe(r.get("provenance")), []).append(r["run_dir"])
    return {"model": args.model, "preset": args.preset, "protocol": protocol, "seeds": seeds, "eval_limits": limits,
            "train": train_args, "methods": table, "wall_seconds": seconds, "args": asdict(args),
            "provenance": provenance(), "runs_provenance": made}


























