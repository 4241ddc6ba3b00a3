"""The arguments of `preproj train` and `preproj pretrain`, in the groups other entry points compose too, and what a
resumed run may and may not change."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ..data import check_data_source
from ..methods.registry import MATCHABLE, trained_methods
from ..runtime.precision import DeviceArgs
from ..runtime.precision import precision as as_precision
from ..runtime.tracking import parse_report_to
from ..runtime.validation import check_args
from .strategy import STRATEGIES

# Argument groups, composed by each entry point's arguments (as litgpt composes its own): a field is declared, with its
# help, once; an entry point that needs another default redeclares the field with that default only (its position
# and help stay the group's). cli.py turns every field into a flag.


@dataclass
class LaunchArgs:
    """How many processes train, how they share the model, and who hears about it."""

    strategy: str = "ddp"
    """With several processes (torchrun): ddp (the model replicated, the trained weights' gradients all-reduced: a
    frozen base's are none) or fsdp (FSDP2: the model sharded, sharded checkpoints)."""
    nproc: int = 1
    """Launch this many processes on this machine with torchrun (1: train in this process)."""
    report_to: str = "none"
    """Experiment trackers, comma-separated: none, tensorboard (OUT/tensorboard), wandb, trackio. They get loss,
    held-out loss, learning rate, tokens/s and skip norms by layer at every step; train_log.jsonl is always written."""


@dataclass
class OptimArgs:
    """The optimizer and its schedule: AdamW, linear warmup, cosine decay."""

    batch_size: int = 4
    """Sequences per micro-batch."""
    grad_accum: int = 1
    """Micro-batches per optimizer step."""
    lr: float = 1e-3
    """Peak learning rate."""
    warmup: int = 10
    """Linear warmup steps before the cosine decay."""
    weight_decay: float = 0.0
    """AdamW weight decay."""


@dataclass
class CheckpointArgs:
    """Held-out loss while training, checkpoints, and resuming from them."""

    eval_every: int = 25
    """Held-out loss every N steps (and at the end)."""
    eval_batches: int = 4
    """Global micro-batches (batch_size x processes sequences each) of held-out text per held-out loss."""
    save_every: int = 25
    """Checkpoint every N steps (atomic; the last good one is kept)."""
    resume: bool = False
    """Continue from OUT/checkpoint if present."""


@dataclass
class ScratchDataArgs:
    """What a model trained from scratch learns from: the task, its data, its tokens or images."""

    task: str = "text"
    """text (a Llama-architecture language model on --data); mnist (a vision transformer with 2-D RoPE classifies MNIST
    digits); moving-mnist (a video transformer with 3-D RoPE predicts the frames after --context of a Moving MNIST clip)
    or moving-mnist-direction (it tells which way the digit of a one-digit clip moves). docs/guide/vision.md; --data,
    --tokenizer, --seq-len and --sample-tokens are text's."""
    data: str = "wikitext2-train"
    """wikitext2-train (the tokenized train split; raw valid for held-out loss, raw test scored at the end),
    wikitext2, tinystories, or a text file."""
    data_dir: str | None = None
    """Directory laid out as ../shared/data; default $PREPROJ_DATA_DIR."""
    tokenizer: str = "train:8192"
    """train:N (a byte-level BPE of N tokens trained on the training text: a 49k-token embedding would dominate a
    tiny model), or an embedded name, hub id or directory whose tokenizer to use (e.g. smollm2-135m)."""
    tokens: int = 2_000_000
    """Training tokens per run (patches or tubelets for a vision task); the steps are these over the tokens of one
    step."""
    epochs: float | None = None
    """Vision tasks: passes over the training images, instead of --tokens."""
    patch_size: int | None = None
    """Vision tasks: pixels per side of a square patch; it must divide the image (28 for MNIST, 64 for Moving MNIST).
    Default: 4 for MNIST, 8 for Moving MNIST."""
    frames: int = 16
    """Moving MNIST: frames per clip."""
    context: int = 10
    """moving-mnist: frames given; the model predicts the rest of the clip."""
    tubelet: int = 2
    """Moving MNIST: frames per token (a tubelet of tubelet x patch x patch pixels); it must divide --frames and
    --context."""
    position: str = "rope"
    """Vision tasks: rope (2-D or 3-D RoPE inside attention: the modules see no position) or learned (a learned absolute
    embedding added before the blocks, as ViT's: the norm the modules read then carries position)."""
    seq_len: int = 256
    """Tokens per sequence (also the model's context)."""


@dataclass
class TrainArgs(CheckpointArgs, LaunchArgs, DeviceArgs, OptimArgs):
    """Arguments of `preproj train`: the model, the method and the data, with the groups above."""

    model: str = "smollm2-135m"
    """Embedded name, Hugging Face hub id or local directory."""
    method: str = "preproj+skip"
    """What to train, from the method table: preproj, skip and preproj+skip are the paper's; lora and preproj+lora
    the baselines (through PEFT); the others block changes compared with the skip (docs/guide/variants.md)."""
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
    seq_len: int = 256
    """Tokens per sequence."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this (0 = no clipping)."""
    seed: int = 42
    """Seed of the adapter's initialisation and of the data order."""
    precision: str = "auto"
    """auto (bf16-frozen where bf16 matmuls are native, bf16-mixed for a model passed in float32, else fp32), fp32,
    bf16-mixed (bf16 autocast, fp32 weights and masters), bf16-true (pure bf16 as in the paper, with an audit of
    updates that rounding erased) or bf16-frozen (bf16 base, fp32 adapter masters, bf16 autocast)."""
    activation_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, ~30% more compute)."""
    attn_implementation: str | None = None
    """'sdpa' or 'eager' attention while training; default: the model's own (sdpa). Under bf16 autocast eager
    rounds attention scores to bf16, and its memory grows with the square of the sequence length;
    benchmarks/run.py times both on your machine."""
    lora_rank: str | None = None
    """LoRA rank: a number, 'paper' (the author's formula, floor(1.25 d) / 2: 480 for Pythia-160M), a method whose
    trainable count it matches within 1% (preproj, skip, preproj+skip) or unset (method lora: matched to
    preproj+skip's; preproj+lora: 64)."""
    train_base: bool = False
    """Train every weight, the base's too (what `preproj pretrain` sets); the result is then a model directory
    with the method's files in OUT/adapter."""


# Arguments a resumed run may change: where things are (a run directory may move) and what is logged, never what is
# computed.
RESUME_MAY_CHANGE = ("out", "resume", "report_to", "eval_every", "save_every", "data_dir", "device", "nproc")


def changed_arguments(recorded_path: Path, args) -> list[str]:
    """'steps 2 -> 3' for every argument that differs from those a run was started with (train_config.json);
    RESUME_MAY_CHANGE lists the ones that cannot change the result. Empty when nothing is recorded."""
    if not recorded_path.is_file():
        return []
    recorded = json.loads(recorded_path.read_text())
    return [f"{k} {recorded[k]!r} -> {v!r}" for k, v in asdict(args).items()
            if k not in RESUME_MAY_CHANGE and k in recorded and recorded[k] != v]


def check_same_run(recorded_path: Path, args) -> None:
    """Refuse to resume a run with arguments that differ from those it was started with, naming every changed
    field."""
    changed = changed_arguments(recorded_path, args)
    if changed:
        raise ValueError(f"{recorded_path.parent} was started with other arguments ({'; '.join(changed)}); resume it "
                         "with the recorded ones (train_config.json), or start afresh with another --out.")


def check_train_args(args: TrainArgs, reads_data: bool = True) -> None:
    """Every argument checked before anything loads, each failure one line that names the argument. reads_data: False
    where the caller gives the data, and args.data only names it."""
    check_args(args)
    as_precision(args.precision)
    if reads_data:
        check_data_source(args.data)
    if args.method not in trained_methods() and not (args.train_base and args.method == "base"):
        raise ValueError(f"method must be one of {', '.join(trained_methods())}, got {args.method!r}.")
    if args.attn_implementation not in (None, "sdpa", "eager"):
        raise ValueError(f"attn_implementation must be 'sdpa' or 'eager', got {args.attn_implementation!r}.")
    if args.strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {args.strategy!r}.")
    parse_report_to(args.report_to)
    rank = "" if args.lora_rank is None else str(args.lora_rank)
    if args.lora_rank is not None and rank not in ("paper", *MATCHABLE) and not (rank.isdigit() and int(rank) >= 1):
        raise ValueError(f"--lora-rank must be a positive integer, 'paper' or one of {', '.join(MATCHABLE)} (the "
                         f"rank that matches that method's trainable parameters), got {args.lora_rank!r}.")
    if args.packing not in ("pack", "lines"):
        raise ValueError(f"packing must be 'pack' or 'lines', got {args.packing!r}.")
