"""`preproj train`: the frozen probe. Base frozen, only the new parameters learn (PAPER.md §2).

A plain loop, nanoGPT-style, that reads as setup, fit, summary: AdamW, cosine schedule with linear
warmup, gradient accumulation, optional activation checkpointing, held-out loss at intervals, and
atomic checkpoints that a killed run resumes from bit for bit (the data order is a pure function of
seed and step, so there is no iterator state to save).

The same loop runs in one process or in several under torchrun (`--strategy ddp` or `fsdp`): each
process takes its slice of the global batch that one process would take, the loss of every slice
is weighted by its share of the global batch's targets, and rank 0 alone writes files.
"""

from __future__ import annotations

import contextlib
import json
import math
import shlex
import shutil
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from . import data as datasets
from . import distributed as ddist
from .attach import skip_norms
from .files import atomic_write, write_json
from .tracking import Trackers, parse_report_to
from .methods import TRAINED_METHODS, build_method, save_method, save_model_dir
from .precision import Bf16MatmulsInFloat32, check_weights_dtype, resolve_device, rng_state, set_rng_state
from .precision import precision as as_precision
from .validation import check_args, check_within_context

METHODS = TRAINED_METHODS


@dataclass
class TrainArgs:
    """Arguments of `preproj train`."""

    model: str = "smollm2-135m"
    """Embedded name, Hugging Face hub id or local directory."""
    method: str = "preproj+skip"
    """preproj, skip, preproj+skip (ours); lora, preproj+lora (baselines through PEFT)."""
    out: str = "runs/preproj+skip"
    """Output directory: adapter, config, train_log.jsonl, summary.json, checkpoint/."""
    data: str = "wikitext2"
    """wikitext2 (offline: raw valid, test held out), wikitext2-train (the tokenized train split, raw valid held out),
    wikitext103 (Hub), tinystories, or a text file."""
    data_dir: str | None = None
    """Directory laid out as ../shared/data; default $PREPROJ_DATA_DIR."""
    lines: int | None = None
    """Use only the first N training lines longer than 50 characters (the paper: 2000)."""
    packing: str = "pack"
    """'pack' (token stream cut into seq_len windows) or 'lines' (one padded line per example, the paper's)."""
    steps: int = 100
    """Optimizer steps."""
    batch_size: int = 4
    """Sequences per micro-batch."""
    grad_accum: int = 1
    """Micro-batches per optimizer step."""
    seq_len: int = 256
    """Tokens per sequence."""
    lr: float = 1e-3
    """Peak learning rate (the paper: 1e-5 in pure bf16)."""
    warmup: int = 10
    """Linear warmup steps before the cosine decay."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this (0 = no clipping)."""
    seed: int = 42
    """Seed of the adapter's initialisation and of the data order."""
    precision: str = "auto"
    """auto (bf16-mixed where bf16 matmuls are native, else fp32), fp32, bf16-mixed (bf16 autocast, fp32 weights and
    masters), bf16-true (pure bf16 as in the paper, with an
    audit of updates that rounding erased) or bf16-frozen (bf16 base, fp32 adapter masters, bf16 autocast)."""
    device: str = "auto"
    """auto (CUDA when present, else CPU), cpu, cuda, cuda:N or mps. Under torchrun, each process's own GPU."""
    strategy: str = "ddp"
    """With several processes (torchrun): ddp (frozen base replicated, adapter gradients all-reduced) or fsdp
    (FSDP2: base and adapter sharded, sharded checkpoints)."""
    nproc: int = 1
    """Launch this many processes on this machine with torchrun (1: train in this process)."""
    report_to: str = "none"
    """Experiment trackers, comma-separated: none, tensorboard (OUT/tensorboard), wandb, trackio. They get loss,
    held-out loss, learning rate, tokens/s and skip norms by layer at every step; train_log.jsonl is always written."""
    activation_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, ~30% more compute)."""
    attn_implementation: str | None = None
    """'sdpa' or 'eager' attention while training; default: the model's own (sdpa). Under bf16 autocast eager
    rounds attention scores to bf16, and its memory grows with the square of the sequence length;
    benchmarks/run.py times both on your machine."""
    lora_rank: str | None = None
    """LoRA rank: a number, 'paper' (the author's formula, floor(1.25 d) / 2: 480 for Pythia-160M) or unset (method
    lora: matched to preproj+skip's trainable count within 1%; preproj+lora: 64)."""
    eval_every: int = 25
    """Held-out loss every N steps (and at the end)."""
    eval_batches: int = 4
    """Global micro-batches (batch_size x processes sequences each) of held-out text per held-out loss."""
    save_every: int = 25
    """Checkpoint every N steps (atomic; the last good one is kept)."""
    resume: bool = False
    """Continue from OUT/checkpoint if present."""
    train_base: bool = False
    """Train every weight, the base's too (what `preproj pretrain` sets); the result is then a model directory
    with the method's files in OUT/adapter."""


# Arguments a resumed run may change: where things are (a run directory may move) and what is logged, never what is
# computed.
RESUME_MAY_CHANGE = ("out", "resume", "report_to", "eval_every", "save_every", "data_dir", "device", "nproc")


def check_same_run(recorded_path: Path, args) -> None:
    """Refuse to resume a run with arguments that differ from those it was started with (train_config.json), naming
    every changed field; RESUME_MAY_CHANGE lists the ones that cannot change the result."""
    if not recorded_path.is_file():
        return
    recorded = json.loads(recorded_path.read_text())
    changed = [f"{k} {recorded[k]!r} -> {v!r}" for k, v in asdict(args).items()
               if k not in RESUME_MAY_CHANGE and k in recorded and recorded[k] != v]
    if changed:
        raise ValueError(f"{recorded_path.parent} was started with other arguments ({'; '.join(changed)}); resume it with "
                         "the recorded ones (train_config.json), or start afresh with another --out.")


class TrainingDiverged(RuntimeError):
    """A NaN or inf loss; the last good checkpoint is left in place."""


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed from: unreadable, or written by another run."""


def lr_at(step: int, args: TrainArgs) -> float:
    """Linear warmup to args.lr, then cosine decay to 0 at args.steps."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def batch_indices(step: int, micro: int, n_examples: int, args: TrainArgs, world_size: int = 1, rank: int = 0) -> np.ndarray:
    """Example indices of (step, micro) for this process: its slice of the global batch (batch_size x
    world_size) that one process at that batch size would take. A fresh permutation per epoch, a pure
    function of the seed."""
    global_batch = args.batch_size * world_size
    start = (step * args.grad_accum + micro) * global_batch + rank * args.batch_size
    picks = []
    for k in range(start, start + args.batch_size):
        epoch, pos = divmod(k, n_examples)
        picks.append(np.random.default_rng([args.seed, epoch]).permutation(n_examples)[pos])
    return np.array(picks)


def make_optimizer(params: list[torch.Tensor], lr: float, weight_decay: float = 0.0) -> torch.optim.AdamW:
    """AdamW over the adapter; the fused kernel where torch has one (on CPU it is ~7x faster than foreach)."""
    fused = all(p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused)


def compute_context_for(precision: str, device: torch.device | str):
    """Where a forward runs under a precision word on `device`: its autocast, and bf16 matmuls in float32 on a
    CPU without native bf16 (precision.py holds the vocabulary)."""
    return as_precision(precision).compute_context(device)


def _trainable(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def _targets(labels: torch.Tensor) -> int:
    return int((labels[:, 1:] != -100).sum())


# --- checkpoints ---------------------------------------------------------------------------------
# One process or DDP: OUT/checkpoint/state.pt, written by rank 0. FSDP: OUT/checkpoint/ is a
# torch.distributed.checkpoint directory of shards, swapped in whole once every shard is written.

def save_checkpoint(path: Path, wrapped: nn.Module, optimizer, step: int, log_tail: list[dict], device: torch.device) -> None:
    """Adapter weights, optimizer state, step and RNG state, written atomically; the previous one stays
    until the new one is complete. torch.save holds the optimizer's nested state; it is read back with
    weights_only=True, which refuses anything but tensors and plain containers."""
    r = ddist.ranks()
    if ddist.is_sharded(wrapped):
        _save_sharded(path, wrapped, optimizer, step, log_tail, device)
        return
    if r.is_main:
        state = {
            "step": step,
            "params": {n: p.detach().clone() for n, p in _trainable(ddist.unwrap(wrapped)).items()},
            "optimizer": optimizer.state_dict(),
            "rng": rng_state(device),
            "log_tail": json.dumps(log_tail),
        }
        path.mkdir(parents=True, exist_ok=True)
        atomic_write(path / "state.pt", lambda tmp: torch.save(state, tmp))
    ddist.barrier()


def _save_sharded(path: Path, wrapped, optimizer, step: int, log_tail: list[dict], device: torch.device) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    r = ddist.ranks()
    model_state, optim_state = get_state_dict(wrapped, optimizer, options=StateDictOptions(ignore_frozen_params=True))
    fresh, old = path.with_name(path.name + ".next"), path.with_name(path.name + ".old")
    if r.is_main:
        shutil.rmtree(fresh, ignore_errors=True)
    ddist.barrier()
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(fresh))
    if r.is_main:
        torch.save({"step": step, "rng": rng_state(device), "log_tail": json.dumps(log_tail)}, fresh / "meta.pt")
        shutil.rmtree(old, ignore_errors=True)
        if path.exists():
            path.rename(old)
        fresh.rename(path)
        shutil.rmtree(old, ignore_errors=True)
    ddist.barrier()


def checkpoint_exists(path: Path) -> bool:
    old = path.with_name(path.name + ".old")
    if not path.exists() and old.exists():  # killed between the two renames of a sharded save
        old.rename(path)
    return (path / "state.pt").is_file() or (path / "meta.pt").is_file()


def load_checkpoint(path: Path, wrapped: nn.Module, optimizer, device: torch.device) -> tuple[int, list[dict]]:
    if ddist.is_sharded(wrapped) != (path / "meta.pt").is_file():
        raise CheckpointError(f"Checkpoint {path} was written with another --strategy; resume with the same strategy.")
    if ddist.is_sharded(wrapped):
        return _load_sharded(path, wrapped, optimizer, device)
    try:
        state = torch.load(path / "state.pt", weights_only=True, map_location=device)
    except Exception as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"Checkpoint {path / 'state.pt'} could not be read ({reason}); delete {path} to start "
                              "over.") from None
    params = _trainable(ddist.unwrap(wrapped))
    if not isinstance(state, dict) or set(state.get("params", {})) != set(params):
        raise CheckpointError(f"Checkpoint {path} was written for another method or model; use a new --out or drop "
                              "--resume.")
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(state["params"][n])
    optimizer.load_state_dict(state["optimizer"])
    _restore_rng(state, device)
    return int(state["step"]), json.loads(state["log_tail"])


def _load_sharded(path: Path, wrapped, optimizer, device: torch.device) -> tuple[int, list[dict]]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    options = StateDictOptions(ignore_frozen_params=True, strict=False)  # the frozen base is not in a checkpoint
    model_state, optim_state = get_state_dict(wrapped, optimizer, options=options)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(wrapped, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=options)
    meta = torch.load(path / "meta.pt", weights_only=True)
    _restore_rng(meta, device)
    return int(meta["step"]), json.loads(meta["log_tail"])


def _restore_rng(state: dict, device: torch.device) -> None:
    rng = state.get("rng") or {"cpu": state["torch_rng"]}  # checkpoints before the CUDA state was kept
    set_rng_state({k: v.cpu() for k, v in rng.items()}, device)  # RNG states are host byte tensors


# --- the loop ------------------------------------------------------------------------------------

@torch.no_grad()
def heldout_loss(wrapped: nn.Module, ids: torch.Tensor, labels: torch.Tensor, args: TrainArgs, device: torch.device) -> float:
    """Mean loss per target over the held-out examples, each process scoring its share (all-reduced)."""
    r = ddist.ranks()
    was = wrapped.training
    wrapped.eval()
    mine = list(range(r.rank, len(ids), r.world_size))
    calls = math.ceil(math.ceil(len(ids) / r.world_size) / args.batch_size)  # the same on every process (FSDP needs it)
    total, count = 0.0, 0
    for c in range(calls):
        rows = mine[c * args.batch_size : (c + 1) * args.batch_size]
        weight = 1.0 if rows else 0.0
        rows = rows or [0]  # a process with nothing left joins the collective on a dummy batch
        x, y = ids[rows].to(device), labels[rows].to(device)
        with compute_context_for(args.precision, device):
            loss = wrapped(x, y)
        n = _targets(labels[rows]) * weight
        total, count = total + float(loss) * n, count + n
    wrapped.train(was)
    total, count = ddist.sum_across([total, count], device)
    return total / max(count, 1)


def _check_args(args: TrainArgs) -> None:
    check_args(args)
    as_precision(args.precision)
    if args.method not in METHODS and not (args.train_base and args.method == "base"):
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {args.method!r}.")
    if args.attn_implementation not in (None, "sdpa", "eager"):
        raise ValueError(f"attn_implementation must be 'sdpa' or 'eager', got {args.attn_implementation!r}.")
    if args.strategy not in ddist.STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(ddist.STRATEGIES)}, got {args.strategy!r}.")
    parse_report_to(args.report_to)
    rank = "" if args.lora_rank is None else str(args.lora_rank)
    if args.lora_rank is not None and rank != "paper" and not (rank.isdigit() and int(rank) >= 1):
        raise ValueError(f"--lora-rank must be a positive integer or 'paper', got {args.lora_rank!r}.")
    if args.packing not in ("pack", "lines"):
        raise ValueError(f"packing must be 'pack' or 'lines', got {args.packing!r}.")


def train(args: TrainArgs, model=None, tokenizer=None, progress: bool = True) -> tuple[dict, nn.Module]:
    """Run one frozen-probe training; returns (summary.json's contents, the trained model).

    Under torchrun every process calls this with the same arguments; the model returned is the
    unwrapped one (for FSDP, still sharded). OUT is owned by this run while it lasts (a second run on
    it is refused), and SIGINT or SIGTERM stop it after the current step with a checkpoint to resume."""
    _check_args(args)
    device = resolve_device(args.device)
    args = replace(args, precision=as_precision(args.precision, device).name)  # 'auto' resolved once, and recorded
    r = ddist.setup(device)
    out = Path(args.out)
    with ddist.owned(out, "preproj train", device), _StopRequests() as stop, contextlib.ExitStack() as hold:
        if out.exists() and (out / "train_log.jsonl").exists() and not args.resume:
            raise ValueError(f"{out} already holds a run; pass --resume to continue it or choose another --out.")
        return _train(args, model, tokenizer, progress, device, r, stop, hold)


def _train(args: TrainArgs, model, tokenizer, progress: bool, device: torch.device, r: ddist.Ranks, stop,
           hold: contextlib.ExitStack) -> tuple[dict, nn.Module]:
    from .evaluation import model_max_length
    from .loading import load_model

    # --- setup: model, method, data, optimizer, checkpoint ---
    precision = as_precision(args.precision)
    out = Path(args.out)
    ckpt = out / "checkpoint"
    wall_start = time.monotonic()
    if model is None:
        model, tokenizer = load_model(args.model, dtype=precision.weights, device=device)
    else:
        check_weights_dtype(model, precision)
        model.to(device)
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
    n_trainable = sum(p.numel() for p in _trainable(model).values())
    wrapped = ddist.wrap(model, args.strategy, device)
    params = _trainable(wrapped)

    data_dir = datasets.resolve_data_dir(args.data_dir)
    train_lines, held_lines, data_desc = datasets.training_corpus(args.data, data_dir, lines=args.lines)
    if r.is_main and progress:
        print(f"data: {data_desc}", flush=True)  # what was kept, dropped and held out, before any step
    ids, labels = datasets.tokenize_examples(train_lines, tokenizer, args.seq_len, args.packing)
    held_ids, held_labels = datasets.tokenize_examples(held_lines, tokenizer, args.seq_len, args.packing,
                                                       max_examples=args.eval_batches * args.batch_size * r.world_size)

    optimizer = make_optimizer(list(params.values()), args.lr, args.weight_decay)
    config = {**asdict(args), "world_size": r.world_size, "global_batch_size": args.batch_size * r.world_size,
              "trainable_params": n_trainable, "data_description": data_desc}
    continuing = args.resume and checkpoint_exists(ckpt)
    if continuing:
        check_same_run(out / "train_config.json", args)
    if r.is_main and not (continuing and (out / "train_config.json").is_file()):  # written once: it describes every step
        write_json(out / "train_config.json", config)

    step, log = 0, []
    if continuing:
        step, log = load_checkpoint(ckpt, wrapped, optimizer, device)
        if r.is_main:
            print(f"resumed from {ckpt} at step {step}")
    else:
        log = [{"step": 0, "tokens": 0, "heldout_loss": heldout_loss(wrapped, held_ids, held_labels, args, device)}]
    log_path = out / "train_log.jsonl"
    if r.is_main:
        log_path.write_text("".join(json.dumps(x) + "\n" for x in log))  # drop lines written after the checkpoint
    trackers, tracked = None, parse_report_to(args.report_to)
    if r.is_main and tracked:
        trackers = Trackers(tracked, out, config, run_name=f"{args.method}-seed{args.seed}")
        hold.callback(trackers.close)
        if step == 0:
            trackers.log(log[0], 0)
    has_skip = args.method in ("skip", "preproj+skip")
    skip_tracked = trackers is not None and has_skip and not ddist.is_sharded(wrapped)

    # --- fit ---
    tokens_per_step = args.batch_size * r.world_size * args.grad_accum * args.seq_len
    audit = _Bf16Audit(params) if precision.name == "bf16-true" else None
    bar = tqdm(total=args.steps, initial=step, desc=f"train {args.method}", disable=not (progress and r.is_main))
    # Throughput counts the steps this process ran and their time alone: held-out evaluations are left out, so a
    # resumed run that has a few steps and a final evaluation left reports the speed of its steps.
    loop_start, loop_start_step, evaluating = time.monotonic(), step, 0.0
    # Training seconds carry over a resume in the log, so a run stopped and resumed reports its whole time;
    # a checkpoint written before the log kept them leaves the total unknown.
    seconds_before = 0.0 if step == 0 else log[-1].get("seconds")
    while step < args.steps:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args)
        loss_sum = 0.0
        for micro in range(args.grad_accum):
            idx = torch.from_numpy(batch_indices(step, micro, len(ids), args, r.world_size, r.rank))
            x, y = ids[idx].to(device), labels[idx].to(device)
            # Weight this slice by its share of the global batch's targets (DDP and FSDP average over
            # processes), so the gradient is the one of a single process at the global batch size.
            n_local = _targets(labels[idx])
            (n_global,) = ddist.sum_across([n_local], device)
            weight = n_local * r.world_size / n_global / args.grad_accum
            last = micro == args.grad_accum - 1
            with _maybe_no_sync(wrapped, last):
                with compute_context_for(args.precision, device):
                    loss = wrapped(x, y) * weight
                (reported,) = ddist.sum_across([float(loss.detach())], device)
                reported /= r.world_size
                if not math.isfinite(reported):
                    raise TrainingDiverged(
                        f"Loss became {reported} at step {step + 1}; stopped. The last good checkpoint is in {ckpt}. "
                        "Lower --lr, or use --precision bf16-mixed or fp32.")
                loss.backward()
            loss_sum += reported
        if args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(list(params.values()), args.max_grad_norm)
        if audit:
            audit.before()
        optimizer.step()
        if audit:
            audit.after()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        stepping = time.monotonic() - loop_start - evaluating
        record = {"step": step, "loss": loss_sum, "lr": optimizer.param_groups[0]["lr"], "tokens": step * tokens_per_step,
                  "tokens_per_second": (step - loop_start_step) * tokens_per_step / max(stepping, 1e-9)}
        if step % args.eval_every == 0 or step == args.steps:
            t0 = time.monotonic()
            record["heldout_loss"] = heldout_loss(wrapped, held_ids, held_labels, args, device)
            evaluating += time.monotonic() - t0
        if seconds_before is not None:
            record["seconds"] = seconds_before + time.monotonic() - loop_start
        log.append(record)
        if r.is_main:
            with open(log_path, "a") as f:
                f.write(json.dumps(record) + "\n")
        if trackers is not None:
            norms = {f"skip_norm/layer_{i}": v for i, v in enumerate(skip_norms(base))} if skip_tracked else {}
            trackers.log({**record, **norms}, step)
        bar.set_postfix(loss=f"{loss_sum:.3f}", tok_s=f"{record['tokens_per_second']:.0f}")
        bar.update(1)
        stopping = stop.requested()
        if step % args.save_every == 0 or step == args.steps or stopping:
            save_checkpoint(ckpt, wrapped, optimizer, step, log, device)
        if stopping and step < args.steps:
            bar.close()
            raise TrainingInterrupted(stopping, step, ckpt)
    bar.close()

    # --- summary: the adapter in its usual two files (unsharded), summary.json ---
    with ddist.unsharded(wrapped):
        norms = skip_norms(base) if has_skip else None
        if r.is_main:
            (save_model_dir if args.train_base else save_method)(model, args.method, out)
    heldout = [x["heldout_loss"] for x in log if "heldout_loss" in x]
    summary = {
        "model": args.model, "method": args.method, "steps": args.steps, "tokens_seen": args.steps * tokens_per_step,
        "trainable_params": n_trainable,
        "tokens_per_second": log[-1].get("tokens_per_second"),
        "final_train_loss": log[-1].get("loss"),
        "initial_heldout_loss": heldout[0],
        "final_heldout_loss": heldout[-1],
        "skip_norms": norms,
        "wall_seconds": time.monotonic() - wall_start,
        "train_seconds": log[-1].get("seconds"),
        "precision": precision.name, "device": str(device), "world_size": r.world_size, "strategy": args.strategy,
        "data": data_desc,
    }
    if audit:
        summary["bf16_erased_update_fraction"], summary["bf16_erased_update_fraction_by_module"] = audit.fractions(device)
    if device.type == "cuda":
        summary["peak_gpu_memory_bytes"] = torch.cuda.max_memory_allocated(device)
    if r.is_main:
        write_json(out / "summary.json", summary)
    ddist.barrier()
    return summary, model


class TrainingInterrupted(RuntimeError):
    """SIGINT or SIGTERM stopped the run after a step; a checkpoint of that step is written."""

    def __init__(self, signum: int, step: int, ckpt: Path):
        self.signal = signum
        # train and pretrain resume with --resume; compare and scaling resume every run with the same command.
        command = next((a for a in sys.argv[1:] if not a.startswith("-")), "")
        flag = [] if "--resume" in sys.argv or command in ("compare", "scaling") else ["--resume"]
        how = "the same command and --resume" if flag else "the same command"
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}; the checkpoint of that step is "
                         f"in {ckpt}. Continue with {how}: {shlex.join([*sys.argv, *flag])}")


class _StopRequests:
    """SIGINT and SIGTERM ask the loop to stop after the current step (a second one stops at once).

    Only the main thread can take signals; elsewhere the loop runs without this."""

    def __init__(self):
        self.signum, self._previous = None, {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signum is not None:
            raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: stopping at once")
        self.signum = signum

    def requested(self) -> int:
        """The signal to stop for, agreed by every process (0: go on)."""
        if not ddist.ranks().enabled:
            return self.signum or 0
        return max(ddist.gather_objects(self.signum or 0))

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False


def _maybe_no_sync(wrapped: nn.Module, last_micro: bool):
    """DDP all-reduces gradients on the last micro-batch of a step only."""
    if last_micro or not hasattr(wrapped, "no_sync"):
        return contextlib.nullcontext()
    return wrapped.no_sync()


AUDITED_MODULES = (("preproj.up", "W_up"), ("preproj.down", "W_down"), ("skip", "W_skip"), ("lora_A", "LoRA A"),
                   ("lora_B", "LoRA B"))


class _Bf16Audit:
    """The fraction of adapter updates that bf16 rounding erased (PAPER.md §5), overall and per module
    (W_up, W_down, W_skip, LoRA A, LoRA B): entries whose gradient was non-zero but whose stored value
    did not change in the optimizer step."""

    def __init__(self, params: dict[str, torch.Tensor]):
        self.params, self._before = params, {}
        self.kind = {n: next((k for key, k in AUDITED_MODULES if f".{key}." in f".{n}"), "other") for n in params}
        self.counts = {k: [0, 0] for k in dict.fromkeys(self.kind.values())}  # kind -> [erased, moved]

    def before(self) -> None:
        self._before = {n: ddist.local(p.detach()).clone() for n, p in self.params.items()}

    def after(self) -> None:
        for n, p in self.params.items():
            if p.grad is None:
                continue
            moved = ddist.local(p.grad) != 0
            self.counts[self.kind[n]][0] += int(((ddist.local(p.detach()) == self._before[n]) & moved).sum())
            self.counts[self.kind[n]][1] += int(moved.sum())

    def fractions(self, device: torch.device) -> tuple[float, dict[str, float]]:
        """(overall fraction, {module kind: fraction}), summed over every process."""
        kinds = list(self.counts)
        flat = ddist.sum_across([v for k in kinds for v in self.counts[k]], device)
        per = {k: flat[2 * i] / max(flat[2 * i + 1], 1) for i, k in enumerate(kinds)}
        return sum(flat[0::2]) / max(sum(flat[1::2]), 1), per
