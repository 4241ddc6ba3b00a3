"""`preproj compare`: the paper's experiment on any model, every method under one budget, one report.

Trains each method (seeds x methods), evaluates each with `preproj eval`, and writes report.md
(a Table 2 with 95% intervals, the paper's numbers beneath, paired differences and a verdict on each of
the paper's claims), results.json, skip_norms.{png,json}, paired.png and training_curves.png.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..analysis.paper import (
    CLAIMS,
    PAPER_COLUMNS,
    PAPER_SKIP_NORMS,
    PAPER_TABLE,
    check_claims,
    check_depth,
    claim_pairs,
    claims_table,
)
from ..analysis.stats import (
    RULE,
    RULES,
    STATISTICS,
    Paired,
    benjamini_hochberg,
    holm,
    paired_difference,
    t_interval,
)
from ..evaluation import read_items
from ..evaluation.runner import evaluate
from ..evaluation.tasks import TASK_TABLE, Metric, columns, default_tasks, paired_metrics
from ..methods.lora import merged_for_evaluation
from ..methods.registry import METHODS
from ..runtime import distributed as ddist
from ..runtime.files import atomic_write, write_json
from ..runtime.precision import precision as as_precision
from ..runtime.precision import resolve_device
from ..runtime.validation import check_args
from ..training.loop import TrainArgs, train

logger = logging.getLogger(__name__)


PRESETS = {
    # Sized for the embedded SmolLM2-135M on 2 CPU cores: the whole comparison in under 30 minutes.
    # One precision trains every method; one evaluates every method, the base included (the two load the
    # base in the same dtype, so the base is exactly the model the methods were trained on).
    "cpu": {
        "precision": "auto",
        "eval_precision": "fp32",
        "train": dict(data="wikitext2", packing="pack", seq_len=256, batch_size=4, grad_accum=1, steps=32, lr=3e-4,
                      warmup=4, eval_every=8, eval_batches=4, save_every=8),
        "eval": dict(protocol="harness", limits={"lambada": 200, "hellaswag": 100, "arc_easy": 200, "wikitext": 2},
                     max_length=2048),
    },
    # The CPU study (issue 10): clean splits (train on WikiText-2 train, pick learning rates on raw valid,
    # report on raw test and the full evaluation sets), 262,144 training tokens per run, 3 seeds for the
    # methods that matter most. Hours on 2 cores; every run and sweep point resumes where it stopped. fp32
    # throughout, so that runs made in parts on different machines are alike.
    "study": {
        "precision": "fp32",
        "eval_precision": "fp32",
        "train": dict(data="wikitext2-train", packing="pack", seq_len=256, batch_size=4, grad_accum=1, steps=256, lr=3e-4,
                      warmup=16, eval_every=64, eval_batches=8, save_every=32),
        # wikitext_file: the test documents also in the training text's format, where the paper measures (issue 28)
        "eval": dict(protocol="harness", limits={}, max_length=2048, extra_tasks=("wikitext_file",)),
        "lr_sweep": "1e-4,3e-4,1e-3,3e-3", "sweep_steps": 64, "sweep_seeds": 2, "seeds": 3,
        # Every method at its own swept rate, and the two the rate confounds (issue 28) also at preproj+skip's 3e-4,
        # the common rate; 3 seeds each. results/study-cpu/analysis_plan.json declares the comparisons among them.
        "methods": "base,preproj+skip,lora,skip,preproj,preproj+lora,lora@3e-4,skip@3e-4",
    },
    # The paper's exact protocol (PAPER.md §2) on whatever device is present: 4 x 4 x 512 tokens per
    # step; several processes split the 4 sequences of each micro-batch between them.
    "paper": {
        "precision": "bf16-true",
        "eval_precision": "bf16-true",
        "train": dict(data="wikitext103", lines=2000, packing="lines", seq_len=512, batch_size=4, grad_accum=4, steps=500,
                      lr=1e-5, warmup=50, activation_checkpointing=True, eval_every=50, save_every=50),
        "eval": dict(protocol="paper", limits={}, max_length=None),
    },
}


@dataclass
class CompareArgs:
    """Arguments of `preproj compare`."""

    model: str = "smollm2-135m"
    """Embedded name, Hugging Face hub id or local directory."""
    methods: str | None = None
    """Comma-separated: base, lora, preproj, skip, preproj+skip, preproj+lora; METHOD@LR trains METHOD at that peak
    learning rate instead of the swept one (its runs are METHOD@LR-seedN). Default: the preset's, else all six."""
    seeds: int | None = None
    """Seeds (42, 43, ...) per method of --seeded-methods; default: the preset's (cpu, paper: 1; study: 3)."""
    seeded_methods: str | None = None
    """Comma-separated methods that get --seeds seeds, the others one; default: the preset's (all trained methods)."""
    preset: str = "cpu"
    """cpu (embedded model on 2 cores, < 30 min), study (the decisive CPU study: hours, resumable) or paper
    (PAPER.md §2, for a GPU)."""
    lr_sweep: str | None = None
    """Comma-separated peak learning rates; each method trains at the one with the lowest held-out loss on the
    training data's validation text after --sweep-steps. Default: the preset's (study: 1e-4,3e-4,1e-3,3e-3); 'none': --lr."""
    sweep_steps: int | None = None
    """Training steps of each sweep run (default: the preset's, else a quarter of the training steps)."""
    sweep_seeds: int | None = None
    """Seeds (42, 43, ...) for each method's best two sweep rates after seed 42; the choice is the lower mean over
    them, so that a difference smaller than the seeds' spread does not decide. Default: the preset's, else 1."""
    steps: int | None = None
    """Override the preset's training steps."""
    limit: int | None = None
    """Override the preset's evaluation items per task."""
    lr: float | None = None
    """Override the preset's peak learning rate."""
    precision: str | None = None
    """Override the preset's training precision (auto, fp32, bf16-mixed, bf16-true, bf16-frozen), the same for every
    method."""
    eval_precision: str | None = None
    """Override the preset's evaluation precision, the same for every method and the base; it must load the base
    in the training precision's dtype."""
    device: str = "auto"
    """auto (CUDA when present, else CPU), cpu, cuda, cuda:N or mps."""
    strategy: str = "ddp"
    """Under torchrun: ddp or fsdp for the training runs (evaluation splits items across processes)."""
    report_to: str = "none"
    """Experiment trackers for every training run: none, tensorboard, wandb, trackio (comma-separated)."""
    data_dir: str | None = None
    """Directory laid out as ../shared/data; default $PREPROJ_DATA_DIR."""
    out: str = "runs/compare"
    """Output directory."""
    report_only: bool = False
    """Write the report from the (method, seed) runs finished so far in --out, training and evaluating nothing; the
    runs still to come are listed. Safe while the comparison itself runs."""


def _interval(values: list[float], stderr: float | None) -> float | None:
    """Half-width of a 95% interval: over seeds (t) when there are several, else 1.96 x the metric's stderr."""
    if len(values) > 1:
        return t_interval(values)[1]
    return None if stderr is None or not math.isfinite(stderr) else 1.96 * stderr


def run_compare(args: CompareArgs, progress: bool = True) -> dict:

    check_args(args)
    if args.preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {args.preset!r}.")
    preset = PRESETS[args.preset]
    methods = [m.strip() for m in (args.methods or preset.get("methods") or ",".join(METHODS)).split(",") if m.strip()]
    if not methods:
        raise ValueError(f"--methods is empty; choose from {', '.join(METHODS)}.")
    for arm in methods:
        arm_method_lr(arm)
    device = resolve_device(args.device)
    precision = as_precision(args.precision or preset["precision"], device)
    eval_precision = as_precision(args.eval_precision or preset["eval_precision"], device)
    if eval_precision.weights != precision.weights:
        raise ValueError(f"eval precision {eval_precision.name} loads weights in {eval_precision.weights}, training "
                         f"precision {precision.name} in {precision.weights}: pick two that load the base alike.")
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
    # A report-only pass reads finished runs and writes only the report's own files, never a run's, so it may run
    # beside the comparison that owns the directory.
    with nullcontext() if args.report_only else ddist.owned(Path(args.out), "preproj compare", device):
        return _compare(args, methods, preset, precision, eval_precision, device, r, progress, lr_sweep)


def arm_method_lr(arm: str) -> tuple[str, float | None]:
    """'lora@3e-4' -> ('lora', 0.0003); 'lora' -> ('lora', None): an arm is a method, optionally at a fixed rate."""
    method, at, lr_text = arm.partition("@")
    if method not in METHODS:
        raise ValueError(f"Unknown method {method!r}" + (f" in {arm!r}" if arm != method else "")
                         + f"; choose from {', '.join(METHODS)} (METHOD@LR for a fixed learning rate).")
    if not at:
        return method, None
    try:
        lr = float(lr_text)
    except ValueError:
        lr = math.nan
    if method == "base" or not lr > 0 or not math.isfinite(lr):
        raise ValueError(f"{arm!r}: METHOD@LR takes a trained method and a learning rate > 0, such as lora@3e-4.")
    return method, lr


def _compare(args: CompareArgs, methods: list[str], preset: dict, precision, eval_precision, device, r, progress: bool,
             lr_sweep: str | None) -> dict:
    from ..runtime.loading import load_model

    out = Path(args.out)
    eval_cfg = preset["eval"]
    limits = {t: args.limit for t in default_tasks()} if args.limit else eval_cfg["limits"]
    start = time.monotonic()
    seeds = args.seeds or preset.get("seeds", 1)
    seeded = (args.seeded_methods or preset.get("seeded_methods") or ",".join(methods)).split(",")
    train_args = {**preset["train"], **{k: v for k, v in (("steps", args.steps), ("lr", args.lr)) if v}}
    if not lr_sweep:
        sweep = None
    elif args.report_only:
        sweep_file = out / "sweep" / "sweep.json"
        sweep = json.loads(sweep_file.read_text()) if sweep_file.is_file() else None
    else:
        swept = list(dict.fromkeys(m for m, lr in map(arm_method_lr, methods) if m != "base" and lr is None))
        sweep = sweep_learning_rates(args, swept, train_args, lr_sweep, precision, device, progress)

    runs, pending = [], []  # runs: one per finished (method, seed); pending: those a report-only pass finds unfinished
    # Seed by seed (every method's seed 42, then the seeded methods' 43, ...), so that a comparison stopped
    # part-way already pairs every method with every other.
    count = {m: seeds if m in seeded and m != "base" else 1 for m in methods}
    plan = [(m, 42 + k) for k in range(max(count.values())) for m in methods if k < count[m]]
    for arm, seed in plan:
        method, fixed_lr = arm_method_lr(arm)
        lr = None if method == "base" else fixed_lr or (sweep["chosen"][method] if sweep else train_args["lr"])
        run_dir = out / f"{arm}-seed{seed}"
        done = run_dir / "result.json"
        if done.is_file():  # resumable: a finished (arm, seed) is not redone
            runs.append(json.loads(done.read_text()))
            trained_at = runs[-1]["lr"]
            if not args.report_only and lr is not None and trained_at is not None and not math.isclose(trained_at, lr):
                keep_as = out / f"{method}@{trained_at:g}-seed{seed}"
                raise ValueError(f"{run_dir} was trained at lr {trained_at:g} but {arm} now trains at {lr:g} (the "
                                 f"sweep's choice changed): rename it to {keep_as} to keep it as that arm, then run again.")
            runs[-1]["method"] = arm
            logger.info(f"[compare] {arm} seed {seed}: already done, reusing {done}")
            continue
        if args.report_only:
            pending.append(run_dir.name)
            continue
        logger.info(f"[compare] {arm} seed {seed} ...")
        model, tokenizer = load_model(args.model, dtype=precision.weights, device=device)
        summary = None
        if method != "base":
            targs = TrainArgs(model=args.model, method=method, out=str(run_dir), seed=seed, data_dir=args.data_dir,
                              resume=True, precision=precision.name, device=str(device), strategy=args.strategy,
                              report_to=args.report_to, **{**train_args, "lr": lr})
            summary, model = train(targs, model, tokenizer, progress=progress)
        tasks, task_seconds, weights = {}, {}, trained_weights_digest(model)
        model = merged_for_evaluation(model)  # a LoRA scores at the base's cost; the digest is of what was trained
        tasks_here = (*default_tasks(), *eval_cfg.get("extra_tasks", ()))
        for task, limit in ({t: limits.get(t if t in limits else t.split("_")[0]) for t in tasks_here}).items():
            # Each finished task is kept, so an evaluation stopped part-way resumes at the task it was in,
            # if the weights are the very ones it scored (a run retrained elsewhere may differ in the last bit).
            done_task, items = run_dir / f"eval.{task}.json", run_dir / f"items.{task}.jsonl"
            setting = {"protocol": eval_cfg["protocol"], "limit": limit, "max_length": eval_cfg["max_length"],
                       "precision": eval_precision.name, "weights": weights}
            kept = json.loads(done_task.read_text()) if done_task.is_file() and items.is_file() else {}
            if kept.get("setting") == setting:
                tasks[task], task_seconds[task] = kept["result"], kept.get("seconds")
                continue
            t0 = time.monotonic()
            res = evaluate(model, tokenizer, [task], protocol=eval_cfg["protocol"], limit=limit, data_dir=args.data_dir,
                           max_length=eval_cfg["max_length"], precision=eval_precision.name, progress=progress,
                           items_out=items)
            tasks[task], task_seconds[task] = res["tasks"][task], time.monotonic() - t0
            if r.is_main:
                write_json(done_task, {"setting": setting, "result": tasks[task], "seconds": task_seconds[task]})
        result = {"method": arm, "seed": seed, "tasks": tasks, "run_dir": run_dir.name,
                  "lr": targs.lr if summary else None,
                  "trainable_params": summary["trainable_params"] if summary else 0,
                  "train_tokens": summary["tokens_seen"] if summary else 0,
                  # None where a part ran before times were kept across a resume
                  "train_seconds": summary.get("train_seconds") if summary else 0.0,
                  "eval_seconds": None if None in task_seconds.values() else sum(task_seconds.values()),
                  "skip_norms": summary["skip_norms"] if summary else None,
                  "log": _read_log(run_dir) if summary else []}
        if r.is_main:
            write_json(done, result)
        runs.append(result)
        logger.info(f"[compare] {arm} seed {seed}: " + ", ".join(
            f"{t} {m.name}={tasks[t][m.name]:.4g}" for t, m in columns(eval_cfg["protocol"])))

    if args.report_only:
        methods = [m for m in methods if any(r["method"] == m for r in runs)]
        if not methods:
            raise ValueError(f"No (method, seed) run has finished in {out} yet (METHOD-seedN/result.json); run the "
                             "comparison without --report-only first.")
        seeds = max(sum(r["method"] == m for r in runs) for m in methods)
    report = summarise(runs, methods, args, eval_cfg["protocol"], limits, time.monotonic() - start, train_args, seeds)
    plan = analysis_plan(out, methods, eval_cfg["protocol"])
    report.update(pending=pending, sweep=sweep, precision=precision.name, eval_precision=eval_precision.name, device=str(device),
                  plan=plan, rule=plan.get("rule", RULE), paired=paired_comparisons(runs, methods, eval_cfg["protocol"], out, plan))
    report.update(claims=check_claims(report["paired"], plan, column_names(eval_cfg["protocol"])),
                  depth=check_depth([r["skip_norms"] for r in runs if r["method"] == "preproj+skip" and r["skip_norms"]]))
    if not r.is_main:
        return report
    write_json(out / "results.json", report)
    norms = {m: report["methods"][m]["skip_norms"] for m in methods if report["methods"][m]["skip_norms"]}
    write_json(out / "skip_norms.json", {"ours": norms, "paper": PAPER_SKIP_NORMS})
    plot_skip_norms(norms, out / "skip_norms.png", Path(args.model).name)
    plot_training_curves(runs, out / "training_curves.png")
    if report["paired"]:
        plot_paired(report["paired"], out / "paired.png")
    text = render_report(report)
    atomic_write(out / "report.md", lambda tmp: Path(tmp).write_text(text))
    return report


def trained_weights_digest(model) -> str:
    """SHA-256 of the tensors that require grad: after training, the adapter's; for the base, as loaded, all of them."""
    digest = hashlib.sha256()
    for name, p in model.named_parameters():
        if p.requires_grad:
            digest.update(name.encode() + p.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def column_names(protocol: str) -> dict[str, str]:
    """task -> the metric of its column in the table (what the paper's claims are checked on)."""
    return {task: metric.name for task, metric in columns(protocol)}


def item_values(files: list[Path], task: str, value_of) -> np.ndarray | None:
    """(seeds, items, ...) values of `task` from per-item files, one file per seed; None when a file lacks the task
    or the seeds were scored on different items."""
    rows = []
    for path in files:
        records = sorted(read_items(path).get(task, []), key=lambda x: x["index"])
        if not records:
            return None
        rows.append(([x["index"] for x in records], [value_of(x) for x in records]))
    if not rows or any(idx != rows[0][0] for idx, _ in rows):
        return None
    return np.array([v for _, v in rows], dtype=np.float64)


def other_convention(rule: str) -> str:
    """The rule's twin under the other defensible convention for a seed variance measured on fixed items: less the
    seed-by-item interaction, or raw (results/coverage.md). A call that changes between the two is fragile."""
    if rule.startswith("subtract, ") and rule.replace("subtract", "raw", 1) in RULES:
        return rule.replace("subtract", "raw", 1)
    if rule.startswith("raw, ") and rule.replace("raw", "subtract", 1) in RULES:
        return rule.replace("raw", "subtract", 1)
    return "raw, n-1 df" if rule.startswith("subtract") else "subtract, Satterthwaite df"


def paired_between(a: dict[str, list[Path]], b: dict[str, list[Path]], protocol: str,
                   seed_paired: bool = False, rule: str = RULE) -> list[Paired]:
    """B against A on every paired metric both have: a and b map task -> per-seed item files (seed-paired: file i of
    both sides has the same seed)."""
    found = []
    for task, metric in paired_metrics(protocol):
        va = item_values(a.get(task, []), task, metric.item_value)
        vb = item_values(b.get(task, []), task, metric.item_value)
        if va is None or vb is None or va.shape[1:] != vb.shape[1:]:
            continue
        pair = seed_paired and len(va) == len(vb) > 1
        found.append(paired_difference(va, vb, STATISTICS[metric.statistic], metric=f"{task}.{metric.name}",
                                       higher_is_better=metric.higher_is_better, seed_paired=pair, rule=rule))
    return found


def _items_in(dirs: list[Path]) -> dict[str, list[Path]]:
    """task -> the per-item files that compare's run directories hold for it (DIR/items.TASK.jsonl)."""
    return {t: [d / f"items.{t}.jsonl" for d in dirs if (d / f"items.{t}.jsonl").is_file()] for t in TASK_TABLE}


def _run_files(out: Path, runs: list[dict], method: str) -> dict[str, list[Path]]:
    mine = sorted((r for r in runs if r["method"] == method), key=lambda r: r["seed"])
    return _items_in([out / r.get("run_dir", f"{method}-seed{r['seed']}") for r in mine])


def analysis_plan(out: Path, methods: list[str], protocol: str) -> dict:
    """The comparisons, their families and corrections: OUT/analysis_plan.json where the study declared one before
    its runs, else this default: every trained arm against the base and against lora, the pairs the paper's claims
    need; Holm over the claims, Benjamini-Hochberg over every comparison."""
    path = out / "analysis_plan.json"
    if path.is_file():
        plan = json.loads(path.read_text())
        plan["file"] = str(path)
        return plan
    pairs = [(m, ref) for ref in ("base", "lora") if ref in methods for m in methods if m not in ("base", ref)]
    pairs += [pair for pair in claim_pairs(methods) if pair not in pairs]
    names = column_names(protocol)
    claims = [{"method": c.method, "reference": c.reference, "metric": f"{c.task}.{names[c.task]}"} for c in CLAIMS
              if c.task in names]
    return {"alpha": 0.05, "comparisons": [{"method": m, "reference": r} for m, r in pairs],
            "families": [{"name": "claims", "correction": "holm", "members": claims},
                         {"name": "all", "correction": "benjamini-hochberg", "members": "all"}]}


def paired_comparisons(runs: list[dict], methods: list[str], protocol: str, out: Path, plan: dict | None = None) -> list[dict]:
    """The plan's comparisons (analysis_plan), metric by metric, paired over items and, where both arms were trained
    with the same seeds, seed by seed: effect, 95% interval, p-value, the smallest detectable effect (stats.py), and
    the verdict that the family's correction leaves."""
    plan = plan or analysis_plan(out, methods, protocol)
    pairs = [(c["method"], c["reference"]) for c in plan["comparisons"] if {c["method"], c["reference"]} <= set(methods)]
    seeds = {m: sorted(r["seed"] for r in runs if r["method"] == m) for m in methods}
    rule = plan.get("rule", RULE)
    found, twin = [], []  # the plan's rule, and the other convention's, each corrected in full
    for method, reference in pairs:
        a, b = _run_files(out, runs, reference), _run_files(out, runs, method)
        for task in a:  # a run from before per-item records has no file: no paired comparison for it
            if len(a[task]) != len(seeds[reference]) or len(b[task]) != len(seeds[method]):
                a[task] = b[task] = []
        seed_paired = "base" not in (method, reference) and seeds[method] == seeds[reference] and len(seeds[method]) > 1
        for entries, r in ((found, rule), (twin, other_convention(rule))):
            for p in paired_between(a, b, protocol, seed_paired, r):
                if not plan.get("metrics") or p.metric in plan["metrics"]:
                    entries.append({"method": method, "reference": reference, **p.to_dict(), "raw_verdict": p.verdict})
    _correct(found, plan)
    _correct(twin, plan)
    for entry, other in zip(found, twin, strict=True):
        entry["fragile"] = entry["verdict"] != other["verdict"]
        entry["text"] = _describe_entry(entry)
    return found


def _correct(found: list[dict], plan: dict) -> None:
    """Adjusted p-values per family (Holm or Benjamini-Hochberg), and each entry's verdict from its adjusted p: a claim
    follows its Holm family, every other entry Benjamini-Hochberg over all comparisons."""
    alpha = plan.get("alpha", 0.05)
    adjust = {"holm": holm, "benjamini-hochberg": benjamini_hochberg}
    for family in plan["families"]:
        if family["correction"] not in adjust:
            raise ValueError(f"{plan.get('file', 'the analysis plan')}: family {family['name']!r} has correction "
                             f"{family['correction']!r}; use one of {', '.join(adjust)}.")
        wanted = None if family["members"] == "all" else {(x["method"], x["reference"], x["metric"]) for x in family["members"]}
        members = [e for e in found if wanted is None or (e["method"], e["reference"], e["metric"]) in wanted]
        for entry, q in zip(members, adjust[family["correction"]]([e["p"] for e in members])):
            entry.setdefault("adjusted", {})[family["name"]] = q
            if family["correction"] == "holm" or "decided_by" not in entry:
                entry["decided_by"] = family["name"]
    for entry in found:
        q = entry.get("adjusted", {}).get(entry.get("decided_by"), entry["p"])
        entry["verdict"] = entry["raw_verdict"] if q < alpha else "no detectable difference"


def _describe_entry(entry: dict) -> str:
    """'+0.021 [+0.003, +0.040] p 0.021, adj. 0.084 (all): no detectable difference (would detect ±0.030)'."""
    d = _digits(entry["metric"])
    f = f"{{:+.{d}f}}"
    q = entry.get("adjusted", {}).get(entry.get("decided_by"))
    text = f"{f.format(entry['effect'])} [{f.format(entry['low'])}, {f.format(entry['high'])}] p {entry['p']:.2g}"
    if q is not None:
        text += f", adj. {q:.2g}"
    text += f": {entry['verdict']}"
    if entry["verdict"] == "no detectable difference":
        text += f" (would detect ±{entry['mde']:.{d}f})"
    if entry.get("fragile"):
        text += ", fragile"
    return text


def item_files(spec: str) -> dict[str, list[Path]]:
    """task -> per-seed item files for `preproj paired`: `eval --items` files (comma-separated, one per seed), or
    DIR:METHOD for every seed of METHOD in a `preproj compare` directory (DIR/METHOD-seed*/items.TASK.jsonl)."""
    path, _, method = spec.partition(":")
    if not method:
        paths = [Path(x) for x in path.split(",") if x]
        missing = [str(x) for x in paths if not x.exists()]
        if missing:
            raise ValueError(f"{', '.join(missing)}: no such file (give items files of preproj eval --items, or "
                             "DIR:METHOD of a compare run).")
        if not paths or not all(x.is_file() for x in paths):
            raise ValueError(f"{spec!r}: not items files (preproj eval --items), nor DIR:METHOD of a compare run.")
        files: dict[str, list[Path]] = {}
        for x in paths:
            for task in read_items(x):
                files.setdefault(task, []).append(x)
        return {t: f for t, f in files.items() if len(f) == len(paths)}
    files = _items_in(sorted(Path(path).glob(f"{method}-seed*")))
    if not any(files.values()):
        raise ValueError(f"No per-item records of {method!r} in {path} (expected {path}/{method}-seed*/items.TASK.jsonl).")
    return {t: f for t, f in files.items() if f}


def _digits(metric: str) -> int:
    return 2 if "perplexity" in metric else 4 if "loss" in metric else 3


def sweep_learning_rates(args: CompareArgs, methods: list[str], train_args: dict, lr_sweep: str, precision, device,
                         progress: bool) -> dict:
    """Each trained method's peak learning rate: the candidate whose run (seed 42, --sweep-steps steps) ends
    with the lowest held-out loss on the training data's validation text, never on the reported text."""
    from ..runtime.loading import load_model

    out = Path(args.out) / "sweep"
    try:
        candidates = [float(x) for x in lr_sweep.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--lr-sweep must be comma-separated learning rates, got {lr_sweep!r}.") from None
    if not candidates or any(not lr > 0 for lr in candidates):
        raise ValueError(f"--lr-sweep needs learning rates > 0, got {lr_sweep!r}.")
    steps = args.sweep_steps or PRESETS[args.preset].get("sweep_steps") or max(1, train_args["steps"] // 4)
    n_seeds = args.sweep_seeds or PRESETS[args.preset].get("sweep_seeds") or 1
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
                                 "precision": precision.name, "device": str(device), "strategy": args.strategy})
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


def _read_log(run_dir: Path) -> list[dict]:
    path = run_dir / "train_log.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def summarise(runs: list[dict], methods: list[str], args: CompareArgs, protocol: str, limits: dict, seconds: float,
              train_args: dict, seeds: int) -> dict:
    table = {}
    for method in methods:
        mine = [r for r in runs if r["method"] == method]
        cells = {}
        for task, metric in columns(protocol):
            values = [r["tasks"][task][metric.name] for r in mine]
            stderr = mine[0]["tasks"][task].get(metric.name + "_stderr") if len(mine) == 1 else None
            cells[f"{task}.{metric.name}"] = {"mean": float(np.mean(values)), "ci95": _interval(values, stderr),
                                         "values": values, "n_items": mine[0]["tasks"][task]["n"]}
        norms = [r["skip_norms"] for r in mine if r["skip_norms"]]
        table[method] = {
            "trainable_params": mine[0]["trainable_params"], "seeds": [r["seed"] for r in mine], "metrics": cells,
            "train_tokens": mine[0]["train_tokens"], "train_seconds": _mean_known([r["train_seconds"] for r in mine]),
            "eval_seconds": _mean_known([r["eval_seconds"] for r in mine]),
            "skip_norms": np.mean(norms, axis=0).tolist() if norms else None,
            "lr": mine[0].get("lr"),
        }
    return {"model": args.model, "preset": args.preset, "protocol": protocol, "seeds": seeds, "eval_limits": limits,
            "train": train_args, "methods": table, "wall_seconds": seconds, "args": asdict(args)}


def _mean_known(seconds: list[float | None]) -> dict:
    """The mean over the runs whose time is on record, and how many of them there are."""
    known = [x for x in seconds if x is not None]
    return {"mean": float(np.mean(known)) if known else None, "runs": len(known), "of": len(seconds)}


def _fmt_seconds(t: dict) -> str:
    if t["mean"] is None:
        return "unknown"
    return f"{t['mean']:.0f}s" + (f" ({t['runs']} of {t['of']} runs)" if t["runs"] < t["of"] else "")


def _fmt_training(report: dict) -> str:
    """The shared training arguments; a swept learning rate is each method's own, so the default is not shown."""
    if not report.get("sweep"):
        return json.dumps(report["train"])
    return json.dumps({k: v for k, v in report["train"].items() if k != "lr"}) + " at each method's swept learning rate"


def _fmt_seeds(report: dict) -> str:
    """One count when every trained method has the same seeds, else each method's seeds (an interim report, or
    `--seeded-methods` giving some methods more seeds than others)."""
    trained = {m: row["seeds"] for m, row in report["methods"].items() if row["trainable_params"]}
    if len({tuple(s) for s in trained.values()}) <= 1:
        return f"Seeds per method: {report['seeds']}"
    return "Seeds: " + "; ".join(f"{m} {', '.join(map(str, s))}" for m, s in trained.items())


def _fmt(cell: dict, metric: Metric) -> str:
    ppl = metric.statistic == "perplexity"  # perplexities in two decimals, the rest in three
    value = f"{cell['mean']:.2f}" if ppl else f"{cell['mean']:.3f}"
    if cell["ci95"] is None:
        return value
    return value + (f" ± {cell['ci95']:.2f}" if ppl else f" ± {cell['ci95']:.3f}")


def render_report(report: dict) -> str:
    protocol = report["protocol"]
    pending = report.get("pending")
    interim = [f"**Interim report**: {len(pending)} run(s) still to come ({', '.join(pending)}); every figure below is "
               "from the runs finished so far.", ""] if pending else []
    lines = [f"# preproj compare: {report['model']} (preset {report['preset']})", "", *interim,
             f"Protocol `{protocol}`; evaluation items per task: "
             + (", ".join(f"{k} {v}" for k, v in report["eval_limits"].items()) or "the protocol's defaults")
             + f". Training: {_fmt_training(report)}. Precision, the same for every method: training "
             f"{report.get('precision', '?')}, evaluation {report.get('eval_precision', '?')}. {_fmt_seeds(report)}. "
             "Intervals are 95%: over seeds when there are several, else 1.96 x the metric's standard error, which "
             "carries no seed-to-seed variation (a row with one trained seed is conditional on it).", "",
             "| method | seeds | lr | trainable params | " + " | ".join(m.header for _, m in columns(protocol))
             + " | train tokens | train time | eval time |",
             "|---" * (len(columns(protocol)) + 7) + "|"]
    for method, row in report["methods"].items():
        cells = [_fmt(row["metrics"][f"{t}.{m.name}"], m) for t, m in columns(protocol)]
        trained = bool(row["trainable_params"])
        params = f"{row['trainable_params'] / 1e6:.2f}M" if trained else "–"
        train_time = _fmt_seconds(row["train_seconds"]) if trained else "–"
        lr = f"{row['lr']:g}" if row.get("lr") else "–"
        lines.append(f"| {method} | {len(row['seeds'])} | {lr} | {params} | " + " | ".join(cells)
                     + f" | {row['train_tokens']:,} | {train_time} | {_fmt_seconds(row['eval_seconds'])} |")
    lines += ["", "The paper's Table 2 (Pythia, its own protocol on 500-item subsets, one seed), for reference:", "",
              "| model | method | params | LAMBADA | HellaSwag | ARC-E | PPL |", "|---|---|---|---|---|---|---|"]
    for model, rows in PAPER_TABLE.items():
        for method, (p, lam, hs, arc, ppl) in rows.items():
            lines.append(f"| {model} | {method} | {'–' if p is None else f'{p / 1e6:.1f}M'} | {lam:.3f} | {hs:.3f} | {arc:.3f} | {ppl} |")
    sweep = report.get("sweep")
    if sweep:
        lrs = [f"{lr:g}" for lr in sweep["candidates"]]
        lines += ["", "## Learning rates", "", f"Each method's peak learning rate is the candidate with the lowest "
                  f"held-out loss after {sweep['steps']} steps (seed 42) on the training data's validation text, which "
                  f"is neither training text nor reported (sweep trained in {', '.join(sweep.get('precisions', []))}):", "",
                  "| method | " + " | ".join(f"lr {lr}" for lr in lrs) + " | chosen |", "|---" * (len(lrs) + 2) + "|"]
        for method, by_lr in sweep["heldout_loss"].items():
            lines.append(f"| {method} | " + " | ".join(f"{by_lr[lr]:.4f}" for lr in lrs)
                         + f" | {sweep['chosen'][method]:g} |")
        if sweep.get("seeds", 1) > 1:
            lines += ["", f"The best two rates of seed 42 were each trained with {sweep['seeds']} seeds (42, 43, ...); the "
                      "chosen rate has the lower mean held-out loss over them:", "",
                      "| method | rate: held-out loss per seed (mean) |", "|---|---|"]
            for method, finalists in sweep.get("finalists", {}).items():
                lines.append(f"| {method} | " + "; ".join(
                    f"{lr}: {', '.join(f'{x:.4f}' for x in xs)} ({np.mean(xs):.4f})" for lr, xs in finalists.items()) + " |")
    if report.get("paired"):
        lines += ["", "## Paired differences", "", paired_paragraph(report), ""]
        metrics = list(dict.fromkeys(p["metric"] for p in report["paired"]))
        lines += ["| method | against | seeds, test | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 3) + "|"]
        for key in dict.fromkeys((p["method"], p["reference"]) for p in report["paired"]):
            mine = [p for p in report["paired"] if (p["method"], p["reference"]) == key]
            cells = {p["metric"]: p["text"] for p in mine}
            lines.append(f"| {key[0]} | {key[1]} | {mine[0]['seeds'][1]} v {mine[0]['seeds'][0]}, {mine[0].get('test', '–')} | "
                         + " | ".join(cells.get(m, "–") for m in metrics) + " |")
    if report.get("claims") or report.get("depth"):
        lines += ["", "## The paper's claims", "", "Each claim is one method against one reference, checked by the paired "
                  "difference above and corrected with Holm's method within its family of claims: confirmed when the "
                  "adjusted p is below 0.05 and the effect lies on the paper's side of zero, refuted when it lies on the "
                  "other side, otherwise not detectable at this budget (with the smallest effect the run could have "
                  "detected, uncorrected). The depth claim uses a t interval over seeds.", ""]
        lines += claims_table(report.get("claims", []), report.get("depth"), _digits)
    lines += ["", "## What agrees and what does not", "", agreement_paragraph(report), ""]
    return "\n".join(lines)


def paired_paragraph(report: dict) -> str:
    """How to read the table, then what it says, written from the adjusted verdicts."""
    paired, plan = report["paired"], report.get("plan") or {}
    families = "; ".join(f"{f['name']}: {f['correction']} over "
                         + ("every comparison" if f["members"] == "all" else f"{len(f['members'])} declared comparisons")
                         for f in plan.get("families", []))
    how = ("Each cell is the paired difference (method minus the reference; for perplexity and held-out loss, lower is "
           "better) with its 95% interval and p-value. The items' variance is the paired bootstrap's, in closed form; "
           "seeds enter seed by seed where both arms were trained with the same seeds (seed-paired: seed i is the same "
           "data order), else through each arm's own seed variance (item-and-seed; an arm with one seed adds none, so "
           "the interval is conditional on it). Seed variances follow the rule results/coverage.md chose "
           f"({plan.get('rule', RULE)}). "
           f"Every verdict follows the p-value adjusted for the comparisons of its family ({families}"
           + (f", declared in {plan['file']}" if plan.get("file") else "") + "): better or worse only when the adjusted "
           "p is below 0.05; otherwise the cell gives the smallest effect this run could have detected (80% power, "
           "uncorrected). A call marked fragile changes, after correction, under the other defensible convention "
           f"for the seeds' variance ({other_convention(plan.get('rule', RULE))}).")
    called = [p for p in paired if p["verdict"] != "no detectable difference"]
    if not called:
        said = f" After correction no method differs detectably from its reference on any of the {len(paired)} comparisons."
    else:
        said = " Detectable after correction: " + "; ".join(
            f"{p['method']} vs {p['reference']} on {p['metric']}: {p['verdict']} ({p['text'].split(' p ')[0]}"
            + (", fragile" if p.get("fragile") else "") + ")" for p in called) + "."
        said += f" The other {len(paired) - len(called)} comparisons show no detectable difference after correction"
        raw = [p for p in paired if p.get("raw_verdict", p["verdict"]) != "no detectable difference" and p not in called]
        said += (f", {len(raw)} of them only because of it (raw interval excludes zero: "
                 + "; ".join(f"{p['method']} vs {p['reference']} on {p['metric']}" for p in raw) + ")." if raw else ".")
    return how + said


def agreement_paragraph(report: dict) -> str:
    """One paragraph, written from the numbers: the sign of each method's change over base, against the paper's 160M."""
    rows, protocol = report["methods"], report["protocol"]
    if "base" not in rows:
        return "No base row was run, so no change over the base model can be compared with the paper."
    paper = PAPER_TABLE["Pythia-160M"]
    said = []
    for method in [m for m in rows if m != "base" and m in paper]:
        parts = []
        for task, metric in columns(protocol):
            if task not in PAPER_COLUMNS:
                continue
            k = 1 + PAPER_COLUMNS.index(task)
            ours = rows[method]["metrics"][f"{task}.{metric.name}"]
            base = rows["base"]["metrics"][f"{task}.{metric.name}"]
            delta = ours["mean"] - base["mean"]
            theirs = paper[method][k] - paper["base"][k]
            sign = 1 if metric.higher_is_better else -1
            better, paper_better = sign * delta > 0, sign * theirs > 0
            # The paired test on the same items decides whether the change is real; without one (runs from before
            # per-item records), the wider of the two unpaired intervals does.
            paired = next((p for p in report.get("paired", []) if (p["method"], p["reference"], p["metric"])
                           == (method, "base", f"{task}.{metric.name}")), None)
            if paired is not None:
                real = paired["verdict"] != "no detectable difference"
            else:
                real = abs(delta) > max(ours["ci95"] or 0.0, base["ci95"] or 0.0)
            if delta == 0:
                verdict = "no change"
            elif theirs == 0:
                verdict = "no change in the paper" + ("" if real else "; ours not detectable")
            else:
                verdict = "same direction" if better == paper_better else "opposite direction"
                verdict += "" if real else ", not detectable"
            parts.append(f"{metric.header.split()[0]} {delta:+.3g} (paper {theirs:+.3g}: {verdict})")
        said.append(f"{method}: " + "; ".join(parts) + ".")
    said = "Change over base, ours against the paper's Pythia-160M. " + " ".join(said)
    if "wikitext" not in column_names(protocol):
        return said
    ppl_key = "wikitext." + column_names(protocol)["wikitext"]
    ranking = sorted(rows, key=lambda m: rows[m]["metrics"][ppl_key]["mean"])
    return (said + f" Ranked by WikiText perplexity (lower is better): {' < '.join(ranking)}; the paper's "
            "160M ranking is preproj+skip < preproj+lora < lora < preproj < base. Training and the perplexity evaluation "
            "share a source (WikiText), so perplexity gains include in-domain adaptation, as in the paper. The base "
            "model, budget and protocol differ from the paper's, so only directions are comparable, not magnitudes.")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def plot_skip_norms(norms: dict[str, list[float]], path: Path, model_name: str) -> None:
    """Ours on the left axis, the paper's Pythia curves on a second axis: the two trained at different rates and
    precisions, so their scales differ and only the shapes compare (the figure says so)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    for method, values in norms.items():
        ax.plot(np.linspace(0, 1, len(values)), values, "o-", ms=3, label=f"{model_name} {method}")
    paper_ax = ax.twinx()
    for label, values in PAPER_SKIP_NORMS.items():
        paper_ax.plot(np.linspace(0, 1, len(values)), values, "--", color="gray" if "160" in label else "silver",
                      label=f"paper {label} (right axis)")
    ax.set_xlabel("layer depth (0 = first, 1 = last)")
    ax.set_ylabel(f"||W_skip||_F, {model_name}")
    paper_ax.set_ylabel("||W_skip||_F, paper (Pythia)", color="gray")
    ax.set_title("Content-skip norms by depth")
    fig.text(0.01, 0.01, "The paper trained at lr 1e-5 in bf16, these runs at their own swept rates: the scales differ, "
             "compare the shapes.", fontsize=7, color="dimgray")
    lines = ax.get_legend_handles_labels()
    more = paper_ax.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="upper left")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_paired(paired: list[dict], path: Path) -> None:
    """One panel per metric: each (method, reference) pair's paired difference with its 95% interval."""
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    metrics = list(dict.fromkeys(p["metric"] for p in paired))
    pairs = list(dict.fromkeys((p["method"], p["reference"]) for p in paired))
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.4 * len(metrics), 0.35 * len(pairs) + 1.9), sharey=True)
    for ax, metric in zip(np.atleast_1d(axes), metrics):
        for y, pair in enumerate(pairs):
            p = next((x for x in paired if (x["method"], x["reference"], x["metric"]) == (*pair, metric)), None)
            if p is None:
                continue
            color = {"better": "tab:green", "worse": "tab:red"}.get(p["verdict"], "tab:gray")
            ax.errorbar(p["effect"], y, xerr=[[p["effect"] - p["low"]], [p["high"] - p["effect"]]], fmt="o", ms=4,
                        color=color, capsize=2)
        ax.axvline(0, color="black", lw=0.8)
        lower = "perplexity" in metric or "loss" in metric
        ax.set_title(metric + (" (lower is better)" if lower else ""), fontsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=4))  # few ticks: wide ranges' labels would overlap
        ax.tick_params(labelsize=8)
        ax.tick_params(axis="x", labelrotation=30)
    axes = np.atleast_1d(axes)
    axes[0].set_yticks(range(len(pairs)), [f"{m} − {r}" for m, r in pairs])
    axes[0].invert_yaxis()
    fig.suptitle("Paired differences, 95% intervals (green better, red worse, grey not detectable; after correction)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _smoothed(values: list[float]) -> np.ndarray:
    """A centred moving average over an eighth of the run (shorter at the ends), so that several noisy runs stay
    apart on one panel."""
    x = np.asarray(values, dtype=float)
    if len(x) < 3:
        return x
    half = max(9, len(x) // 8) // 2
    return np.array([x[max(0, i - half):i + half + 1].mean() for i in range(len(x))])


def plot_training_curves(runs: list[dict], path: Path) -> None:
    plt = _pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, r in enumerate(x for x in runs if x["log"]):
        color = colors[k % len(colors)]
        label = f"{r['method']} (seed {r['seed']})"
        steps = [x for x in r["log"] if "loss" in x]
        xs, ys = [x["step"] for x in steps], [x["loss"] for x in steps]
        a.plot(xs, ys, lw=0.6, alpha=0.25, color=color)
        a.plot(xs, _smoothed(ys), lw=1.4, color=color, label=label)
        held = [x for x in r["log"] if "heldout_loss" in x]
        b.plot([x["step"] for x in held], [x["heldout_loss"] for x in held], "o-", ms=3, color=color, label=label)
    a.set_title("train loss (moving average; raw faint)")
    b.set_title("held-out loss")
    for ax in (a, b):
        ax.set_xlabel("step")
    a.set_ylabel("cross-entropy (nats/token)")
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
