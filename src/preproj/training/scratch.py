"""`preproj pretrain`: a Llama-architecture model trained from random initialisation, with pre-projection
and content skip built in from the start and trained together with every other weight.

Setup builds the shape (and, for a plain baseline, the width that matches an adapted model's parameters
or training FLOPs), the tokenizer and the model; fit is `preproj train`'s loop with the base unfrozen
(its precision, devices, processes, checkpoints and resume); validate scores the whole held-out text and
writes greedy samples. The result is an ordinary model directory: `load_model(OUT)`, then
`load_adapter(model, OUT/adapter)`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
from torch import nn

from ..core.adapter import load_adapter
from ..core.config import PreProjConfig, canonical_mode
from ..data import check_data_source, resolve_data_dir, training_corpus, wikitext_lines
from ..methods.registry import ADAPTER_SUBDIR, METHODS
from ..runtime import distributed as ddist
from ..runtime.files import write_json
from ..runtime.loading import load_model, load_tokenizer
from ..runtime.precision import DeviceArgs, resolve_device
from ..runtime.precision import precision as as_precision
from ..runtime.validation import check_args
from .args import CheckpointArgs, LaunchArgs, OptimArgs, ScratchDataArgs, TrainArgs
from .loop import train
from .probes import first_token_attention, greedy_samples, lm_loss

logger = logging.getLogger(__name__)

TASKS = ("text", "mnist", "moving-mnist", "moving-mnist-direction")
"""What `pretrain` trains on: text, or images (training/scratch_vision.py)."""
MODES = ("base", "preproj", "skip", "preproj+skip")
"""The paper's modes from scratch; every method whose name is a PreProjConfig mode trains from scratch too."""
EOS = "<|endoftext|>"


@dataclass
class PretrainArgs(CheckpointArgs, LaunchArgs, DeviceArgs, OptimArgs, ScratchDataArgs):
    """Arguments of `preproj pretrain`: the model's shape and method, with the groups of training/args.py."""

    out: str = "runs/pretrain"
    """Output directory: the model (config, safetensors, tokenizer), adapter/, train_log.jsonl, summary.json."""
    layers: int = 4
    """Decoder layers."""
    d_model: int = 128
    """Hidden width d."""
    heads: int = 4
    """Attention heads (d_model must be a multiple)."""
    kv_heads: int | None = None
    """Key/value heads for grouped-query attention (default: heads)."""
    intermediate_size: int | None = None
    """SwiGLU MLP width (default: 8/3 d rounded up to a multiple of 16)."""
    method: str = "preproj+skip"
    """base (the plain transformer), one of the paper's methods, or a block change it is compared with, built in and
    trained from the start."""
    match: str | None = None
    """With --method base: params or flops. Widen the plain model's MLP so that its parameters (or training FLOPs
    per token) equal those of the --match-to model of this shape within 2%."""
    match_to: str = "preproj+skip"
    """The adapted model that --match measures."""
    seed: int = 0
    """Seed of the initialisation (base and modules) and of the data order."""
    precision: str = "auto"
    """auto (bf16-mixed where bf16 matmuls are native, else fp32: here the base trains), fp32, bf16-mixed, bf16-true or
    bf16-frozen, as for `preproj train`."""
    sample_tokens: int = 24
    """Greedy tokens generated after each prompt at the end."""
    # the groups' fields whose defaults differ here
    batch_size: int = 8
    lr: float = 3e-3
    warmup: int = 20
    eval_every: int = 50
    eval_batches: int = 8
    save_every: int = 50


# --- shapes, parameters and FLOPs ----------------------------------------------------------------

@dataclass(frozen=True)
class Shape:
    layers: int
    d_model: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    def llama_config(self, context: int, tokenizer):
        from transformers import LlamaConfig

        eos = tokenizer.eos_token_id
        return LlamaConfig(vocab_size=self.vocab, hidden_size=self.d_model, intermediate_size=self.intermediate,
                           num_hidden_layers=self.layers, num_attention_heads=self.heads,
                           num_key_value_heads=self.kv_heads, head_dim=self.head_dim, max_position_embeddings=context,
                           tie_word_embeddings=True, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)


def default_intermediate(d: int) -> int:
    return 16 * math.ceil(8 * d / 3 / 16)


def pretrain_methods() -> tuple[str, ...]:
    """base and every method of the table whose name is one PreProjConfig mode (LoRA adapts a trained base)."""
    return ("base", *(name for name in METHODS if _is_mode(name)))


def _is_mode(name: str) -> bool:
    try:
        return canonical_mode(name) == name
    except ValueError:
        return False


def _added_params(shape: Shape, mode: str, matmul_only: bool = False) -> int:
    """What the method adds: in one layer, the weights a token is multiplied by; else in the whole model."""
    if mode == "base":
        return 0
    config, width = PreProjConfig(mode=mode), shape.heads * shape.head_dim
    if matmul_only:
        return config.matmul_params_per_layer(shape.d_model, width, shape.heads)
    return config.added_params(shape.layers, shape.d_model, width, shape.heads)


def _layer_matmul_params(shape: Shape, mode: str) -> int:
    d, hd = shape.d_model, shape.head_dim
    attention = d * shape.heads * hd * 2 + d * shape.kv_heads * hd * 2  # q, o; k, v
    return attention + 3 * d * shape.intermediate + _added_params(shape, mode, matmul_only=True)


def count_params(shape: Shape, mode: str) -> int:
    """Every parameter: tied embedding, per layer two RMSNorms and the matmuls, the final norm, and what the
    method adds (its matmuls, a pre-MLP's norm, the value residual's mixing weights)."""
    return shape.vocab * shape.d_model + shape.layers * (2 * shape.d_model + _layer_matmul_params(shape, "base")) \
        + shape.d_model + _added_params(shape, mode)


def train_flops_per_token(shape: Shape, mode: str, seq_len: int) -> int:
    """Matmul FLOPs of a forward and backward pass, per token, every weight trained: 3x the forward, which is
    2 per weight of every layer and the head, plus attention's two (T x T) products (4 T H hd per token per
    layer, counted in full as an eager kernel computes them). Elementwise work is not counted, as torch's
    FlopCounterMode does not count it."""
    per_token_weights = shape.layers * _layer_matmul_params(shape, mode) + shape.vocab * shape.d_model
    attention_scores = shape.layers * 4 * seq_len * shape.heads * shape.head_dim
    return 3 * (2 * per_token_weights + attention_scores)


def matched_plain(shape: Shape, match: str, to: str, seq_len: int) -> Shape:
    """The plain model of this shape with the MLP width whose parameters (match='params') or training FLOPs
    per token ('flops') come closest to those of the `to` model of this shape. Both counts are affine in the
    MLP width, so the width is solved, not searched."""
    measure = {"params": lambda s, m: count_params(s, m), "flops": lambda s, m: train_flops_per_token(s, m, seq_len)}
    if match not in measure:
        raise ValueError(f"--match must be params or flops, got {match!r}.")
    f = measure[match]
    goal = f(shape, to)
    at0, at1 = f(replace(shape, intermediate=0), "base"), f(replace(shape, intermediate=1), "base")
    return replace(shape, intermediate=max(1, round((goal - at0) / (at1 - at0))))


# --- tokenizer and model -------------------------------------------------------------------------

def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE of `vocab_size` tokens trained on `texts`, as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=EOS)


def make_tokenizer(spec: str, texts: list[str]):
    if spec.startswith("train:"):
        size = spec.removeprefix("train:")
        if not size.isdigit() or int(size) < 300:
            raise ValueError(f"--tokenizer train:N needs N >= 300 (256 bytes, the end token, some merges), "
                             f"got {spec!r}.")
        return train_tokenizer(texts, int(size))
    return load_tokenizer(spec)


def build_model(shape: Shape, context: int, tokenizer, seed: int, precision: str = "fp32"):
    """A freshly initialised Llama (RMSNorm, RoPE, SwiGLU); the training loop attaches the method to it."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(shape.llama_config(context, tokenizer),
                                            dtype=as_precision(precision).weights, attn_implementation="sdpa")


def _check(args: PretrainArgs) -> None:
    check_args(args)
    as_precision(args.precision)
    if args.task not in TASKS:
        raise ValueError(f"--task must be one of {', '.join(TASKS)}, got {args.task!r}.")
    if args.task == "text":
        check_data_source(args.data)
    methods = pretrain_methods()
    if args.method not in methods:
        raise ValueError(f"--method must be one of {', '.join(methods)}, got {args.method!r}.")
    if args.match is not None and args.method != "base":
        raise ValueError("--match builds a plain baseline; use it with --method base.")
    if args.match_to not in methods[1:]:
        raise ValueError(f"--match-to must be one of {', '.join(methods[1:])}, got {args.match_to!r}.")
    if args.d_model % args.heads:
        raise ValueError(f"--d-model {args.d_model} is not a multiple of --heads {args.heads}.")
    kv = args.kv_heads or args.heads
    if args.heads % kv:
        raise ValueError(f"--kv-heads {kv} must divide --heads {args.heads}.")


def shared_fields(source, cls) -> dict:
    """The fields of arguments dataclass `cls` that `source` has too, with their values in `source`."""
    return {f.name: getattr(source, f.name) for f in fields(cls) if hasattr(source, f.name)}


def shape_of(args: PretrainArgs, vocab: int) -> Shape:
    shape = Shape(args.layers, args.d_model, args.heads, args.kv_heads or args.heads,
                  args.intermediate_size or default_intermediate(args.d_model), vocab)
    return matched_plain(shape, args.match, args.match_to, args.seq_len) if args.match else shape


# --- the command ---------------------------------------------------------------------------------

def pretrain(args: PretrainArgs, progress: bool = True) -> tuple[dict, nn.Module]:
    """Setup, fit, validate; returns (summary.json's contents, the trained model)."""
    _check(args)
    if args.task != "text":
        from .scratch_vision import pretrain_images  # it builds on this module

        return pretrain_images(args, progress)
    device = resolve_device(args.device)
    args = replace(args, precision=as_precision(args.precision, device).name)
    r = ddist.setup(device)
    out = Path(args.out)
    data_dir = resolve_data_dir(args.data_dir)
    texts, held, data_desc = training_corpus(args.data, data_dir)

    # --- setup: tokenizer, shape, model ---
    tokenizer = _shared_tokenizer(args, out, texts, r)
    shape = shape_of(args, len(tokenizer))
    counts = _size_and_cost(args, shape)
    if r.is_main:
        logger.info(_describe(args, shape, counts))
    model = build_model(shape, args.seq_len, tokenizer, args.seed, args.precision)

    # --- fit: preproj train's loop, which attaches the method; every weight trains ---
    per_step = args.batch_size * args.seq_len * args.grad_accum * r.world_size
    steps = max(1, args.tokens // per_step)
    targs = TrainArgs(**{**shared_fields(args, TrainArgs), "model": str(out), "steps": steps,
                          "warmup": min(args.warmup, steps - 1), "train_base": True})
    summary, model = train(targs, model=model, tokenizer=tokenizer, progress=progress)
    if r.world_size > 1 and args.strategy == "fsdp":  # sharded: every process scores the saved model, whole
        ddist.barrier()
        model = load_adapter(load_model(str(out), dtype=as_precision(args.precision).weights, device=device)[0],
                             out / ADAPTER_SUBDIR)

    # --- validate: the whole held-out (and, for WikiText, test) text, greedy samples, the sink probe ---
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    summary.update({"pretrain": asdict(args), "shape": asdict(shape), **counts, "data": data_desc,
                    **_validate(args, base, tokenizer, held, data_dir, device, r)})
    if r.is_main:
        write_json(out / "summary.json", summary)
    ddist.barrier()
    return summary, model


def _shared_tokenizer(args: PretrainArgs, out: Path, texts: list[str], r):
    """The main process trains (or names) the tokenizer and saves it in OUT; every process loads that copy, and a
    resumed run reloads it, so that all of them tokenise alike."""
    from transformers import AutoTokenizer

    if args.resume and (out / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(out)
    if r.is_main:
        make_tokenizer(args.tokenizer, texts).save_pretrained(out)
    ddist.barrier()
    return AutoTokenizer.from_pretrained(out)


def _size_and_cost(args: PretrainArgs, shape: Shape) -> dict:
    """Parameters and training FLOPs per token; for a matched plain model also those of what it is matched to."""
    counts = {"params": count_params(shape, args.method),
              "train_flops_per_token": train_flops_per_token(shape, args.method, args.seq_len)}
    if args.match:
        target = Shape(shape.layers, shape.d_model, shape.heads, shape.kv_heads,
                       args.intermediate_size or default_intermediate(args.d_model), shape.vocab)
        counts["matched_to"] = {"method": args.match_to, "params": count_params(target, args.match_to),
                                "train_flops_per_token": train_flops_per_token(target, args.match_to, args.seq_len)}
    return counts


def _describe(args: PretrainArgs, shape: Shape, counts: dict) -> str:
    said = (f"{args.method}: {shape}, {counts['params']:,} parameters, "
            f"{counts['train_flops_per_token']:,} training FLOPs per token")
    if args.match:
        target = counts["matched_to"]
        said += (f"; {args.match_to} of the unwidened shape: {target['params']:,} parameters, "
                 f"{target['train_flops_per_token']:,} FLOPs per token")
    return said


def _validate(args: PretrainArgs, base: nn.Module, tokenizer, held: list[str], data_dir, device, r) -> dict:
    """Loss and perplexity on every full window of the held-out text (and WikiText-2 test for WikiText), greedy
    samples from the main process, and the attention each layer puts on a window's first token."""
    scores = {"validation": lm_loss(base, tokenizer, held, args.seq_len, args.batch_size, args.precision, device)}
    if args.data.startswith("wikitext2"):
        test = [line for line in wikitext_lines("test", data_dir) if len(line.strip()) > 50]
        scores["test"] = lm_loss(base, tokenizer, test, args.seq_len, args.batch_size, args.precision, device)
    return {
        "loss": {k: v["loss"] for k, v in scores.items()},
        "perplexity": {k: math.exp(v["loss"]) for k, v in scores.items()},
        "scored_tokens": {k: v["tokens"] for k, v in scores.items()},
        "samples": greedy_samples(base, tokenizer, args.sample_tokens) if r.is_main else {},
        "first_token_attention": first_token_attention(base, tokenizer, held, args.seq_len, args.batch_size, device),
    }
