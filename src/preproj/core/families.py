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
    input_norm: str | None
    """The block's existing attention-input norm (x̂ = Norm(x), docs/method.md: the two modules); None where
    attention reads the residual stream itself (then x̂ = x)."""
    lora_targets: str
    """Regex over module names matching the attention projections that LoRA adapts (docs/method.md: the frozen probe).
    `base_layer.` appears when the pre-projection wraps the attention (method preproj+lora)."""
    pre_norm_flag: str | None = None
    """A config attribute that, when False, makes the block post-norm: attention then reads the un-normed
    residual stream (OPT's do_layer_norm_before)."""
    skip_after: str | None = None
    """The norm a block applies to its attention output before the residual add (Gemma-2/3, OLMo-2); the
    content skip is added after it, so that it bypasses the attention branch as a whole."""
    decision: str = ""
    """Where the block is not plain pre-norm, what preproj does there and why."""
    output_proj: str | None = "o_proj"
    """The attention's output projection (an nn.Linear), whose input gated attention gates; None where unknown."""
    value_proj: str | None = "v_proj"
    """The attention's own value projection, whose output the value residual mixes; None where Q, K, V are fused."""


_QKVO = r".*\.self_attn\.(base_layer\.)?(q_proj|k_proj|v_proj|o_proj)"
FAMILIES = (
    Family("gpt_neox", ("gpt_neox",), "gpt_neox.layers", "attention", "input_layernorm",
           r".*\.attention\.(base_layer\.)?(query_key_value|dense)", output_proj="dense", value_proj=None),
    Family("llama", ("llama", "mistral", "qwen2", "qwen3", "gemma"), "model.layers", "self_attn", "input_layernorm",
           _QKVO),
    Family("phi3", ("phi3",), "model.layers", "self_attn", "input_layernorm",
           r".*\.self_attn\.(base_layer\.)?(qkv_proj|o_proj)", value_proj=None),
    Family("gemma2", ("gemma2", "gemma3_text"), "model.layers", "self_attn", "input_layernorm", _QKVO,
           skip_after="post_attention_layernorm",
           decision="Gemma-2/3 norm the attention output before the residual add. The skip is added after that "
                    "norm, x + Norm(attn(x̃)) + W_skip x̃: the paper's out = x + attention branch + W_skip x̃, a "
                    "bypass of the whole branch. Inside the norm it would compete with the attention output for "
                    "the norm's fixed scale, and the paper's init would no longer start near the base."),
    Family("olmo2", ("olmo2",), "model.layers", "self_attn", None, _QKVO, skip_after="post_attention_layernorm",
           decision="OLMo-2 has no attention-input norm (it norms after attention), so x̂ is the residual stream "
                    "that attention reads, and the skip is added after the attention-output norm, as for Gemma-2."),
    # GPT-J is a parallel block (attention and MLP both read ln_1), where the skip on attention's output is exact.
    # The vision side's models (preproj.vision): transformers' Pixtral blocks, pre-norm, RoPE inside attention.
    Family("pixtral", ("pixtral",), "encoder.transformer.layers", "attention", "attention_norm",
           r".*\.attention\.(base_layer\.)?(q_proj|k_proj|v_proj|o_proj)"),
    Family("gptj", ("gptj",), "transformer.h", "attn", "ln_1",
           r".*\.attn\.(base_layer\.)?(q_proj|k_proj|v_proj|out_proj)", output_proj="out_proj"),
    Family("opt", ("opt",), "model.decoder.layers", "self_attn", "self_attn_layer_norm",
           r".*\.self_attn\.(base_layer\.)?(q_proj|k_proj|v_proj|out_proj)", pre_norm_flag="do_layer_norm_before",
           output_proj="out_proj",
           decision="Post-norm OPT (do_layer_norm_before=False, OPT-350M) feeds attention the un-normed residual "
                    "stream, so there x̂ is that stream, as for OLMo-2; pre-norm OPT is plain."),
    # GPT-2's c_proj also names an MLP layer, hence the anchored attention prefix.
    Family("gpt2", ("gpt2",), "transformer.h", "attn", "ln_1", r".*\.attn\.(base_layer\.)?(c_attn|c_proj)",
           output_proj=None, value_proj=None),  # GPT-2's projections are Conv1D, and Q, K, V one fused c_attn
)


def supported_model_types() -> list[str]:
    return [t for f in FAMILIES for t in f.model_types]


def family_of(model: nn.Module, config=None) -> Family:
    """The model's row of the table, or the structure a PreProjConfig names for a decoder not in it."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    structure = getattr(config or getattr(model, "preproj_config", None), "structure", None)
    if structure:
        return Family("custom", (model_type,), structure["layers"], structure["attention"], structure.get("input_norm"),
                      lora_targets="", output_proj=structure.get("output_proj"), value_proj=structure.get("value_proj"))
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    supported = "; ".join(f"{f.name}: {', '.join(f.model_types)}" for f in FAMILIES)
    raise ValueError(
        f"preproj does not support model_type {model_type!r} ({type(model).__name__}). "
        f"Supported families (model_type): {supported}. For another decoder, name its layers, attention and "
        "attention-input norm in PreProjConfig(structure={'layers': ..., 'attention': ..., 'input_norm': ...})."
    )


def input_norm_of(model: nn.Module, family: Family | None = None) -> str | None:
    """The attribute of a decoder layer whose output attention reads in this model (None: the layer's input)."""
    family = family or family_of(model)
    if family.pre_norm_flag is not None and not getattr(model.config, family.pre_norm_flag, True):
        return None
    return family.input_norm


def decoder_layers(model: nn.Module, family: Family | None = None) -> nn.ModuleList:
    """The decoder layers of a causal LM or of its bare base model."""
    family = family or family_of(model)
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
    raise ValueError(f"Could not find the decoder layers of {type(model).__name__} at '{family.layers}' "
                     "(a ModuleList).")


def check_structure(model: nn.Module, family: Family) -> None:
    """Refuse a block whose attention does not read what the table says: one forward pass of four tokens,
    in which layer 0's attention must receive exactly its input norm's output (or, for a block without
    one, the layer's own input)."""
    import torch

    layer = decoder_layers(model, family)[0]
    attention = getattr(layer, family.attention, None)
    norm_name = input_norm_of(model, family)
    norm = getattr(layer, norm_name, None) if norm_name else None
    if attention is None or (norm_name and norm is None):
        missing = family.attention if attention is None else norm_name
        raise ValueError(f"{type(model).__name__}: decoder layer 0 has no attribute {missing!r}; check the "
                         f"{family.name} structure (layers={family.layers!r}, attention={family.attention!r}, "
                         f"input_norm={norm_name!r}).")
    params = list(model.parameters())
    if not params or params[0].device.type == "meta":
        return  # nothing to run: weights not materialised yet
    seen = {}

    def record(key):
        def hook(module, args, kwargs_or_output, *rest):
            if key == "expected" and norm is not None:  # a forward hook: (module, args, output)
                value = kwargs_or_output
            else:  # a pre-hook with kwargs: (module, args, kwargs)
                value = kwargs_or_output.get("hidden_states", args[0] if args else None)
            seen.setdefault(key, value if isinstance(value, torch.Tensor) else None)
        return hook

    hooks = [attention.register_forward_pre_hook(record("attention"), with_kwargs=True)]
    if norm is not None:
        hooks.append(norm.register_forward_hook(record("expected")))
    else:
        hooks.append(layer.register_forward_pre_hook(record("expected"), with_kwargs=True))
    try:
        with torch.no_grad():
            if hasattr(model, "example_input"):  # a model that does not read token ids (the vision classifier)
                model(**model.example_input())
            else:
                model(input_ids=(torch.arange(4, device=params[0].device) % model.config.vocab_size)[None])
    finally:
        for h in hooks:
            h.remove()
    what = f"the output of {norm_name}" if norm is not None else "the decoder layer's own input"
    received = seen.get("attention")
    if received is None or seen.get("expected") is None or received.shape != seen["expected"].shape \
            or not torch.equal(received, seen["expected"]):
        raise ValueError(f"{type(model).__name__}: the attention module {family.attention!r} of layer 0 does not "
                         f"receive {what}, so the pre-projection would not sit where the method puts it "
                         "(docs/method.md). Check the structure (layers, attention, input_norm) for this model.")


def hidden_size(model: nn.Module) -> int:
    return int(model.config.hidden_size)
