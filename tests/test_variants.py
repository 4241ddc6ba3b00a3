"""The block changes the content skip is compared with from scratch: gated attention (per channel and per head),
the value residual and the pre-attention MLP. Each is checked against a written-out reference of its formula, at
the point where it equals the plain model when it has one, through the K/V cache, and through save and load."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import TINY_CONFIGS
from transformers import AutoModelForCausalLM

from preproj import attach, detach, load_adapter, save_adapter
from preproj.core.attach import adapted_layers
from preproj.core.config import PreProjConfig

VARIANTS = ["gate", "gate-head", "value-residual", "pre-mlp", "preproj+skip+gate",
            "preproj+skip+gate-head+value-residual+pre-mlp"]


@pytest.fixture(scope="module")
def base():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(TINY_CONFIGS["llama"]()).eval()


def ids(n: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 90, (2, n), generator=torch.Generator().manual_seed(seed))


def logits(model, x) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=x).logits


@pytest.mark.parametrize("mode", VARIANTS)
def test_a_variant_changes_the_model_adds_what_it_counts_and_detaches_cleanly(base, mode):
    model = attach(copy.deepcopy(base), PreProjConfig(mode=mode))
    config, layers = base.config, len(adapted_layers(model))
    width = config.num_attention_heads * (config.hidden_size // config.num_attention_heads)
    added = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert added == PreProjConfig(mode=mode).added_params(layers, config.hidden_size, width, config.num_attention_heads)
    x = ids()
    assert not torch.allclose(logits(model, x), logits(base, x), atol=1e-4)
    detach(model)
    assert torch.equal(logits(model, x), logits(base, x))  # the hooks went with the wrappers


@pytest.mark.parametrize("mode", VARIANTS)
def test_cached_generation_equals_generation_without_the_cache(base, mode):
    model = attach(copy.deepcopy(base), PreProjConfig(mode=mode))
    prompt = ids(5)[:1]
    cached = model.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0)
    uncached = model.generate(prompt, max_new_tokens=8, do_sample=False, use_cache=False, pad_token_id=0)
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("mode", VARIANTS)
def test_save_and_load_give_the_same_model(base, mode, tmp_path):
    model = attach(copy.deepcopy(base), PreProjConfig(mode=mode))
    save_adapter(model, tmp_path)
    loaded = load_adapter(copy.deepcopy(base), tmp_path)
    x = ids()
    assert torch.equal(logits(loaded, x), logits(model, x))


def test_activation_checkpointing_gives_the_same_gradients(base):
    """The hooks run again when a layer is recomputed: the first layer's values, the gate's input and the pre-MLP
    must come out as in the first pass."""
    x, grads = ids(16), []
    for checkpointing in (False, True):
        torch.manual_seed(1)
        model = attach(copy.deepcopy(base), PreProjConfig(mode=VARIANTS[-1])).train().requires_grad_(True)
        if checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        model(input_ids=x, labels=x, use_cache=False).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys() and all(torch.equal(grads[0][k], grads[1][k]) for k in grads[0])


def test_the_value_residual_at_lambda_0_1_and_the_pre_mlp_at_zero_are_the_plain_model(base):
    x = ids()
    model = attach(copy.deepcopy(base), PreProjConfig(mode="value-residual+pre-mlp"))
    with torch.no_grad():
        for _, wrapper in adapted_layers(model):
            if wrapper.value_mix is not None:
                wrapper.value_mix.copy_(torch.tensor([0.0, 1.0]))
            wrapper.pre_mlp.down.weight.zero_()
    assert torch.allclose(logits(model, x), logits(base, x), atol=1e-6)


def test_the_value_residual_mixes_the_first_adapted_layers_values(base):
    """λ = (1, 0) hands every later layer exactly the first layer's values: a reference that recomputes them."""
    model = attach(copy.deepcopy(base), PreProjConfig(mode="value-residual", layers=[1, 2]))
    with torch.no_grad():
        for _, wrapper in adapted_layers(model):
            if wrapper.value_mix is not None:
                wrapper.value_mix.copy_(torch.tensor([1.0, 0.0]))
    seen = {}
    hooks = [wrapper.base_layer.v_proj.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(i, out))
             for i, wrapper in adapted_layers(model)]
    logits(model, ids())
    for h in hooks:
        h.remove()
    assert adapted_layers(model)[0][1].value_mix is None  # layer 1 is the first adapted one: it is mixed in
    assert torch.equal(seen[2], seen[1])


def test_the_gate_at_zero_weights_halves_the_attention_output(base):
    """σ(0) = ½ on every channel: the plain model with each output projection halved. No identity point exists
    (Qiu et al. train the gate from scratch), so this is the reference."""
    gated = attach(copy.deepcopy(base), PreProjConfig(mode="gate"))
    with torch.no_grad():
        for _, wrapper in adapted_layers(gated):
            wrapper.attn_gate.weight.zero_()
    halved = copy.deepcopy(base)
    with torch.no_grad():
        for layer in halved.model.layers:
            layer.self_attn.o_proj.weight.mul_(0.5)
    x = ids()
    assert torch.allclose(logits(gated, x), logits(halved, x), atol=1e-6)


def test_one_gate_per_head_is_the_channel_gate_with_its_rows_repeated_over_the_head(base):
    per_head = attach(copy.deepcopy(base), PreProjConfig(mode="gate-head"))
    per_channel = attach(copy.deepcopy(base), PreProjConfig(mode="gate"))
    head_dim = base.config.hidden_size // base.config.num_attention_heads
    with torch.no_grad():
        for (_, head), (_, channel) in zip(adapted_layers(per_head), adapted_layers(per_channel)):
            channel.attn_gate.weight.copy_(head.attn_gate.weight.repeat_interleave(head_dim, dim=0))
    x = ids()
    assert torch.allclose(logits(per_head, x), logits(per_channel, x), atol=1e-6)


def test_the_pre_mlp_is_a_half_mlp_on_the_residual_stream_before_the_block(base):
    """Reference: the layer run by hand on x + ½ W_down silu(W_up RMSNorm(x))."""
    model = attach(copy.deepcopy(base), PreProjConfig(mode="pre-mlp", layers=[0]))
    layer, wrapper = model.model.layers[0], adapted_layers(model)[0][1]
    seen = {}

    def record(module, args, kwargs):
        seen.setdefault("x_hat", kwargs.get("hidden_states", args[0] if args else None))

    hook = wrapper.base_layer.register_forward_pre_hook(record, with_kwargs=True)
    x = model.model.embed_tokens(ids())
    mlp = wrapper.pre_mlp
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + mlp.norm.eps) * mlp.norm.weight
    expected = x + 0.5 * torch.nn.functional.silu(normed @ mlp.up.weight.T) @ mlp.down.weight.T
    logits(model, ids())
    hook.remove()
    assert torch.allclose(seen["x_hat"], layer.input_layernorm(expected), atol=1e-5)


@pytest.mark.parametrize("mode, family, message", [
    ("gate", "gpt2", "gated attention needs the attention's output projection"),
    ("value-residual", "gpt_neox", "the value residual needs the attention's value projection"),
])
def test_a_block_without_the_projection_a_change_needs_is_refused_and_left_as_it_was(mode, family, message):
    model = AutoModelForCausalLM.from_config(TINY_CONFIGS[family]())
    before = {n: p.requires_grad for n, p in model.named_parameters()}
    with pytest.raises(ValueError, match=message):
        attach(model, PreProjConfig(mode=mode))
    assert {n: p.requires_grad for n, p in model.named_parameters()} == before
    assert not hasattr(model, "preproj_config")


def test_peft_refuses_the_block_changes_with_a_reason():
    from preproj.peft import PreProjPeftConfig

    with pytest.raises(ValueError, match="attach the block changes with preproj.attach"):
        PreProjPeftConfig(mode="gate")


def test_a_mode_names_its_components_once_in_a_fixed_order():
    assert PreProjConfig(mode="gate+skip+preproj").mode == "preproj+skip+gate"
    for bad in ("attention", "gate+gate-head", "skip+skip", ""):
        with pytest.raises(ValueError, match="must join some of"):
            PreProjConfig(mode=bad)
