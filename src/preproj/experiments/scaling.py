"""`preproj scaling`: does a transformer trained from scratch with pre-projection and content skip beat a
plain one at matched parameters or compute? A grid of sizes x variants x seeds of `preproj pretrain`, one
shared tokenizer, every run resumable; then paired differences across seeds, curves and a report.

Variants: a method (preproj+skip, preproj, skip, base) or a plain model matched to preproj+skip of the
same shape, `base@params` or `base@flops` (its MLP widened until the count agrees within 2%).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from ..data import resolve_data_dir, training_corpus
from ..runtime.files import atomic_write, read_jsonl, write_json
from ..runtime.precision import DeviceArgs, compute_context
from ..training import TrainingDiverged
from ..training.args import ScratchDataArgs
from ..training.scratch import (
    PretrainArgs,
    Shape,
    build_model,
    count_params,
    make_tokenizer,
    pretrain,
    pretrain_methods,
    shape_of,
    shared_fields,
    train_flops_per_token,
)
from ..training.scratch_vision import vision_shape
from .scaling_compare import REFERENCE, default_plan, paired_by_plan
from .scaling_report import plots, report_markdown

logger = logging.getLogger(__name__)

@dataclass
class ScalingArgs(DeviceArgs, ScratchDataArgs):
    """Arguments of `preproj scaling`: the grid, its learning rates and its timing, with `preproj pretrain`'s data
    and device groups (training/args.py), the same for every run."""

    out: str = "runs/scaling"
    """Output directory: one pretrain run per size/variant/seed, report.md, results.json, plots."""
    task: str = "text"
    """What every run trains on, as `preproj pretrain --task`: text, or a vision task (mnist, moving-mnist,
    moving-mnist-direction), whose runs are then compared item by item on their test files."""
    sizes: str = "2x96,4x128"
    """Model sizes, LAYERSxD_MODEL, comma-separated; heads = d_model / 32 (the default is the CPU study's)."""
    variants: str = "preproj+skip,base@params,base@flops,base,skip"
    """preproj+skip, preproj, skip, base (plain, same shape), base@params and base@flops (plain, MLP widened to
    preproj+skip's parameters or training FLOPs per token), or a block change (gate, gate-head, value-residual,
    pre-mlp, preproj+skip+gate)."""
    seeds: int = 3
    """Seeds per variant; seed i sets the initialisation and the data order of every variant's run i."""
    batch_size: int = 16
    """Sequences per step."""
    lr: float = 3e-3
    """Peak learning rate of every variant, unless --lrs sweeps them."""
    lrs: str | None = None
    """Rates to sweep, comma-separated (e.g. 1e-3,3e-3,1e-2): each variant's runs then use the rate whose sweep runs
    end with the lowest validation loss (raw valid, never the reported test text)."""
    sweep_tokens: int | None = None
    """Training tokens per sweep run (default: --tokens)."""
    sweep_seeds: int = 1
    """Seeds per swept rate; their mean validation loss decides."""
    warmup: int = 20
    """Warmup steps."""
    precision: str = "auto"
    """Precision of every run (auto: bf16-mixed where bf16 matmuls are native, else fp32)."""
    eval_every: int = 50
    """Held-out loss every N steps (the loss-versus-tokens curves)."""
    timing_rounds: int = 5
    """Rounds of side-by-side step timing (adapted versus plain of the same shape) per size."""
    report_only: bool = False
    """Recompute the comparisons from OUT/results.json under OUT/analysis_plan.json and rewrite the report and
    plots; nothing is trained or timed."""
    # the data group's fields whose defaults differ here
    tokens: int = 1_000_000
    seq_len: int = 128


def parse_sizes(text: str) -> list[tuple[int, int]]:
    sizes = []
    for part in text.split(","):
        layers, _, d = part.strip().partition("x")
        if not (layers.isdigit() and d.isdigit()) or int(d) % 32 or int(layers) < 1:
            raise ValueError(f"--sizes takes LAYERSxD_MODEL with D_MODEL a multiple of 32, e.g. 4x128; got {part!r}.")
        sizes.append((int(layers), int(d)))
    return sizes


MATCHED = ("base@params", "base@flops")


def parse_variants(text: str) -> list[str]:
    """Every method `preproj pretrain` builds, and the plain models matched to preproj+skip."""
    known = (*pretrain_methods(), *MATCHED)
    variants = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in variants if v not in known]
    if bad or REFERENCE not in variants:
        raise ValueError(f"--variants takes {', '.join(known)} and must include {REFERENCE}; got {text!r}.")
    return variants


def parse_lrs(text: str | None) -> list[float]:
    try:
        rates = [float(x) for x in (text or "").split(",") if x.strip()]
    except ValueError:
        rates = []
    if text is not None and (not rates or any(not (r > 0 and math.isfinite(r)) for r in rates)):
        raise ValueError(f"--lrs takes positive learning rates, comma-separated (e.g. 1e-3,3e-3,1e-2); got {text!r}.")
    return rates


def run_args(args: ScalingArgs, size: tuple[int, int], variant: str, seed: int, lr: float | None = None,
             sweep: bool = False) -> PretrainArgs:
    """A main run at out/SIZE/VARIANT/seedN, or a sweep run at out/SIZE/sweep/VARIANT@LR/seedN."""
    layers, d = size
    method, _, match = variant.partition("@")
    lr = args.lr if lr is None else lr
    where = Path(args.out) / f"{layers}x{d}" / ("sweep" if sweep else "") / (f"{variant}@{lr:g}" if sweep else variant)
    return PretrainArgs(**{
        **shared_fields(args, PretrainArgs), "out": str(where / f"seed{seed}"), "lr": lr,
        "tokens": (args.sweep_tokens or args.tokens) if sweep else args.tokens,
        "layers": layers, "d_model": d, "heads": d // 32, "method": method, "match": match or None,
        "tokenizer": str(Path(args.out) / "tokenizer"), "seed": seed, "save_every": args.eval_every, "resume": True,
        **({"epochs": None, "tokens": args.sweep_tokens} if sweep and args.sweep_tokens else {})})


def analysis_plan(out: Path, variants: list[str]) -> dict:
    """OUT/analysis_plan.json: written with the default before the first run, read as it is after, so that the
    families and corrections are declared before any result exists and an edited plan drives the report."""
    path = out / "analysis_plan.json"
    if not path.is_file():
        write_json(path, default_plan(variants))
    return json.loads(path.read_text())


def _shares_runs_with(key: str, variant: str, variants: list[str], shapes: dict) -> str | None:
    """The earlier plain variant of the same shape whose runs `variant` shares (base@flops at base@params's width)."""
    if not variant.startswith("base"):
        return None
    earlier = variants[:variants.index(variant)]
    return next((v for v in earlier if v.startswith("base") and shapes[key, v] == shapes[key, variant]), None)


def _run(r: PretrainArgs, progress: bool, study: dict | None = None, sweep: bool = False, count: str = "") -> dict:
    """The run's summary: read where it finished, else trained (resuming from its checkpoint). A study's run keeps
    the study file's record in its summary's provenance. A sweep point that diverges counts as an infinite
    validation loss (the rate is not chosen), and diverged.json keeps why, so that a resumed sweep does not retry it.
    `count`: where the run stands in the grid ("run 13 of 48"), for the log."""
    summary = _finished(Path(r.out))
    if summary is None:
        budget = f"{r.epochs:g} epoch(s)" if r.epochs else f"{r.tokens:,} tokens"
        logger.info(f"[scaling] {count + ': ' if count else ''}{r.out} (lr {r.lr:g}, {budget}) ...")
        try:
            summary, _ = pretrain(r, progress=progress)
        except TrainingDiverged as e:
            if not sweep:
                raise
            write_json(Path(r.out) / "diverged.json", {"lr": r.lr, "why": str(e)})
            return _finished(Path(r.out))
        if study:
            summary["provenance"] = {**summary["provenance"], "study": study}
            write_json(Path(r.out) / "summary.json", summary)
    return summary


def _finished(out: Path) -> dict | None:
    if (out / "diverged.json").is_file():
        return {"loss": {"validation": math.inf}, "diverged": json.loads((out / "diverged.json").read_text())["why"]}
    path = out / "summary.json"
    if path.is_file():
        summary = json.loads(path.read_text())
        if scored(summary):
            return summary
    return None


def scored(summary: dict) -> bool:
    """Whether a run's summary.json is the one pretrain's last phase writes (with the scores) rather than training's
    own, which comes first: only then has the run finished."""
    return "loss" in summary


def step_time_share(shape: Shape, tokenizer, args: ScalingArgs, device: torch.device) -> dict:
    """Seconds per training step (forward, backward, AdamW) of preproj+skip and of the plain model of the same
    shape, timed in alternating rounds in this one process; the modules' share is 1 - plain / adapted."""
    from ..methods.registry import build_method
    from ..training.schedule import make_optimizer

    models = {}
    for name in ("base", REFERENCE):
        model = build_method(build_model(shape, args.seq_len, tokenizer, 0, args.precision), name).requires_grad_(True)
        models[name] = (model.to(device).train(), make_optimizer(list(model.parameters()), 1e-4))
    ids = torch.randint(0, shape.vocab, (args.batch_size, args.seq_len), generator=torch.Generator().manual_seed(0))
    ids = ids.to(device)

    def step(name: str) -> float:
        model, optimizer = models[name]
        start = time.perf_counter()
        with compute_context(args.precision, device):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    times = {name: [] for name in models}
    for name in models:
        step(name)  # warm-up
    for _ in range(args.timing_rounds):
        for name in models:
            times[name].append(statistics.median(step(name) for _ in range(3)))
    plain, adapted = statistics.median(times["base"]), statistics.median(times[REFERENCE])
    return {"plain_step_seconds": plain, "adapted_step_seconds": adapted, "modules_share": 1 - plain / adapted}


def run_scaling(args: ScalingArgs, progress: bool = True, study: dict | None = None) -> dict:
    """Run or resume the grid (or only rewrite its report); `study`: the study file's record, kept in every run it
    finishes."""
    from transformers import AutoTokenizer

    from ..runtime.precision import precision as as_precision
    from ..runtime.precision import resolve_device

    if args.report_only:
        return report_again(Path(args.out))
    sizes, variants, rates = parse_sizes(args.sizes), parse_variants(args.variants), parse_lrs(args.lrs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plan = analysis_plan(out, variants)
    device = resolve_device(args.device)
    args = replace(args, precision=as_precision(args.precision, device).name)
    start = time.monotonic()

    # --- setup: one tokenizer for every run ---
    text = args.task == "text"
    if text and not (out / "tokenizer" / "tokenizer.json").is_file():
        texts, _, _ = training_corpus(args.data, resolve_data_dir(args.data_dir))
        make_tokenizer(args.tokenizer, texts).save_pretrained(out / "tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(out / "tokenizer") if text else None

    # --- fit: per variant its sweep (when asked) and its runs, skipping finished ones and resuming the rest ---
    shapes = {(f"{size[0]}x{size[1]}", variant): shape_of(run_args(args, size, variant, 0), len(tokenizer)) if text
              else vision_shape(run_args(args, size, variant, 0)) for size in sizes for variant in variants}
    shared = {(key, variant): _shares_runs_with(key, variant, variants, shapes) for key, variant in shapes}
    total = sum(same is None for same in shared.values()) * (len(rates) * args.sweep_seeds + args.seeds)
    count = (f"run {i} of {total}" for i in itertools.count(1))
    runs, sweeps = {}, {}
    for size in sizes:
        key = f"{size[0]}x{size[1]}"
        for variant in variants:
            same = shared[key, variant]
            if same is not None:
                logger.info(f"[scaling] {key} {variant} is the same model as {same} (same width); its runs are shared")
                runs[key, variant], sweeps[key, variant] = runs[key, same], sweeps.get((key, same))
                continue
            lr = args.lr
            if rates:
                swept = {r: [_run(run_args(args, size, variant, seed, r, sweep=True), progress, study, sweep=True,
                                  count=next(count)) for seed in range(args.sweep_seeds)] for r in rates}
                lr = min(rates, key=lambda r: statistics.mean(s["loss"]["validation"] for s in swept[r]))
                sweeps[key, variant] = {f"{r:g}": [s["loss"]["validation"] if "diverged" not in s else None
                                                   for s in runs_at] for r, runs_at in swept.items()}  # None: diverged
                logger.info(f"[scaling] {key} {variant}: lr {lr:g} (sweep: {sweeps[key, variant]})")
            runs[key, variant] = [_run(run_args(args, size, variant, seed, lr), progress, study, count=next(count))
                                  for seed in range(args.seeds)]
            _write_results(out, args, runs, shapes, {}, start, sweeps, plan)

    # --- validate: timing, paired differences, report and plots ---
    timing = {}
    for size in sizes if text else ():  # the side-by-side timing is of text models
        key = f"{size[0]}x{size[1]}"
        timing[key] = step_time_share(shapes[key, REFERENCE], tokenizer, args, device)
    results = _write_results(out, args, runs, shapes, timing, start, sweeps, plan)
    write_report(out, results)
    return results


def write_report(out: Path, results: dict) -> None:
    plots(out, results)
    atomic_write(out / "report.md", lambda tmp: Path(tmp).write_text(report_markdown(results)))


def report_again(out: Path) -> dict:
    """results.json's comparisons recomputed under OUT/analysis_plan.json (or, where a grid has none, the default
    plan, recorded as applied after the runs), and the report rewritten; nothing is trained or timed."""
    path = out / "results.json"
    if not path.is_file():
        raise ValueError(f"{path} does not exist: --report-only rewrites the report of a grid that has run.")
    results = json.loads(path.read_text())
    variants = list(dict.fromkeys(v for e in results["sizes"].values() for v in e["variants"]))
    if (out / "analysis_plan.json").is_file():
        plan = json.loads((out / "analysis_plan.json").read_text())
    else:
        plan = {**default_plan(variants), "declared": "the default plan, applied after the runs"}
    for entry in results["sizes"].values():
        entry["paired"] = {}
    results.update(plan=plan, comparisons=paired_by_plan(results["sizes"], plan))
    write_json(path, results)
    write_report(out, results)
    return results


def _write_results(out: Path, args: ScalingArgs, runs: dict, shapes: dict, timing: dict, start: float,
                   sweeps: dict, plan: dict) -> dict:
    sizes, text = {}, args.task == "text"
    for (key, variant), summaries in runs.items():
        shape = shapes[key, variant]
        method = variant.partition("@")[0]
        entry = sizes.setdefault(key, {"variants": {}, "paired": {}, "timing": timing.get(key)})
        entry["variants"][variant] = {
            "shape": asdict(shape), "params": count_params(shape, method) if text else summaries[0]["params"],
            "train_flops_per_token": train_flops_per_token(shape, method, args.seq_len) if text
            else summaries[0]["train_flops_per_token"],
            "seeds": len(summaries),
            "test_loss": [s["loss"]["test"] for s in summaries if "test" in s["loss"]],
            "validation_loss": [s["loss"]["validation"] for s in summaries],
            "curves": [[(x["tokens"], x["heldout_loss"]) for x in _log(s)] for s in summaries],
            "skip_norms": [s.get("skip_norms") for s in summaries],
            "tokens_per_second": [s["tokens_per_second"] for s in summaries],
            "samples": summaries[0].get("samples") if summaries else None,
            "lr": summaries[0]["pretrain"]["lr"] if summaries else None,
            "sweep": sweeps.get((key, variant)),
            "first_token_attention": [s.get("first_token_attention") for s in summaries],
        }
        if not text:  # per-item files to compare on, accuracy, and the position-shuffle probe
            entry["variants"][variant].update(
                task=args.task.replace("-", "_"), items=[s["pretrain"]["out"] for s in summaries],
                test_accuracy=[s["accuracy"]["test"] for s in summaries if "accuracy" in s],
                shuffled_test_loss=[s["loss"]["test_shuffled"] for s in summaries],
                shuffled_test_accuracy=[s["accuracy"]["test_shuffled"] for s in summaries if "accuracy" in s],
                attention_distance=[s["attention"]["distance"] for s in summaries],
                attention_received=[s["attention"].get("received") for s in summaries],
                uniform_attention_distance=summaries[0]["attention"]["uniform_distance"])
    compared = paired_by_plan(sizes, plan)
    results = {"args": asdict(args), "plan": plan, "sizes": sizes, "comparisons": compared,
               "wall_seconds": time.monotonic() - start}
    write_json(out / "results.json", results)
    return results


def _log(summary: dict) -> list[dict]:
    path = Path(summary["pretrain"]["out"]) / "train_log.jsonl"
    return [x for x in read_jsonl(path) if "heldout_loss" in x]
