"""The method table: how each compared method is built on a base model, saved and loaded.

    base           the model as it is: nothing added, nothing trains
    preproj        pre-projection (ours)
    skip           content skip only (the ablation the paper lacks)
    preproj+skip   both (the paper's method)
    lora           PEFT LoRA on the attention projections, rank matched to preproj+skip's parameters
    preproj+lora   pre-projection plus LoRA r=64 (docs/method.md: the frozen probe)
    gate, gate-head, value-residual, pre-mlp, preproj+skip+gate
                   the block changes the skip is compared with from scratch (docs/guide/variants.md)

The training loop, compare and the benchmark read this table and nothing else about methods.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from ..core.adapter import save_adapter
from ..core.attach import attach
from ..core.config import PreProjConfig
from ..core.families import decoder_layers, hidden_size
from ..runtime.precision import Precision
from ..runtime.precision import precision as as_precision
from .lora import attach_lora, matched_lora_rank

PAPER_LORA_RANK = 64  # pre-proj + LoRA r=64, docs/method.md: the frozen probe


@dataclass(frozen=True)
class Method:
    name: str
    help: str
    build: Callable[[nn.Module, Precision, int | str | None], nn.Module]
    """(base model, precision, LoRA rank: a number, "paper" or None) -> the model to train, base frozen."""
    save: Callable[[nn.Module, Path], None]
    """(built model, directory) -> writes the method's files (safetensors + JSON); load_adapter reads every one."""
    trains: tuple[tuple[str, str], ...] = ()
    """The modules it adds and trains, as (a part of their parameter names, a label): what the bf16 audit counts
    erased updates of, module by module."""
    has_skip: bool = False
    """Whether the method adds the content skip, whose weight norms by layer training logs and reports."""
    compared_by_default: bool = True
    """Whether `preproj compare` and the benchmark run it when no methods are named: the paper's methods and their
    baselines; the block changes are compared from scratch (`preproj pretrain`, `preproj scaling`)."""


def _preproj(mode: str):
    def build(model: nn.Module, precision: Precision, lora_rank: int | str | None) -> nn.Module:
        return attach(model, PreProjConfig(mode=mode, adapter_dtype=precision.adapter_dtype_name))

    return build


def _build_base(model: nn.Module, precision: Precision, lora_rank: int | str | None) -> nn.Module:
    return model.requires_grad_(False)


def paper_lora_rank(model: nn.Module) -> int:
    """The author's rank (07_benchmarks.py, docs/method.md: the frozen probe): r = int(target / (L * 2 * d * 2))
    with the pre-projection-only count as target, which works out to floor(1.25 d) // 2 (480 for Pythia-160M)."""
    layers, d = len(decoder_layers(model)), hidden_size(model)
    return int(layers * PreProjConfig(mode="preproj").params_per_layer(d) / (layers * 2 * d * 2))


MATCHABLE = ("preproj", "skip", "preproj+skip")
"""Methods whose trainable parameter count --lora-rank can match (lora's default is preproj+skip's)."""


def _rank(model: nn.Module, lora_rank: int | str | None) -> int | None:
    if lora_rank is None or isinstance(lora_rank, int):
        return lora_rank
    if lora_rank == "paper":
        return paper_lora_rank(model)
    if str(lora_rank).isdigit() and int(lora_rank) >= 1:
        return int(lora_rank)
    if lora_rank in MATCHABLE:  # the rank whose LoRA has the trainable parameters of that method, within 1%
        return matched_lora_rank(model, len(decoder_layers(model))
                                 * PreProjConfig(mode=lora_rank).params_per_layer(hidden_size(model)))
    raise ValueError(f"--lora-rank must be a positive integer, 'paper' or one of {', '.join(MATCHABLE)}, got "
                     f"{lora_rank!r}.")


def _build_lora(model: nn.Module, precision: Precision, lora_rank: int | str | None) -> nn.Module:
    lora_rank = _rank(model, lora_rank)
    if lora_rank is None:
        target = len(decoder_layers(model)) * PreProjConfig().params_per_layer(hidden_size(model))
        lora_rank = matched_lora_rank(model, target)
    model.requires_grad_(False)
    return attach_lora(model, lora_rank, precision.adapter)


def _build_preproj_lora(model: nn.Module, precision: Precision, lora_rank: int | str | None) -> nn.Module:
    lora_rank = _rank(model, lora_rank)
    attach(model, PreProjConfig(mode="preproj", adapter_dtype=precision.adapter_dtype_name))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    peft_model = attach_lora(model, lora_rank or PAPER_LORA_RANK, precision.adapter)
    for n, p in peft_model.named_parameters():  # PEFT freezes everything but LoRA; keep the pre-projection
        if n.removeprefix("base_model.model.") in trainable:
            p.requires_grad_(True)
    return peft_model


def _save_nothing(model: nn.Module, out: Path) -> None:
    pass


def _save_lora(model: nn.Module, out: Path) -> None:
    # The LoRA tensors are handed over as parameters, not through state_dict(): under FSDP, state_dict()
    # returns shards even while the parameters are gathered for saving.
    lora = {n: p.detach() for n, p in model.named_parameters() if "lora_" in n}
    model.save_pretrained(out, safe_serialization=True, state_dict=lora)


def _save_preproj_lora(model: nn.Module, out: Path) -> None:
    # The pre-projection in our two files, the LoRA half in out/lora/; load_adapter reads both.
    save_adapter(model.get_base_model(), out)
    _save_lora(model, out / "lora")


PREPROJ = (("preproj.up", "W_up"), ("preproj.down", "W_down"))
SKIP = (("skip", "W_skip"),)
LORA = (("lora_A", "LoRA A"), ("lora_B", "LoRA B"))
GATE = (("attn_gate", "W_gate"),)
VALUE_RESIDUAL = (("value_mix", "λ"),)
PRE_MLP = (("pre_mlp.up", "pre-MLP up"), ("pre_mlp.down", "pre-MLP down"))

METHODS = {
    m.name: m
    for m in (
        Method("base", "the base model as it is", _build_base, _save_nothing),
        Method("preproj", "pre-projection", _preproj("preproj"), save_adapter, PREPROJ),
        Method("skip", "content skip only", _preproj("skip"), save_adapter, SKIP, has_skip=True),
        Method("preproj+skip", "pre-projection and content skip (the paper's method)", _preproj("preproj+skip"),
               save_adapter, PREPROJ + SKIP, has_skip=True),
        Method("lora", "LoRA on the attention projections, rank matched to preproj+skip", _build_lora, _save_lora,
               LORA),
        Method("preproj+lora", f"pre-projection plus LoRA r={PAPER_LORA_RANK}", _build_preproj_lora, _save_preproj_lora,
               PREPROJ + LORA),
        # Block changes the content skip is compared with from scratch (docs/guide/variants.md).
        Method("gate", "gated attention, one sigmoid gate per channel read from the normed input (Qiu et al. 2025)",
               _preproj("gate"), save_adapter, GATE, compared_by_default=False),
        Method("gate-head", "gated attention, one gate per head", _preproj("gate-head"), save_adapter, GATE,
               compared_by_default=False),
        Method("value-residual", "every layer's values mixed with the first layer's (ResFormer)",
               _preproj("value-residual"), save_adapter, VALUE_RESIDUAL, compared_by_default=False),
        Method("pre-mlp", "a half MLP on the residual stream before attention, as many weights as the pre-projection",
               _preproj("pre-mlp"), save_adapter, PRE_MLP, compared_by_default=False),
        Method("preproj+skip+gate", "the paper's method with gated attention", _preproj("preproj+skip+gate"),
               save_adapter, PREPROJ + SKIP + GATE, has_skip=True, compared_by_default=False),
    )
}


def register_method(entry: Method) -> None:
    """Add a method to the table (a method defined outside preproj); its name must be new."""
    if entry.name in METHODS:
        raise ValueError(f"a method named {entry.name!r} is already registered.")
    METHODS[entry.name] = entry


def trained_methods() -> tuple[str, ...]:
    """Every method that trains something: all but the base."""
    return tuple(name for name in METHODS if name != "base")


def default_methods() -> tuple[str, ...]:
    """What `preproj compare` runs when no methods are named."""
    return tuple(name for name, entry in METHODS.items() if entry.compared_by_default)


def method(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {name!r}.")
    return METHODS[name]


def build_method(model: nn.Module, name: str, lora_rank: int | str | None = None,
                 precision: str | Precision = "fp32") -> nn.Module:
    """Attach method `name` to `model`; returns the model to train (a PeftModel for the LoRA methods)."""
    return method(name).build(model, as_precision(precision), lora_rank)


def save_method(model: nn.Module, name: str, out: str | Path) -> None:
    method(name).save(model, Path(out))


ADAPTER_SUBDIR = "adapter"


def save_model_dir(model: nn.Module, name: str, out: str | Path, whole_state: dict | None = None) -> None:
    """A model trained as a whole: the base (without the method's modules) saved by save_pretrained in
    safetensors at `out`, the method's files in out/adapter. transformers reads an adapter_config.json
    beside a model's own files as a PEFT adapter to load, hence the subfolder. whole_state: the base's state dict
    gathered whole where it is sharded (else the base's own)."""
    from ..core.modules import PreProjAttention

    out = Path(out)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    wrappers = [n for n, m in base.named_modules() if isinstance(m, PreProjAttention)]
    added = tuple(f"{w}." for w in wrappers)  # everything a wrapper holds beside its base_layer
    kept = tuple(f"{w}.base_layer." for w in wrappers)
    state = {k.replace(".base_layer.", "."): v for k, v in (whole_state or base.state_dict()).items()
             if not k.startswith(added) or k.startswith(kept)}
    base.save_pretrained(out, state_dict=state)
    save_method(model, name, out / ADAPTER_SUBDIR)
