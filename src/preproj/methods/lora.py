"""Baselines through PEFT: LoRA on the attention projections, rank matched to an adapter's size.

docs/method.md: the frozen probe: alpha = 2r, dropout 0, attention projections only. The paper's rank formula
under-counted (26.5M vs 24.8M); here r is chosen so the trainable count is within 1% of the target.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from ..core.families import decoder_layers, family_of


def _attention_projections(model: nn.Module) -> list[tuple[int, int]]:
    """(in_features, out_features) of every LoRA target in one decoder layer."""
    import re

    targets = family_of(model).lora_targets
    if not targets:
        raise ValueError("No LoRA targets are known for this model's structure; the LoRA baselines need a family from "
                         "the table.")
    pattern = re.compile(targets)
    layer = decoder_layers(model)[0]
    shapes = []
    for name, module in layer.named_modules(prefix="x"):
        if pattern.fullmatch(name) and hasattr(module, "weight"):
            w = module.weight
            # transformers' Conv1D (GPT-2) stores (in, out); nn.Linear stores (out, in)
            shapes.append((w.shape[0], w.shape[1]) if type(module).__name__ == "Conv1D" else (w.shape[1], w.shape[0]))
    return shapes


def lora_params_per_rank(model: nn.Module) -> int:
    """Trainable LoRA parameters per unit of rank over the whole model: sum of (in + out) of every target."""
    return len(decoder_layers(model)) * sum(i + o for i, o in _attention_projections(model))


def matched_lora_rank(model: nn.Module, target_params: int) -> int:
    """The rank whose LoRA count is closest to target_params; raises if it is not within 1%."""
    per_rank = lora_params_per_rank(model)
    r = max(1, round(target_params / per_rank))
    if abs(r * per_rank - target_params) > 0.01 * target_params:
        raise ValueError(f"No LoRA rank comes within 1% of {target_params:,} parameters "
                         f"(r={r} gives {r * per_rank:,}).")
    return r


def attach_lora(model: nn.Module, rank: int, dtype: torch.dtype = torch.float32):
    """Wrap `model` with PEFT LoRA (alpha = 2r, dropout 0) on the attention projections; returns the PeftModel.

    The LoRA weights get `dtype` (the precision's adapter dtype): PEFT by itself would upcast them to
    float32 on a bf16 base, which is not pure bf16."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, bias="none",
                        target_modules=family_of(model).lora_targets, task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config, autocast_adapter_dtype=False)
    for name, param in peft_model.named_parameters():
        if "lora_" in name:
            param.data = param.data.to(dtype)
    return peft_model


def merged_for_evaluation(model: nn.Module) -> nn.Module:
    """The model with every LoRA layer's low-rank product merged into its base weight, as users do before serving: the
    same function (up to rounding) at the base model's cost, where an unmerged rank-r LoRA adds two matmuls per
    projection. In place; preproj's own modules are nonlinear, never merge, and stay as they are (preproj+lora)."""
    from peft.tuners.lora import LoraLayer

    for module in model.modules():
        if isinstance(module, LoraLayer) and not module.merged:
            module.merge()
    return model


@contextlib.contextmanager
def merged_lora(model: nn.Module):
    """`model` with its LoRA layers merged while the block runs (scoring at the base's cost, as merged_for_evaluation),
    and exactly as it was afterwards: each merged base weight is restored from a copy, not by subtracting the product
    again, which would leave rounding in the weights of a model the caller goes on using."""
    from peft.tuners.lora import LoraLayer

    layers = [m for m in model.modules() if isinstance(m, LoraLayer) and not m.merged]
    saved = [m.get_base_layer().weight.detach().clone() for m in layers]
    try:
        for module in layers:
            module.merge()
        yield model
    finally:
        with torch.no_grad():
            for module, weight in zip(layers, saved, strict=True):
                if module.merged:
                    module.unmerge()
                module.get_base_layer().weight.copy_(weight)
