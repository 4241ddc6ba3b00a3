"""preproj as a PEFT method, tested in the manner of PEFT's own custom-model tests, on every family."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import input_ids, tiny_model, tiny_model_dir
from peft import PeftModel, get_peft_model
from safetensors.torch import load_file

import preproj
from preproj import PreProjConfig
from preproj.peft import PreProjLayer, PreProjPeftConfig

BUSY = {"preproj_init_std": 0.05, "skip_init_std": 0.05}  # far from zero, so adapted logits differ from the base


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.fixture
def peft_pair(family):
    """(base logits, PeftModel with a busy preproj+skip adapter, its logits)."""
    ids = input_ids()
    base = tiny_model(family)
    reference = logits(base, ids)
    model = get_peft_model(base, PreProjPeftConfig(**BUSY))
    return reference, model, logits(model, ids)


def test_adapter_changes_the_output_and_disable_restores_the_base_exactly(peft_pair):
    reference, model, adapted = peft_pair
    ids = input_ids()
    assert not torch.allclose(adapted, reference, atol=1e-3)
    with model.disable_adapter():
        assert torch.equal(logits(model, ids), reference)
    assert torch.equal(logits(model, ids), adapted)
    model.base_model.disable_adapter_layers()
    assert torch.equal(logits(model, ids), reference)
    model.base_model.enable_adapter_layers()
    assert torch.equal(logits(model, ids), adapted)


def test_peft_model_computes_what_preproj_attach_computes(peft_pair, family, tmp_path):
    _, model, adapted = peft_pair
    model.save_pretrained(tmp_path)
    native = preproj.load_adapter(tiny_model(family), tmp_path)
    assert torch.equal(logits(native, input_ids()), adapted)


def test_trainable_parameters_are_the_adapter_and_match_preproj_count(peft_pair, family):
    _, model, _ = peft_pair
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".preproj_adapters.default." in n for n in trainable)
    native = preproj.attach(tiny_model(family), PreProjConfig())
    assert sum(p.numel() for n, p in model.named_parameters() if p.requires_grad) \
        == preproj.trainable_parameters(native)


def test_only_adapter_parameters_change_after_a_step(peft_pair):
    _, model, _ = peft_pair
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = input_ids()
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed == {n for n, p in model.named_parameters() if p.requires_grad}


def test_save_pretrained_round_trips_through_peft_model_from_pretrained(peft_pair, family, tmp_path):
    _, model, adapted = peft_pair
    model.save_pretrained(tmp_path)
    loaded = PeftModel.from_pretrained(tiny_model(family), tmp_path)
    assert torch.equal(logits(loaded, input_ids()), adapted)
    assert isinstance(loaded.base_model.model.get_submodule(loaded.base_model.targeted_module_names[0]), PreProjLayer)


def test_peft_and_preproj_write_the_same_files(peft_pair, family, tmp_path):
    """The same adapter saved both ways: identical tensors under identical keys, and the same config keys."""
    _, model, _ = peft_pair
    model.save_pretrained(tmp_path / "peft")
    native = preproj.load_adapter(tiny_model(family), tmp_path / "peft")
    preproj.save_adapter(native, tmp_path / "preproj")
    a, b = (load_file(tmp_path / d / "adapter_model.safetensors") for d in ("peft", "preproj"))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    ja, jb = (json.loads((tmp_path / d / "adapter_config.json").read_text()) for d in ("peft", "preproj"))
    only_peft = {"peft_version", "auto_mapping", "revision"}  # PEFT's bookkeeping, not needed to load
    assert set(ja) - only_peft == set(jb)
    assert {k: ja[k] for k in jb if k != "base_model_name_or_path"} \
        == {k: jb[k] for k in jb if k != "base_model_name_or_path"}


def test_peft_loads_an_adapter_written_by_preproj(family, tmp_path):
    model = preproj.attach(tiny_model(family), PreProjConfig(mode="skip", **BUSY))
    preproj.save_adapter(model, tmp_path)
    loaded = PeftModel.from_pretrained(tiny_model(family), tmp_path)
    assert torch.equal(logits(loaded, input_ids()), logits(model, input_ids()))
    assert loaded.peft_config["default"].mode == "skip"


def test_merge_refuses_and_unload_gives_the_base_back(peft_pair):
    reference, model, _ = peft_pair
    with pytest.raises(ValueError, match="cannot be merged"):
        model.merge_and_unload()
    with pytest.raises(ValueError, match="cannot be merged"):
        model.base_model.merge_adapter()
    base = model.unload()
    assert not any(isinstance(m, PreProjLayer) for m in base.modules())
    assert torch.equal(logits(base, input_ids()), reference)


def test_two_adapters_switch_and_refuse_to_run_together(tmp_path):
    base = tiny_model("llama")
    model = get_peft_model(base, PreProjPeftConfig(**BUSY))
    first = logits(model, input_ids())
    model.add_adapter("second", PreProjPeftConfig(mode="skip", skip_init_std=0.1))
    model.set_adapter("second")
    second = logits(model, input_ids())
    assert not torch.allclose(first, second, atol=1e-3)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        n for n, _ in model.named_parameters() if ".preproj_adapters.second." in n}
    model.set_adapter("default")
    assert torch.equal(logits(model, input_ids()), first)
    model.save_pretrained(tmp_path)  # the second adapter goes to a subfolder, as PEFT does
    again = PeftModel.from_pretrained(tiny_model("llama"), tmp_path / "second", adapter_name="second")
    assert torch.equal(logits(again, input_ids()), second)
    model.base_model.set_adapter(["default", "second"])
    with pytest.raises(ValueError, match="do not add up"):
        logits(model, input_ids())


def test_an_adapter_made_on_another_model_is_refused(tmp_path):
    get_peft_model(tiny_model("llama"), PreProjPeftConfig()).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="hidden size mismatch"):
        PeftModel.from_pretrained(tiny_model("qwen2"), tmp_path)


def test_a_model_carrying_a_native_adapter_is_refused():
    model = preproj.attach(tiny_model("llama"))
    with pytest.raises(ValueError, match="preproj.detach"):
        get_peft_model(model, PreProjPeftConfig())


def test_legacy_nested_config_loads_through_peft(tmp_path):
    model = preproj.attach(tiny_model("llama"), PreProjConfig(**BUSY))
    preproj.save_adapter(model, tmp_path)
    meta = json.loads((tmp_path / "adapter_config.json").read_text())
    names = set(PreProjConfig().to_dict())
    legacy = {k: v for k, v in meta.items() if k not in names} | {"config": {k: meta[k] for k in names}}
    (tmp_path / "adapter_config.json").write_text(json.dumps(legacy))
    loaded = PeftModel.from_pretrained(tiny_model("llama"), tmp_path)
    assert torch.equal(logits(loaded, input_ids()), logits(model, input_ids()))


def test_only_chosen_layers_are_wrapped():
    model = get_peft_model(tiny_model("llama"), PreProjPeftConfig(layers=[1]))
    assert model.base_model.targeted_module_names == ["model.layers.1.self_attn"]
    with pytest.raises(ValueError, match="out of range"):
        get_peft_model(tiny_model("llama"), PreProjPeftConfig(layers=[7]))


def test_old_peft_is_refused_with_a_clear_message():
    code = ("import importlib.metadata as m; real = m.version; "
            "m.version = lambda name: '0.20.0' if name == 'peft' else real(name); import preproj.peft")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "preproj.peft needs peft >= 0.21 (found 0.20.0)" in result.stderr


def _example():
    path = Path(__file__).resolve().parents[1] / "examples" / "trainer.py"
    spec = importlib.util.spec_from_file_location("trainer_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("where", ["unset", "missing"])
def test_the_trainer_example_without_data_says_where_to_point_it(tmp_path, where):
    """No PREPROJ_DATA_DIR (and no Hub), or a directory that is not there: one line, exit 2, before any model loads."""
    path = Path(__file__).resolve().parents[1] / "examples" / "trainer.py"
    env = {k: v for k, v in os.environ.items() if k != "PREPROJ_DATA_DIR"}
    env.update(HF_HUB_OFFLINE="1", PREPROJ_CACHE_DIR=str(tmp_path / "no-cache"))  # no model to load either
    argv = [sys.executable, str(path), "--model", str(tmp_path / "not-a-model")]
    if where == "missing":
        argv += ["--data-dir", str(tmp_path / "nowhere")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    said = done.stderr.strip().splitlines()[-1]
    assert said.startswith("trainer.py: error:") and ("PREPROJ_DATA_DIR" in said or "not a directory" in said), said


def test_transformers_trainer_trains_and_saves_the_adapter(tmp_path):
    """examples/trainer.py on a tiny Llama with a real BPE tokenizer: the loss falls, only the adapter moves, and
    the saved files load back into preproj with the trained model's logits."""
    corpus = [f"the {w} sat on the mat and the {w} ate the rat. " * 3 for w in ("cat", "dog", "owl", "fox")] * 8
    directory = tiny_model_dir(tmp_path / "model", corpus)
    model, tokenizer = preproj.load_model(str(directory))
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = _example().train(model, tokenizer, corpus, str(tmp_path / "out"), steps=12, seq_len=32, batch_size=4,
                               lr=1e-2)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses[-1] < losses[0]
    trained = trainer.model.base_model.model
    for name, param in trained.named_parameters():
        if ".preproj_adapters." not in name:
            assert torch.equal(param, base[name.replace(".base_layer", "")]), name
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "README.md", "adapter_config.json", "adapter_model.safetensors"]  # no pickle (training_args.bin)
    fresh, _ = preproj.load_model(str(directory))
    loaded = preproj.load_adapter(fresh, tmp_path / "out")
    ids = input_ids(length=10) % len(tokenizer)
    trainer.model.eval()
    assert torch.equal(logits(loaded, ids), logits(trainer.model, ids))


def test_a_decoder_outside_the_table_works_through_peft(tmp_path):
    import transformers

    def bloom():
        torch.manual_seed(0)
        config = transformers.BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=4)
        return transformers.AutoModelForCausalLM.from_config(config).eval()

    structure = {"layers": "transformer.h", "attention": "self_attention", "input_norm": "input_layernorm"}
    ids = input_ids() % 64
    model = get_peft_model(bloom(), PreProjPeftConfig(structure=structure, **BUSY))
    assert model.base_model.targeted_module_names == ["transformer.h.0.self_attention",
                                                      "transformer.h.1.self_attention"]
    model.save_pretrained(tmp_path)
    assert torch.equal(logits(preproj.load_adapter(bloom(), tmp_path), ids), logits(model, ids))
    with pytest.raises(ValueError, match="does not receive the output of post_attention_layernorm"):
        get_peft_model(bloom(), PreProjPeftConfig(structure={**structure, "input_norm": "post_attention_layernorm"}))
