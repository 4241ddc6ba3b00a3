"""save_adapter / load_adapter: round trip, file contents, mismatches, corrupt files, no pickles."""

from __future__ import annotations

import copy
import json
import pickle

import pytest
import torch
from conftest import input_ids, tiny_model
from safetensors.torch import load_file
from test_attach import logits, set_adapter

from preproj import AdapterError, PreProjConfig, attach, load_adapter, save_adapter
from preproj.core.adapter import config_from_metadata
from preproj.core.attach import adapter_state_dict


@pytest.fixture
def trained(tmp_path, family):
    """A model of `family` with non-trivial adapter weights, saved to tmp_path/'adapter'."""
    base = tiny_model(family)
    model = attach(copy.deepcopy(base), PreProjConfig(mode="preproj+skip"))
    set_adapter(model, "random")
    save_adapter(model, tmp_path / "adapter")
    return base, model, tmp_path / "adapter"


def test_round_trip_onto_fresh_base_gives_identical_logits(trained, family):
    _, model, directory = trained
    fresh = tiny_model(family)  # same seed, so the same base weights
    load_adapter(fresh, directory)
    ids = input_ids()
    assert torch.equal(logits(fresh, ids), logits(model, ids))
    assert fresh.preproj_config == model.preproj_config


def test_file_holds_only_adapter_tensors(trained):
    _, model, directory = trained
    tensors = load_file(directory / "adapter_model.safetensors")
    expected = adapter_state_dict(model)
    assert set(tensors) == set(expected)
    assert all(torch.equal(tensors[k], v) for k, v in expected.items())
    assert sum(t.numel() for t in tensors.values()) == sum(p.numel() for p in model.parameters() if p.requires_grad)
    meta = json.loads((directory / "adapter_config.json").read_text())
    assert meta["peft_type"] == "PREPROJ" and meta["task_type"] == "CAUSAL_LM" and meta["mode"] == "preproj+skip"
    assert config_from_metadata(meta) == model.preproj_config
    assert sorted(p.name for p in directory.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]


def test_config_round_trips_through_json():
    config = PreProjConfig(mode="skip", expansion=2.0, activation="relu", layers=[3, 1], adapter_dtype=torch.bfloat16)
    assert config.layers == [1, 3] and config.adapter_dtype == "bfloat16"
    assert PreProjConfig.from_json(config.to_json()) == config
    with pytest.raises(ValueError, match="mode must join some of"):
        PreProjConfig(mode="lora")
    with pytest.raises(ValueError, match="Unknown PreProjConfig fields"):
        PreProjConfig.from_dict({"mode": "skip", "rank": 8})


def test_bf16_adapter_dtype_is_saved_and_restored(tmp_path):
    model = attach(tiny_model("llama"), PreProjConfig(adapter_dtype="bfloat16"))
    save_adapter(model, tmp_path)
    assert all(t.dtype == torch.bfloat16 for t in load_file(tmp_path / "adapter_model.safetensors").values())
    fresh = load_adapter(tiny_model("llama"), tmp_path)
    assert all(p.dtype == torch.bfloat16 for p in adapter_state_dict(fresh).values())


@pytest.mark.parametrize(
    "other, mismatch",
    [("gpt_neox", "model family"), ("qwen2", "hidden size"), ("mistral", "layer count")],
)
def test_loading_onto_another_base_names_the_mismatch(tmp_path, other, mismatch):
    model = attach(tiny_model("llama"), PreProjConfig())  # llama: d=64, 3 layers
    save_adapter(model, tmp_path)
    target = tiny_model(other)
    with pytest.raises(AdapterError, match=mismatch):
        load_adapter(target, tmp_path)
    assert not hasattr(target, "preproj_config")


def test_layer_count_mismatch_within_a_family(tmp_path):
    import transformers
    from conftest import TINY_CONFIGS

    model = attach(tiny_model("llama"), PreProjConfig())
    save_adapter(model, tmp_path)
    config = TINY_CONFIGS["llama"]()
    config.num_hidden_layers = 5
    with pytest.raises(AdapterError, match=r"layer count mismatch \(adapter: 3, model: 5\)"):
        load_adapter(transformers.AutoModelForCausalLM.from_config(config), tmp_path)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "missing"])
def test_truncated_or_corrupt_weights_fail_clearly(trained, damage):
    base, _, directory = trained
    weights = directory / "adapter_model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "garbage":
        weights.write_bytes(b"\x00\x01not a safetensors file" * 10)
    else:
        weights.unlink()
    with pytest.raises(AdapterError,
                       match="truncated or corrupt" if damage != "missing" else "No adapter_model.safetensors"):
        load_adapter(base, directory)
    assert not hasattr(base, "preproj_config")


def test_corrupt_or_foreign_config_fails_clearly(trained):
    base, _, directory = trained
    config = directory / "adapter_config.json"
    config.write_text(config.read_text()[:40])
    with pytest.raises(AdapterError, match="not valid JSON"):
        load_adapter(base, directory)
    config.write_text(json.dumps({"peft_type": "IA3", "target_modules": ["k_proj"]}))
    with pytest.raises(AdapterError, match="not a preproj adapter config"):
        load_adapter(base, directory)
    with pytest.raises(AdapterError, match="No adapter_config.json"):
        load_adapter(base, directory / "nowhere")


def test_tensors_that_do_not_match_the_config_are_refused(trained):
    base, _, directory = trained
    meta = json.loads((directory / "adapter_config.json").read_text())
    meta["expansion"] = 2.0  # the saved up/down weights no longer have these shapes
    (directory / "adapter_config.json").write_text(json.dumps(meta))
    with pytest.raises(AdapterError, match="wrong shape"):
        load_adapter(base, directory)
    assert not hasattr(base, "preproj_config")  # the half-attached adapter was taken off again


def test_no_pickle_is_ever_loaded(trained, family, monkeypatch, tmp_path):
    base, model, directory = trained
    # A pickle beside the safetensors file must be ignored, and nothing may unpickle.
    (directory / "adapter_model.bin").write_bytes(pickle.dumps({"evil": 1}))

    def refuse(*args, **kwargs):
        raise AssertionError("a pickle was loaded")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    load_adapter(base, directory)
    ids = input_ids()
    assert torch.equal(logits(base, ids), logits(model, ids))
    # A directory with only a pickle is refused, not read.
    only_pickle = tmp_path / "pickle_only"
    only_pickle.mkdir()
    (only_pickle / "adapter_config.json").write_text((directory / "adapter_config.json").read_text())
    (only_pickle / "adapter_model.bin").write_bytes(pickle.dumps({"evil": 1}))
    with pytest.raises(AdapterError, match="never pickles"):
        load_adapter(tiny_model(family), only_pickle)


def test_save_without_adapter_is_refused(tmp_path):
    with pytest.raises(AdapterError, match="carries no preproj adapter"):
        save_adapter(tiny_model("llama"), tmp_path)


def test_save_is_atomic_and_overwrites(trained):
    _, model, directory = trained
    set_adapter(model, "random", seed=9)
    save_adapter(model, directory)
    assert not [p for p in directory.iterdir() if p.name.startswith(".")]  # no temp files left behind
    import os

    umask = os.umask(0)
    os.umask(umask)
    assert (directory / "adapter_model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask
    tensors = load_file(directory / "adapter_model.safetensors")
    assert all(torch.equal(tensors[k], v) for k, v in adapter_state_dict(model).items())


def test_adapters_written_with_a_nested_config_still_load(trained):
    """Files written before the PEFT-shaped layout kept PreProjConfig under "config"."""
    base, model, directory = trained
    meta = json.loads((directory / "adapter_config.json").read_text())
    names = set(PreProjConfig().to_dict())
    legacy = {k: v for k, v in meta.items() if k not in names} | {"config": {k: meta[k] for k in names}}
    (directory / "adapter_config.json").write_text(json.dumps(legacy))
    loaded = load_adapter(base, directory)
    ids = input_ids()
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
