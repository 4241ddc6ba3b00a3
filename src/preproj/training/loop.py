"""`preproj train`: the frozen probe. Base frozen, only the new parameters learn (docs/method.md: the frozen probe).

A plain loop, nanoGPT-style, in four phases read top to bottom: setup (model, method, data, optimizer, checkpoint),
fit (AdamW, cosine schedule with linear warmup, gradient accumulation, checkpoints), validate (held-out loss at
intervals) and finish (the adapter's files and summary.json). A killed run resumes from its checkpoint bit for bit:
the data order is a pure function of seed and step, so there is no iterator state to save.

The same loop runs in one process or in several under torchrun (`--strategy ddp` or `fsdp`): each process takes
its slice of the global batch that one process would take, the loss of every slice is weighted by its share of the
global batch's targets, and rank 0 alone writes files. The strategy object holds everything that differs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from ..core.attach import skip_norms
from ..core.compiling import compiled_blocks, wants_compile
from ..methods.registry import build_method, method, save_method, save_model_dir
from ..runtime import distributed as ddist
from ..runtime.files import write_json
from ..runtime.loading import load_model, model_max_length
from ..runtime.precision import (
    AUTO,
    Bf16MatmulsInFloat32,
    Precision,
    check_weights_dtype,
    compute_context,
    resolve_device,
)
from ..runtime.precision import precision as as_precision
from ..runtime.provenance import provenance
from ..runtime.tracking import Trackers, parse_report_to
from ..runtime.validation import check_within_context
from . import checkpointer
from .args import TrainArgs, check_same_run, check_train_args
from .audit import Bf16Audit
from .schedule import batch_indices, lr_at, make_optimizer
from .signals import StopRequests, TrainingInterrupted
from .strategy import Strategy, strategy_for
from .windows import read_text_data

logger = logging.getLogger(__name__)


class TrainingDiverged(RuntimeError):
    """A NaN or inf loss; the last good checkpoint is left in place."""


@dataclass
class Run:
    """What the phases share: the run's arguments and place, the model in its three views (as built, the base
    inside it, wrapped with its loss for the strategy), the data as token tensors, and the log so far."""

    args: TrainArgs
    out: Path
    device: torch.device
    precision: Precision
    strategy: Strategy
    model: nn.Module
    base: nn.Module
    wrapped: nn.Module
    params: dict[str, torch.Tensor]
    optimizer: torch.optim.Optimizer
    data: dict[str, torch.Tensor]
    data_description: str
    config: dict
    step: int = 0
    log: list[dict] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    """Each optimizer step's seconds in this process, held-out evaluations left out."""
    trackers: Trackers | None = None
    audit: Bf16Audit | None = None
    on_record: Callable[[dict], None] | None = None

    @property
    def checkpoint(self) -> Path:
        return self.out / "checkpoint"

    @property
    def tokens_per_step(self) -> int:
        a = self.args
        return a.batch_size * self.strategy.ranks.world_size * a.grad_accum * a.seq_len

    @property
    def has_skip(self) -> bool:
        return method(self.args.method).has_skip


def train(args: TrainArgs, model=None, tokenizer=None, progress: bool = True,
          on_record: Callable[[dict], None] | None = None,
          data: tuple[dict[str, torch.Tensor], str] | None = None) -> tuple[dict, nn.Module]:
    """Run one frozen-probe training; returns (summary.json's contents, the trained model).

    Under torchrun every process calls this with the same arguments; the model returned is the
    unwrapped one (for FSDP, still sharded). OUT is owned by this run while it lasts (a second run on
    it is refused), and SIGINT or SIGTERM stop it after the current step with a checkpoint to resume.
    on_record sees each record as it enters train_log.jsonl (step 0's held-out loss first); an exception it raises
    ends the run there. data: (tensors, description) read by the caller instead of args.data's text, keyed as
    read_text_data keys them; a model that is not a causal LM (preproj.vision's) takes them as model(inputs, labels)
    and returns its loss."""
    check_train_args(args, reads_data=data is None)
    device = resolve_device(args.device)
    args = resolved_args(args, device, model)
    ddist.setup(device)
    out = Path(args.out)
    with ddist.owned(out, "preproj train", device), StopRequests() as stop, contextlib.ExitStack() as hold:
        if out.exists() and (out / "train_log.jsonl").exists() and not args.resume:
            raise ValueError(f"{out} already holds a run; pass --resume to continue it or choose another --out.")
        wall_start = time.monotonic()
        run = setup(args, model, tokenizer, device, data)
        run.on_record = on_record
        hold.enter_context(compiled_blocks(run.base, args.compile, device))
        start_or_resume(run, hold)
        fit(run, stop, progress)
        return finish(run, wall_start), run.model


def resolved_args(args: TrainArgs, device: torch.device, model: nn.Module | None = None) -> TrainArgs:
    """The arguments as the run records them in train_config.json: 'auto' precision and the default compile
    decided, once. 'auto' fits a model passed in (one loaded in float32 trains in bf16-mixed, not refused as
    bf16-frozen's), and a resumed run keeps the word its start resolved it to."""
    base_dtype = None if model is None else next(model.parameters()).dtype
    name = recorded_precision(Path(args.out)) if args.resume and args.precision == AUTO else None
    precision = as_precision(name or args.precision, device, frozen_base=not args.train_base, base_dtype=base_dtype)
    compiled = wants_compile(args.compile, device, bf16=precision.uses_bf16)
    return replace(args, precision=precision.name, compile=compiled)


def recorded_precision(out: Path) -> str | None:
    """The precision a run's train_config.json records (None for a run not started yet)."""
    try:
        return json.loads((out / "train_config.json").read_text()).get("precision")
    except (OSError, ValueError):
        return None


# --- setup ---------------------------------------------------------------------------------------

def setup(args: TrainArgs, model, tokenizer, device: torch.device, data=None) -> Run:
    """The model with its method attached and wrapped for the strategy, the data tokenized, the optimizer."""
    precision = as_precision(args.precision)
    if model is None:
        model, tokenizer = load_model(args.model, dtype=precision.weights, device=device)
    else:
        check_weights_dtype(model, precision)
        model.to(device)
    if tokenizer is not None:
        check_within_context("seq_len", args.seq_len, model_max_length(model, tokenizer))
    torch.manual_seed(args.seed)
    model = build_method(model, args.method, args.lora_rank, precision)
    if args.train_base:
        model.requires_grad_(True)
    model.to(device)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if args.activation_checkpointing:
        # The recomputation in backward runs outside the forward's context: it gets the emulation too.
        emulated = {"use_reentrant": False, "context_fn": lambda: (contextlib.nullcontext(), Bf16MatmulsInFloat32())}
        base.activation_checkpointing_enable(emulated if precision.emulates_bf16(device) else None)
    if args.attn_implementation is not None:
        base.set_attn_implementation(args.attn_implementation)
    model.train()
    n_trainable = sum(p.numel() for p in checkpointer.trainable(model).values())
    strategy = strategy_for(args.strategy, device)
    wrapped = strategy.wrap(model)
    params = checkpointer.trainable(wrapped)

    data, description = data or read_text_data(args, tokenizer, strategy.ranks.world_size)
    config = {**asdict(args), "world_size": strategy.ranks.world_size,
              "global_batch_size": args.batch_size * strategy.ranks.world_size, "trainable_params": n_trainable,
              "data_description": description, "provenance": provenance()}
    return Run(args=args, out=Path(args.out), device=device, precision=precision, strategy=strategy, model=model,
               base=base, wrapped=wrapped, params=params,
               optimizer=make_optimizer(list(params.values()), args.lr, args.weight_decay), data=data,
               data_description=description, config=config,
               audit=Bf16Audit(params, method(args.method).trains, strategy.local, strategy.sum)
               if precision.name == "bf16-true" else None)


def start_or_resume(run: Run, hold: contextlib.ExitStack) -> None:
    """From the checkpoint when resuming one (with the recorded arguments only), else from step 0 with its held-out
    loss; train_config.json is written once, as it describes every step; trackers are opened."""
    args, is_main = run.args, run.strategy.ranks.is_main
    continuing = args.resume and checkpointer.exists(run.checkpoint)
    if continuing:
        check_same_run(run.out / "train_config.json", args)
    if is_main and not (continuing and (run.out / "train_config.json").is_file()):
        write_json(run.out / "train_config.json", run.config)
    if continuing:
        run.step, run.log = run.strategy.load_checkpoint(run.checkpoint, run.wrapped, run.optimizer)
        if is_main:
            logger.info("resumed from %s at step %d", run.checkpoint, run.step)
    else:
        run.log = [{"step": 0, "tokens": 0, "heldout_loss": validate(run)}]
        if run.on_record:
            run.on_record(run.log[0])
    if is_main:  # drop lines written after the checkpoint
        (run.out / "train_log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in run.log))
    tracked = parse_report_to(args.report_to)
    if is_main and tracked:
        run.trackers = Trackers(tracked, run.out, run.config, run_name=f"{args.method}-seed{args.seed}")
        hold.callback(run.trackers.close)
        if run.step == 0:
            run.trackers.log(run.log[0], 0)


# --- fit -----------------------------------------------------------------------------------------

def fit(run: Run, stop: StopRequests, progress: bool) -> None:
    """Optimizer steps up to args.steps: the held-out loss every eval_every steps, a checkpoint every save_every
    steps and when a stop is requested (the run then ends with TrainingInterrupted)."""
    args = run.args
    bar = tqdm(total=args.steps, initial=run.step, desc=f"train {args.method}",
               disable=not (progress and run.strategy.ranks.is_main))
    # Throughput counts the steps this process ran and their time alone: held-out evaluations are left out, so a
    # resumed run that has a few steps and a final evaluation left reports the speed of its steps.
    loop_start, loop_start_step, evaluating = time.monotonic(), run.step, 0.0
    # Training seconds carry over a resume in the log, so a run stopped and resumed reports its whole time;
    # a checkpoint written before the log kept them leaves the total unknown.
    seconds_before = 0.0 if run.step == 0 else run.log[-1].get("seconds")
    with bar:  # closed however the loop ends, before the command line says why
        while run.step < args.steps:
            step_start = time.monotonic()
            loss = optimizer_step(run)
            run.step_seconds.append(time.monotonic() - step_start)
            stepping = time.monotonic() - loop_start - evaluating
            record = {"step": run.step, "loss": loss, "lr": run.optimizer.param_groups[0]["lr"],
                      "tokens": run.step * run.tokens_per_step,
                      "tokens_per_second": (run.step - loop_start_step) * run.tokens_per_step / max(stepping, 1e-9)}
            if run.step % args.eval_every == 0 or run.step == args.steps:
                t0 = time.monotonic()
                record["heldout_loss"] = validate(run)
                evaluating += time.monotonic() - t0
            if seconds_before is not None:
                record["seconds"] = seconds_before + time.monotonic() - loop_start
            log_step(run, record)
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{record['tokens_per_second']:.0f}")
            bar.update(1)
            stopping = stop.requested()
            if run.step % args.save_every == 0 or run.step == args.steps or stopping:
                run.strategy.save_checkpoint(run.checkpoint, run.wrapped, run.optimizer, run.step, run.log)
            if stopping and run.step < args.steps:
                raise TrainingInterrupted(stopping, run.step, run.checkpoint)


def optimizer_step(run: Run) -> float:
    """One optimizer step over grad_accum micro-batches; returns the step's training loss (mean over processes)."""
    args, strategy, device = run.args, run.strategy, run.device
    ranks = strategy.ranks
    ids, labels = run.data["ids"], run.data["labels"]
    for group in run.optimizer.param_groups:
        group["lr"] = lr_at(run.step, args)
    loss_sum = 0.0
    for micro in range(args.grad_accum):
        idx = torch.from_numpy(batch_indices(run.step, micro, len(ids), args, ranks.world_size, ranks.rank))
        x, y = ids[idx].to(device), labels[idx].to(device)
        # Weight this slice by its share of the global batch's targets (DDP and FSDP average over
        # processes), so the gradient is the one of a single process at the global batch size.
        n_local = _targets(labels[idx])
        (n_global,) = strategy.sum([n_local])
        weight = n_local * ranks.world_size / n_global / args.grad_accum
        with strategy.accumulating(run.wrapped, last_micro=micro == args.grad_accum - 1):
            with compute_context(args.precision, device):
                loss = run.wrapped(x, y) * weight
            (reported,) = strategy.sum([float(loss.detach())])
            reported /= ranks.world_size
            if not math.isfinite(reported):
                raise TrainingDiverged(
                    f"Loss became {reported} at step {run.step + 1}; stopped. The last good checkpoint is in "
                    f"{run.checkpoint}. Lower --lr, or use --precision bf16-mixed or fp32.")
            loss.backward()
        loss_sum += reported
    if args.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(list(run.params.values()), args.max_grad_norm)
    if run.audit:
        run.audit.before()
    run.optimizer.step()
    if run.audit:
        run.audit.after()
    run.optimizer.zero_grad(set_to_none=True)
    run.step += 1
    return loss_sum


def log_step(run: Run, record: dict) -> None:
    """The step's record into the log, train_log.jsonl and the trackers (with the skip norms by layer)."""
    run.log.append(record)
    if run.strategy.ranks.is_main:
        with open(run.out / "train_log.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
    if run.on_record:
        run.on_record(record)
    if run.trackers is not None:
        tracked_norms = run.has_skip and not run.strategy.sharded
        norms = {f"skip_norm/layer_{i}": v for i, v in enumerate(skip_norms(run.base))} if tracked_norms else {}
        run.trackers.log({**record, **norms}, run.step)


def step_times(seconds: list[float]) -> dict:
    """The first step's seconds (this process's first) and the median of the others'."""
    if not seconds:
        return {}
    return {"first_step_seconds": seconds[0], "median_step_seconds": statistics.median(seconds[1:] or seconds)}


def _targets(labels: torch.Tensor) -> int:
    """What a batch's loss is the mean over: next-token targets of text, or its examples where each has one label or
    as many targets as the others (images, clips)."""
    if labels.ndim == 2 and not labels.is_floating_point():
        return int((labels[:, 1:] != -100).sum())
    return len(labels)


# --- validate ------------------------------------------------------------------------------------

@torch.no_grad()
def validate(run: Run) -> float:
    """Mean loss per target over the held-out examples, each process scoring its share (summed over processes)."""
    args, strategy, device = run.args, run.strategy, run.device
    ids, labels = run.data["held_ids"], run.data["held_labels"]
    ranks, wrapped = strategy.ranks, run.wrapped
    was = wrapped.training
    wrapped.eval()
    mine = list(range(ranks.rank, len(ids), ranks.world_size))
    calls = math.ceil(math.ceil(len(ids) / ranks.world_size) / args.batch_size)  # the same on every process (FSDP)
    total, count = 0.0, 0
    for c in range(calls):
        rows = mine[c * args.batch_size : (c + 1) * args.batch_size]
        weight = 1.0 if rows else 0.0
        rows = rows or [0]  # a process with nothing left joins the collective on a dummy batch
        x, y = ids[rows].to(device), labels[rows].to(device)
        with compute_context(args.precision, device):
            loss = wrapped(x, y)
        n = _targets(labels[rows]) * weight
        total, count = total + float(loss) * n, count + n
    wrapped.train(was)
    total, count = strategy.sum([total, count])
    return total / max(count, 1)


# --- finish --------------------------------------------------------------------------------------

def finish(run: Run, wall_start: float) -> dict:
    """The adapter in its usual two files (gathered whole), and summary.json; returns the summary."""
    args, log, strategy = run.args, run.log, run.strategy
    whole_state = strategy.whole_state_dict(run.base) if args.train_base else None
    with strategy.unsharded(run.wrapped):
        norms = skip_norms(run.base) if run.has_skip else None
        if strategy.ranks.is_main:
            if args.train_base:
                save_model_dir(run.model, args.method, run.out, whole_state)
            else:
                save_method(run.model, args.method, run.out)
    heldout = [x["heldout_loss"] for x in log if "heldout_loss" in x]
    summary = {
        "model": args.model, "method": args.method, "steps": args.steps,
        "tokens_seen": args.steps * run.tokens_per_step,
        "trainable_params": run.config["trainable_params"],
        "tokens_per_second": log[-1].get("tokens_per_second"),
        "final_train_loss": log[-1].get("loss"),
        "initial_heldout_loss": heldout[0],
        "final_heldout_loss": heldout[-1],
        "skip_norms": norms,
        "wall_seconds": time.monotonic() - wall_start,
        "train_seconds": log[-1].get("seconds"),
        # A compiled run's first step includes the compile (less when inductor's cache has it): set against the
        # typical step, the compile is in plain view.
        "compiled": args.compile, **step_times(run.step_seconds),
        "precision": run.precision.name, "device": str(run.device), "world_size": strategy.ranks.world_size,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # which kernels: another set rounds otherwise
        "strategy": args.strategy, "data": run.data_description,
        "provenance": provenance(),  # of the process that finished the run (train_config.json: the one that began it)
    }
    if run.audit:
        summary["bf16_erased_update_fraction"], summary["bf16_erased_update_fraction_by_module"] = run.audit.fractions()
    if run.device.type == "cuda":
        summary["peak_gpu_memory_bytes"] = torch.cuda.max_memory_allocated(run.device)
    if strategy.ranks.is_main:
        write_json(run.out / "summary.json", summary)
    ddist.barrier()
    return summary
