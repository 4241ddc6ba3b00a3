"""`preproj train`: the frozen probe. Base frozen, only the new parameters learn (PAPER.md §2).

A plain loop, nanoGPT-style: AdamW, cosine schedule with linear warmup, gradient accumulation,
optional activation checkpointing, held-out loss at intervals, atomic checkpoints that a killed run
resumes from bit for bit (the data order is a pure function of seed and step, so there is no
iterator state to save).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from . import data as datasets
from .adapter import atomic_write, save_adapter, write_json
from .attach import attach, skip_norms
from .baselines import attach_lora, matched_lora_rank
from .config import PreProjConfig
from .loss import causal_lm_loss

METHODS = ("preproj", "skip", "preproj+skip", "lora", "preproj+lora")
PRECISIONS = ("bf16-mixed", "bf16", "fp32")
PAPER_LORA_RANK = 64  # pre-proj + LoRA r=64, PAPER.md §2


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
    """wikitext2 (offline: raw valid, test held out), wikitext103 (Hub), tinystories, or a text file."""
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
    precision: str = "bf16-mixed"
    """bf16-mixed (bf16 autocast, fp32 master weights), bf16 (pure bf16 weights as in the paper, with a precision audit) or fp32."""
    activation_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, ~30% more compute)."""
    attn_implementation: str | None = None
    """'sdpa' or 'eager' attention while training; default: the model's own (sdpa). Under bf16 autocast eager
    rounds attention scores to bf16, and its memory grows with the square of the sequence length;
    benchmarks/run.py times both on your machine."""
    lora_rank: int | None = None
    """LoRA rank for method 'lora'; default: matched to preproj+skip's trainable count within 1%."""
    eval_every: int = 25
    """Held-out loss every N steps (and at the end)."""
    eval_batches: int = 4
    """Micro-batches of held-out text per held-out loss."""
    save_every: int = 25
    """Checkpoint every N steps (atomic; the last good one is kept)."""
    resume: bool = False
    """Continue from OUT/checkpoint if present."""


class TrainingDiverged(RuntimeError):
    """A NaN or inf loss; the last good checkpoint is left in place."""


def build_method(model: nn.Module, method: str, lora_rank: int | None = None, adapter_dtype: str = "float32"):
    """Attach `method` to `model`; returns the model to train (a PeftModel for the LoRA methods)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}.")
    if method in ("preproj", "skip", "preproj+skip"):
        return attach(model, PreProjConfig(mode=method, adapter_dtype=adapter_dtype))
    if method == "preproj+lora":
        attach(model, PreProjConfig(mode="preproj", adapter_dtype=adapter_dtype))
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        peft_model = attach_lora(model, lora_rank or PAPER_LORA_RANK)
        for n, p in peft_model.named_parameters():  # PEFT freezes everything but LoRA; keep the pre-projection
            if n.removeprefix("base_model.model.") in trainable:
                p.requires_grad_(True)
        return peft_model
    if lora_rank is None:
        d, n_layers = model.config.hidden_size, model.config.num_hidden_layers
        lora_rank = matched_lora_rank(model, n_layers * PreProjConfig().params_per_layer(d))
    model.requires_grad_(False)
    return attach_lora(model, lora_rank)


def lr_at(step: int, args: TrainArgs) -> float:
    """Linear warmup to args.lr, then cosine decay to 0 at args.steps."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def batch_indices(step: int, micro: int, n_examples: int, args: TrainArgs) -> np.ndarray:
    """Example indices of (step, micro): a fresh permutation per epoch, a pure function of the seed."""
    start = (step * args.grad_accum + micro) * args.batch_size
    picks = []
    for k in range(start, start + args.batch_size):
        epoch, pos = divmod(k, n_examples)
        picks.append(np.random.default_rng([args.seed, epoch]).permutation(n_examples)[pos])
    return np.array(picks)


def make_optimizer(params: list[torch.Tensor], lr: float, weight_decay: float = 0.0) -> torch.optim.AdamW:
    """AdamW over the adapter; the fused kernel where torch has one (on CPU it is ~7x faster than foreach)."""
    fused = all(p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused)


def autocast_for(precision: str):
    """The autocast context of a training precision: bf16 autocast for bf16-mixed, nothing otherwise."""
    if precision == "bf16-mixed":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _trainable(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


# --- checkpoints ---------------------------------------------------------------------------------

def save_checkpoint(path: Path, model, optimizer, step: int, log_tail: list[dict]) -> None:
    """Adapter weights, optimizer state, step and RNG state in one file, written atomically.

    torch.save is used for the optimizer's nested state; it is read back with weights_only=True,
    which refuses anything but tensors and plain containers."""
    state = {
        "step": step,
        "params": {n: p.detach().clone() for n, p in _trainable(model).items()},
        "optimizer": optimizer.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "log_tail": json.dumps(log_tail),
    }
    path.mkdir(parents=True, exist_ok=True)
    atomic_write(path / "state.pt", lambda tmp: torch.save(state, tmp))


def load_checkpoint(path: Path, model, optimizer) -> tuple[int, list[dict]]:
    try:
        state = torch.load(path / "state.pt", weights_only=True)
    except Exception as e:
        raise RuntimeError(f"Checkpoint {path / 'state.pt'} could not be read ({e}); delete it to start over.") from None
    params = _trainable(model)
    if set(state["params"]) != set(params):
        raise RuntimeError(f"Checkpoint {path} was written for another method or model; use a new --out or drop --resume.")
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(state["params"][n])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    return int(state["step"]), json.loads(state["log_tail"])


# --- the loop ------------------------------------------------------------------------------------

@torch.no_grad()
def heldout_loss(model, ids: torch.Tensor, labels: torch.Tensor, args: TrainArgs) -> float:
    was = model.training
    model.eval()
    total, count = 0.0, 0
    for s in range(0, len(ids), args.batch_size):
        with autocast_for(args.precision):
            loss = causal_lm_loss(model, ids[s : s + args.batch_size], labels[s : s + args.batch_size])
        n = int((labels[s : s + args.batch_size, 1:] != -100).sum())
        total, count = total + float(loss) * n, count + n
    model.train(was)
    return total / max(count, 1)


def save_final_adapter(model, method: str, out: Path) -> None:
    """OUT/adapter_config.json + adapter_model.safetensors (preproj), or PEFT's files (LoRA); preproj+lora
    puts the LoRA half in OUT/lora/. preproj.load_adapter reads all three layouts."""
    if method in ("preproj", "skip", "preproj+skip"):
        save_adapter(model, out)
        return
    if method == "lora":
        model.save_pretrained(out, safe_serialization=True)
        return
    save_adapter(model.get_base_model(), out)
    model.save_pretrained(out / "lora", safe_serialization=True)


def train(args: TrainArgs, model=None, tokenizer=None, progress: bool = True) -> tuple[dict, nn.Module]:
    """Run one frozen-probe training; returns (summary.json's contents, the trained model)."""
    from .loading import load_model

    if args.precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {args.precision!r}.")
    if args.attn_implementation not in (None, "sdpa", "eager"):
        raise ValueError(f"attn_implementation must be 'sdpa' or 'eager', got {args.attn_implementation!r}.")
    if args.steps < 1 or args.batch_size < 1 or args.grad_accum < 1 or args.seq_len < 2:
        raise ValueError("steps, batch_size and grad_accum must be >= 1 and seq_len >= 2.")
    out = Path(args.out)
    ckpt = out / "checkpoint"
    if out.exists() and (out / "train_log.jsonl").exists() and not args.resume:
        raise ValueError(f"{out} already holds a run; pass --resume to continue it or choose another --out.")
    out.mkdir(parents=True, exist_ok=True)
    wall_start = time.monotonic()

    if model is None:
        model, tokenizer = load_model(args.model, dtype=torch.bfloat16 if args.precision == "bf16" else torch.float32)
    torch.manual_seed(args.seed)
    model = build_method(model, args.method, args.lora_rank, "bfloat16" if args.precision == "bf16" else "float32")
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if args.activation_checkpointing:
        base.activation_checkpointing_enable()
    if args.attn_implementation is not None:
        base.set_attn_implementation(args.attn_implementation)
    model.train()
    params = _trainable(model)
    n_trainable = sum(p.numel() for p in params.values())

    data_dir = datasets.resolve_data_dir(args.data_dir)
    train_lines, held_lines, data_desc = datasets.training_corpus(args.data, data_dir, lines=args.lines)
    ids, labels = datasets.tokenize_examples(train_lines, tokenizer, args.seq_len, args.packing)
    held_ids, held_labels = datasets.tokenize_examples(held_lines, tokenizer, args.seq_len, args.packing,
                                                       max_examples=args.eval_batches * args.batch_size)

    optimizer = make_optimizer(list(params.values()), args.lr, args.weight_decay)
    write_json(out / "train_config.json", {**asdict(args), "trainable_params": n_trainable, "data_description": data_desc})

    step, log = 0, []
    if args.resume and (ckpt / "state.pt").exists():
        step, log = load_checkpoint(ckpt, model, optimizer)
        print(f"resumed from {ckpt} at step {step}")
    else:
        log = [{"step": 0, "tokens": 0, "heldout_loss": heldout_loss(model, held_ids, held_labels, args)}]
    log_path = out / "train_log.jsonl"
    log_path.write_text("".join(json.dumps(r) + "\n" for r in log))  # drop lines written after the checkpoint

    tokens_per_step = args.batch_size * args.grad_accum * args.seq_len
    audit_erased, audit_total = 0, 0
    bar = tqdm(total=args.steps, initial=step, desc=f"train {args.method}", disable=not progress)
    loop_start, loop_start_step = time.monotonic(), step
    while step < args.steps:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args)
        loss_sum = 0.0
        for micro in range(args.grad_accum):
            idx = torch.from_numpy(batch_indices(step, micro, len(ids), args))
            with autocast_for(args.precision):
                loss = causal_lm_loss(model, ids[idx], labels[idx]) / args.grad_accum
            if not torch.isfinite(loss):
                raise TrainingDiverged(
                    f"Loss became {float(loss.detach())} at step {step + 1}; stopped. The last good checkpoint is in {ckpt}. "
                    "Lower --lr, or use --precision bf16-mixed or fp32.")
            loss.backward()
            loss_sum += float(loss.detach())
        if args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params.values(), args.max_grad_norm)
        if args.precision == "bf16":  # audit: updates that bf16 rounding erased (PAPER.md §5)
            before = {n: p.detach().clone() for n, p in params.items()}
        optimizer.step()
        if args.precision == "bf16":
            for n, p in params.items():
                moved = p.grad is not None and p.grad != 0
                if p.grad is not None:
                    audit_erased += int(((p.detach() == before[n]) & moved).sum())
                    audit_total += int(moved.sum())
        optimizer.zero_grad(set_to_none=True)
        step += 1
        elapsed = time.monotonic() - loop_start
        record = {"step": step, "loss": loss_sum, "lr": optimizer.param_groups[0]["lr"], "tokens": step * tokens_per_step,
                  "tokens_per_second": (step - loop_start_step) * tokens_per_step / max(elapsed, 1e-9)}
        if step % args.eval_every == 0 or step == args.steps:
            record["heldout_loss"] = heldout_loss(model, held_ids, held_labels, args)
        log.append(record)
        with open(log_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        bar.set_postfix(loss=f"{loss_sum:.3f}", tok_s=f"{record['tokens_per_second']:.0f}")
        bar.update(1)
        if step % args.save_every == 0 or step == args.steps:
            save_checkpoint(ckpt, model, optimizer, step, log)
    bar.close()

    save_final_adapter(model, args.method, out)
    heldout = [r["heldout_loss"] for r in log if "heldout_loss" in r]
    summary = {
        "model": args.model, "method": args.method, "steps": args.steps, "tokens_seen": args.steps * tokens_per_step,
        "trainable_params": n_trainable,
        "tokens_per_second": log[-1].get("tokens_per_second"),
        "final_train_loss": log[-1].get("loss"),
        "initial_heldout_loss": heldout[0],
        "final_heldout_loss": heldout[-1],
        "skip_norms": skip_norms(base) if args.method in ("skip", "preproj+skip") else None,
        "wall_seconds": time.monotonic() - wall_start,
        "precision": args.precision, "data": data_desc,
    }
    if args.precision == "bf16":
        summary["bf16_erased_update_fraction"] = audit_erased / max(audit_total, 1)
    write_json(out / "summary.json", summary)
    return summary, model
