"""attach / detach on tiny models of every family: counts, exactness, K/V cache, gradients."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers
from conftest import VOCAB, input_ids, tiny_model

from preproj import PreProjConfig, attach, detach, skip_norms, trainable_parameters
from preproj.core.attach import adapted_layers, adapter_state_dict

MODES = ["preproj", "skip", "preproj+skip"]


def set_adapter(model, fill: str, std: float = 0.05, seed: int = 3) -> None:
    """'zero': W_down and W_skip to 0 (an exact no-op); 'random': non-trivial weights."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, w in adapted_layers(model):
            for name, p in w.named_parameters():
                if name.startswith("base_layer."):
                    continue
                if fill == "zero" and name in ("preproj.down.weight", "skip.weight"):
                    p.zero_()
                elif fill == "random":
                    p.copy_(torch.randn(p.shape, generator=g) * std)


def logits(model, ids=None):
    with torch.no_grad():
        return model(input_ids if ids is None else ids).logits


@pytest.mark.parametrize("mode", MODES)
def test_trainable_count_matches_formula_and_base_is_frozen(family, mode):
    model = tiny_model(family)
    d, n = model.config.hidden_size, model.config.num_hidden_layers
    attach(model, PreProjConfig(mode=mode))
    per_layer = {"preproj": 2 * d * int(1.25 * d), "skip": d * d, "preproj+skip": 2 * d * int(1.25 * d) + d * d}[mode]
    assert trainable_parameters(model) == n * per_layer
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"{name}" for name, _ in model.named_parameters()
                         if ".preproj." in name or name.endswith(".skip.weight")}
    assert all(".base_layer." not in name for name in trainable)


def test_layer_subset_and_expansion(family):
    model = tiny_model(family)
    d = model.config.hidden_size
    attach(model, PreProjConfig(layers=[0, 1], expansion=2.0, activation="gelu"))
    assert [i for i, _ in adapted_layers(model)] == [0, 1]
    assert trainable_parameters(model) == 2 * (2 * d * 2 * d + d * d)


def test_bad_layer_index_and_double_attach():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="out of range"):
        attach(model, PreProjConfig(layers=[0, 7]))
    attach(model, PreProjConfig())
    with pytest.raises(ValueError, match="already carries"):
        attach(model, PreProjConfig())


def test_unsupported_family_lists_supported():
    config = transformers.BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=1, n_head=2)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(ValueError,
                       match=r"does not support model_type 'bloom'.*gpt_neox.*llama.*qwen3.*phi3.*gptj.*opt.*gpt2"):
        attach(model, PreProjConfig())


@pytest.mark.parametrize("mode", MODES)
def test_zeroed_output_weights_are_an_exact_noop(family, mode):
    model = tiny_model(family)
    ids = input_ids()
    base = logits(model, ids)
    attach(model, PreProjConfig(mode=mode))
    set_adapter(model, "zero")
    assert torch.equal(logits(model, ids), base)


def test_zeroed_adapter_exact_on_bf16_base_with_fp32_masters(family):
    model = tiny_model(family, dtype=torch.bfloat16)
    ids = input_ids()
    base = logits(model, ids)
    attach(model, PreProjConfig())
    assert all(p.dtype == torch.float32 for p in adapter_state_dict(model).values())
    set_adapter(model, "zero")
    assert torch.equal(logits(model, ids), base)


def test_paper_init_is_close_to_base_but_not_equal(family):
    model = tiny_model(family)
    ids = input_ids()
    base = logits(model, ids)
    attach(model, PreProjConfig())
    adapted = logits(model, ids)
    assert not torch.equal(adapted, base)
    # Near, not at, the baseline (docs/method.md: the two modules): a small relative change of the logits.
    assert torch.linalg.vector_norm(adapted - base) < 0.1 * torch.linalg.vector_norm(base - base.mean())


@pytest.mark.parametrize("mode", MODES)
def test_generation_with_kv_cache_matches_without(family, mode):
    model = tiny_model(family)
    ids = input_ids(batch=2, length=6)
    base_logits = logits(model, ids)
    attach(model, PreProjConfig(mode=mode))
    set_adapter(model, "random")
    # the adapter really acts (post-norm OPT damps it most)
    assert (logits(model, ids) - base_logits).abs().max() > 1e-3

    kwargs = dict(max_new_tokens=8, do_sample=False, pad_token_id=0, return_dict_in_generate=True, output_logits=True)
    with torch.no_grad():
        cached = model.generate(ids, use_cache=True, **kwargs)
        uncached = model.generate(ids, use_cache=False, **kwargs)
    assert torch.equal(cached.sequences, uncached.sequences)
    for a, b in zip(cached.logits, uncached.logits, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def _cache_tensors(model, ids):
    with torch.no_grad():
        out = model(ids, use_cache=True)
    cache = getattr(out, "cache", None) or out.past_key_values
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


def test_kv_cache_has_exactly_the_base_shapes_dtypes_and_bytes(family):
    base = tiny_model(family)
    ids = input_ids(batch=3, length=10)
    base_cache = _cache_tensors(base, ids)
    adapted = attach(copy.deepcopy(base), PreProjConfig())
    set_adapter(adapted, "random")
    adapted_cache = _cache_tensors(adapted, ids)
    assert len(base_cache) == len(adapted_cache) == 2 * base.config.num_hidden_layers
    for b, a in zip(base_cache, adapted_cache, strict=True):
        assert (a.shape, a.dtype, a.nbytes) == (b.shape, b.dtype, b.nbytes)
        assert not torch.equal(a, b)  # computed from x̃, not x̂


def test_detach_restores_the_base_exactly(family):
    model = tiny_model(family)
    model.lm_head.weight.requires_grad_(False)  # a user's own freezing survives attach/detach
    ids = input_ids()
    names_before = [n for n, _ in model.named_parameters()]
    grad_flags = {n: p.requires_grad for n, p in model.named_parameters()}
    state_before = {k: v.clone() for k, v in model.state_dict().items()}
    base = logits(model, ids)
    attach(model, PreProjConfig())
    set_adapter(model, "random")
    detach(model)
    assert torch.equal(logits(model, ids), base)
    assert [n for n, _ in model.named_parameters()] == names_before
    assert {n: p.requires_grad for n, p in model.named_parameters()} == grad_flags
    assert all(torch.equal(v, state_before[k]) for k, v in model.state_dict().items())
    assert not hasattr(model, "preproj_config")
    assert not model.get_output_embeddings()._forward_pre_hooks


def test_frozen_head_folds_the_last_position_slice_into_one_mm():
    """generate() feeds the head hidden[:, -1:, :]; with the head frozen by attach, torch.matmul would
    expand the weight per batch row and copy it (a bmm) unless the input is made contiguous."""
    from torch.profiler import profile

    model = attach(tiny_model("llama"), PreProjConfig())
    hidden = torch.randn(4, 6, 64)[:, -1:, :]  # (B, 1, d), leading dims not contiguous
    head = model.get_output_embeddings()
    with profile() as prof:
        out = head(hidden)
    ops = {e.key for e in prof.key_averages()}
    assert "aten::mm" in ops and "aten::bmm" not in ops
    torch.testing.assert_close(out, hidden @ head.weight.T)
    detach(model)
    head.weight.requires_grad_(False)  # frozen, without the hook
    with profile() as prof:
        head(hidden)
    assert "aten::bmm" in {e.key for e in prof.key_averages()}  # the quirk the hook works around, still in torch


@pytest.mark.parametrize("checkpointing", [False, True])
def test_one_backward_step_changes_every_adapter_parameter(family, checkpointing):
    model = tiny_model(family)
    attach(model, PreProjConfig())
    if checkpointing:
        model.activation_checkpointing_enable()
    model.train()
    calls = []
    adapted_layers(model)[0][1].register_forward_hook(lambda *_: calls.append(1))
    params = adapter_state_dict(model)
    before = {k: p.detach().clone() for k, p in params.items()}
    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    optimizer = torch.optim.AdamW(params.values(), lr=1e-3)
    ids = input_ids(batch=2, length=16)
    model(ids, labels=ids).loss.backward()
    assert len(calls) == (2 if checkpointing else 1)  # checkpointing recomputes the layer in backward
    for key, p in params.items():
        assert p.grad is not None and p.grad.abs().sum() > 0, key
    optimizer.step()
    for key, p in params.items():
        assert not torch.equal(p, before[key]), key
    assert all(torch.equal(p, base_before[n]) for n, p in model.named_parameters() if not p.requires_grad)


def test_skip_norms_one_per_adapted_layer_in_order():
    model = tiny_model("llama")
    attach(model, PreProjConfig(layers=[0, 2]))
    with torch.no_grad():
        for k, (_, w) in enumerate(adapted_layers(model)):
            w.skip.weight.fill_(k + 1.0)
    d = model.config.hidden_size
    assert skip_norms(model) == pytest.approx([1.0 * d, 2.0 * d])  # ||c·1||_F = c·d for a d×d matrix
    preproj_only = attach(tiny_model("llama"), PreProjConfig(mode="preproj"))
    with pytest.raises(ValueError, match="no content skip"):
        skip_norms(preproj_only)


@pytest.mark.parametrize("mode", MODES)
def test_attention_sees_normed_input_only_in_skip_mode(family, mode):
    """'skip' feeds attention x̂ itself; the pre-projection modes feed it x̃ != x̂."""
    from preproj.core.families import decoder_layers, input_norm_of

    model = tiny_model(family)
    attach(model, PreProjConfig(mode=mode))
    layer = decoder_layers(model)[0]
    seen = {}

    def norm_hook(module, args, out):
        seen["x_hat"] = out

    def layer_hook(module, args, kwargs):  # post-norm blocks: x̂ is the layer's own input
        seen["x_hat"] = kwargs.get("hidden_states", args[0] if args else None)

    def attention_hook(module, args, kwargs):
        seen["attn_in"] = kwargs.get("hidden_states", args[0] if args else None)

    norm = input_norm_of(model)
    if norm is None:
        layer.register_forward_pre_hook(layer_hook, with_kwargs=True)
    else:
        getattr(layer, norm).register_forward_hook(norm_hook)
    adapted_layers(model)[0][1].base_layer.register_forward_pre_hook(attention_hook, with_kwargs=True)
    with torch.no_grad():
        model(input_ids(batch=1, length=5))
    assert torch.equal(seen["attn_in"], seen["x_hat"]) == (mode == "skip")


def test_attach_refuses_a_block_whose_attention_does_not_read_the_named_norm():
    wrong = {"layers": "model.layers", "attention": "self_attn", "input_norm": "post_attention_layernorm"}
    with pytest.raises(ValueError, match="does not receive the output of post_attention_layernorm"):
        attach(tiny_model("llama"), PreProjConfig(structure=wrong))
    with pytest.raises(ValueError, match="has no attribute 'attn'"):
        attach(tiny_model("llama"), PreProjConfig(structure={"layers": "model.layers", "attention": "attn"}))
    with pytest.raises(ValueError, match="structure must be a dict"):
        PreProjConfig(structure={"layers": "model.layers"})


def test_a_decoder_outside_the_table_works_from_its_three_paths(tmp_path):
    from preproj import load_adapter, save_adapter

    def bloom():
        torch.manual_seed(0)
        config = transformers.BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4)
        return transformers.AutoModelForCausalLM.from_config(config).eval()

    structure = {"layers": "transformer.h", "attention": "self_attention", "input_norm": "input_layernorm"}
    ids = input_ids()
    base = logits(bloom(), ids)
    model = attach(bloom(), PreProjConfig(structure=structure))
    set_adapter(model, "zero")
    assert torch.equal(logits(model, ids), base)  # zeroed output weights: the base exactly
    set_adapter(model, "random")
    save_adapter(model, tmp_path)
    loaded = load_adapter(bloom(), tmp_path)  # the structure travels in adapter_config.json
    assert torch.equal(logits(loaded, ids), logits(model, ids)) and not torch.equal(logits(loaded, ids), base)
    with pytest.raises(ValueError, match="does not receive the output of post_attention_layernorm"):
        attach(bloom(), PreProjConfig(structure={**structure, "input_norm": "post_attention_layernorm"}))


@pytest.mark.parametrize("name", ["gemma2", "olmo2"])
def test_the_skip_bypasses_the_attention_output_norm(name):
    """Gemma-2/3 and OLMo-2 norm the attention output: the skip is added after that norm (families.py)."""
    from preproj.core.families import decoder_layers, input_norm_of
    from preproj.core.modules import SkipAfterNorm

    model = tiny_model(name)
    norm = decoder_layers(model)[0].post_attention_layernorm
    attach(model, PreProjConfig(mode="skip"))
    set_adapter(model, "random")
    layer = decoder_layers(model)[0]
    assert isinstance(layer.post_attention_layernorm, SkipAfterNorm) \
        and layer.post_attention_layernorm.base_layer is norm
    seen = {}

    def keep(key):
        def hook(module, args, out):
            seen[key] = out
        return hook

    def keep_input(module, args, kwargs):
        seen["x_hat"] = kwargs.get("hidden_states", args[0] if args else None)

    if input_norm_of(model):
        layer.input_layernorm.register_forward_hook(keep("x_hat"))
    else:
        layer.register_forward_pre_hook(keep_input, with_kwargs=True)
    norm.register_forward_hook(keep("normed"))
    layer.post_attention_layernorm.register_forward_hook(keep("with_skip"))
    with torch.no_grad():
        model(input_ids(batch=1, length=5))
    skip = seen["x_hat"] @ layer.self_attn.skip.weight.T
    torch.testing.assert_close(seen["with_skip"] - seen["normed"], skip, rtol=1e-5, atol=1e-6)
    detach(model)
    assert decoder_layers(model)[0].post_attention_layernorm is norm
