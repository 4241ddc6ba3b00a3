"""Attach the adapter to a Hugging Face causal LM in place, and take it off again.

Each supported family (families.py) names where its decoder layers, attention modules and attention-input
norms live; the attention module is swapped for a `PreProjAttention` wrapper that keeps the
original as `base_layer`, so `detach` restores the base exactly.
"""

from __future__ import annotations

import torch
from torch import nn

from .config import PreProjConfig
from .families import check_structure, decoder_layers, family_of, hidden_size
from .modules import FirstValues, PreProjAttention, SkipAfterNorm, projection


def adapted_layers(model: nn.Module) -> list[tuple[int, PreProjAttention]]:
    """(layer index, wrapper) for every adapted layer, in layer order."""
    attn_name = family_of(model).attention
    return [
        (i, getattr(layer, attn_name))
        for i, layer in enumerate(decoder_layers(model))
        if isinstance(getattr(layer, attn_name), PreProjAttention)
    ]


def is_attached(model: nn.Module) -> bool:
    return getattr(model, "preproj_config", None) is not None


def attach(model: nn.Module, config: PreProjConfig | None = None) -> nn.Module:
    """Add pre-projection and/or content skip to `model` in place and freeze the base.

    Only the new parameters require grad afterwards. Returns `model`.
    """
    config = config or PreProjConfig()
    if is_attached(model):
        raise ValueError("This model already carries a preproj adapter; call preproj.detach(model) first.")
    family = family_of(model, config)
    layers = decoder_layers(model, family)
    check_structure(model, family)
    indices = list(range(len(layers))) if config.layers is None else config.layers
    bad = [i for i in indices if not 0 <= i < len(layers)]
    if bad:
        raise ValueError(f"PreProjConfig.layers {bad} out of range: the model has {len(layers)} layers "
                         f"(0..{len(layers) - 1}).")

    attention = getattr(layers[indices[0]], family.attention) if indices else None
    if config.gate:
        projection(attention, family.output_proj, "gated attention", "output")
    if config.use_value_residual:
        projection(attention, family.value_proj, "the value residual", "value")

    model._preproj_requires_grad = {n: p.requires_grad for n, p in model.named_parameters()}
    model.requires_grad_(False)
    d = hidden_size(model)
    defer = family.skip_after is not None and config.use_skip
    values = FirstValues()
    for i in indices:
        attn = getattr(layers[i], family.attention)
        device = next(attn.parameters()).device
        wrapper = PreProjAttention(attn, d, config, device=device, defer_skip=defer,
                                   **_block_shape(model, attn, family), first_layer=i == indices[0])
        wrapper._hooks = wrapper.hook_into(layers[i], attn, family.output_proj, family.value_proj, values)
        setattr(layers[i], family.attention, wrapper)
        if defer:
            setattr(layers[i], family.skip_after, SkipAfterNorm(getattr(layers[i], family.skip_after), wrapper))
    model.preproj_config = config
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None:
        model._preproj_head_hook = head.register_forward_pre_hook(_contiguous_input)
    return model


def _block_shape(model: nn.Module, attention: nn.Module, family) -> dict:
    """What the block changes size themselves by: the output projection's input width (heads x head_dim), the
    head count and the model's norm epsilon."""
    projection = getattr(attention, family.output_proj, None) if family.output_proj else None
    return {"attention_width": getattr(projection, "in_features", None),
            "heads": getattr(model.config, "num_attention_heads", None),
            "norm_eps": getattr(model.config, "rms_norm_eps", None) or 1e-6}


def _contiguous_input(module: nn.Module, args: tuple):
    # Freezing the head changes how torch.matmul treats generate()'s last-position slice
    # hidden[:, -1:, :] (B, 1, d), whose leading dims are not contiguous: with a weight that requires
    # grad it folds into one mm, with a frozen one it expands the weight to (B, d, vocab) and copies it
    # (450 MB and ~0.4 s per prefill for SmolLM2 at batch 8). A contiguous input always folds.
    x = args[0] if args else None
    if isinstance(x, torch.Tensor) and x.dim() > 2 and not x.is_contiguous():
        return (x.contiguous(), *args[1:])
    return None


def detach(model: nn.Module) -> nn.Module:
    """Remove every added module in place; the base model is exactly as before `attach`."""
    family = family_of(model)
    layers = decoder_layers(model)
    for i, wrapper in adapted_layers(model):
        for handle in wrapper._hooks:
            handle.remove()
        setattr(layers[i], family.attention, wrapper.base_layer)
        norm = getattr(layers[i], family.skip_after, None) if family.skip_after else None
        if isinstance(norm, SkipAfterNorm):
            setattr(layers[i], family.skip_after, norm.base_layer)
    flags = getattr(model, "_preproj_requires_grad", None)
    if flags is not None:
        for name, param in model.named_parameters():
            param.requires_grad_(flags.get(name, param.requires_grad))
        del model._preproj_requires_grad
    if hasattr(model, "preproj_config"):
        del model.preproj_config
    if hasattr(model, "preproj_adapter_dir"):  # where load_adapter read it from
        del model.preproj_adapter_dir
    if hasattr(model, "_preproj_head_hook"):
        model._preproj_head_hook.remove()
        del model._preproj_head_hook
    return model


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Adapter tensors only, keyed family-independently: layers.{i}.preproj.{up,down}.weight, layers.{i}.skip.weight."""
    state = {}
    for i, wrapper in adapted_layers(model):
        for name, param in wrapper.named_parameters():
            if not name.startswith("base_layer."):
                state[f"layers.{i}.{name}"] = param
    return state


def trainable_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def skip_norms(model: nn.Module) -> list[float]:
    """||W_skip||_F for each adapted layer, in layer order (docs/method.md: the skip norms by depth)."""
    layers = adapted_layers(model)
    if not layers:
        raise ValueError("The model carries no preproj adapter; attach one first.")
    if layers[0][1].skip is None:
        raise ValueError(f"The adapter's mode {model.preproj_config.mode!r} has no content skip, so there are no skip "
                         "norms.")
    return [float(torch.linalg.matrix_norm(w.skip.weight.detach().float())) for _, w in layers]
