"""The model-family table: everything the library knows about a decoder's layout, in one place.

attach, the LoRA baselines, the fused loss and inspect all read this table; adding a family is
adding one row.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    layers: str
    """Dotted path from the *ForCausalLM to the ModuleList of decoder layers."""
    attention: str
    """Attribute of a decoder layer holding its attention module (the one that gets wrapped)."""
    input_norm: str
    """The block's existing attention-input norm (x̂ = Norm(x), PAPER.md §1)."""
    lora_targets: str
    """Regex over module names matching the attention projections that LoRA adapts (PAPER.md §2).
    `base_layer.` appears when the pre-projection wraps the attention (method preproj+lora)."""


FAMILIES = (
    Family("gpt_neox", ("gpt_neox",), "gpt_neox.layers", "attention", "input_layernorm",
           r".*\.attention\.(base_layer\.)?(query_key_value|dense)"),
    Family("llama", ("llama", "mistral", "qwen2"), "model.layers", "self_attn", "input_layernorm",
           r".*\.self_attn\.(base_layer\.)?(q_proj|k_proj|v_proj|o_proj)"),
    # GPT-2's c_proj also names an MLP layer, hence the anchored attention prefix.
    Family("gpt2", ("gpt2",), "transformer.h", "attn", "ln_1", r".*\.attn\.(base_layer\.)?(c_attn|c_proj)"),
)


def supported_model_types() -> list[str]:
    return [t for f in FAMILIES for t in f.model_types]


def family_of(model: nn.Module) -> Family:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    supported = "; ".join(f"{f.name}: {', '.join(f.model_types)}" for f in FAMILIES)
    raise ValueError(
        f"preproj does not support model_type {model_type!r} ({type(model).__name__}). "
        f"Supported families (model_type): {supported}."
    )


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a causal LM or of its bare base model."""
    family = family_of(model)
    path = family.layers.split(".")
    for candidate in (path, path[1:]):  # *ForCausalLM, then the bare *Model
        module = model
        try:
            for name in candidate:
                module = getattr(module, name)
        except AttributeError:
            continue
        if isinstance(module, nn.ModuleList):
            return module
    raise ValueError(f"Could not find the decoder layers of {type(model).__name__} at '{family.layers}'.")


def hidden_size(model: nn.Module) -> int:
    return int(model.config.hidden_size)
