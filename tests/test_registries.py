"""One table per kind of thing: a task and a method registered from test code alone run through `compare` and
appear in its report, with no file of preproj changed."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from conftest import data_dir

from preproj.evaluation.tasks import TASK_TABLE, Metric, Task, register_task
from preproj.experiments import compare
from preproj.experiments.compare import CompareArgs, run_compare
from preproj.methods import METHODS, Method, register_method


def copy_task(score, protocol, limit, data_dir, items=None, notes=None):
    """Continue "a b c" with " d": the log-likelihood of the continuation and whether greedy decoding hits it."""
    pairs = [score.encode_pair(f"{w} {w} {w}", f" {w}") for w in ("a", "b", "c", "d")[: limit or 4]]
    results = score(pairs, desc="copy")
    if items is not None:
        items += [{"index": i, "ll": ll, "acc": float(hit), "tokens": len(p[1])}
                  for i, ((ll, hit), p) in enumerate(zip(results, pairs))]
    return {"copy_acc": sum(float(hit) for _, hit in results) / len(results), "n": len(results)}


def build_scaled_norm(model, precision, lora_rank):
    """A toy method: one trainable scale on the final norm's output (what the LM head reads)."""
    model.requires_grad_(False)
    model.toy_scale = torch.nn.Parameter(torch.ones(()))
    model.model.norm.register_forward_hook(lambda module, args, out: out * model.toy_scale)
    return model


@pytest.mark.integration
def test_a_toy_task_and_method_run_through_compare_into_its_report(registries, tmp_path, monkeypatch, smollm2):
    _, tokenizer = smollm2
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                      max_position_embeddings=512, tie_word_embeddings=True)
    model_dir = tmp_path / "tiny"
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)

    register_task(Task("copy", "repeat the word", copy_task,
                       {"harness": (Metric("copy_acc", "Copy acc", True, "accuracy", lambda r: r["acc"]),)}))
    register_method(Method("scaled-head", "a trainable scale before the LM head", build_scaled_norm,
                           save=lambda model, out: out.mkdir(parents=True, exist_ok=True)))
    small = {**compare.PRESETS["cpu"]["train"], "seq_len": 32, "batch_size": 2, "eval_every": 2, "save_every": 2}
    monkeypatch.setitem(compare.PRESETS["cpu"], "train", small)
    monkeypatch.setitem(compare.PRESETS["cpu"], "eval", {**compare.PRESETS["cpu"]["eval"], "max_length": 256})
    args = CompareArgs(model=str(model_dir), methods="base,scaled-head", steps=2, limit=2, data_dir=str(data_dir()),
                       out=str(tmp_path / "cmp"))
    report = run_compare(args, progress=False)

    assert set(report["methods"]) == {"base", "scaled-head"}
    assert report["methods"]["scaled-head"]["trainable_params"] == 1
    assert "copy.copy_acc" in report["methods"]["scaled-head"]["metrics"]
    assert any(p["metric"] == "copy.copy_acc" and p["method"] == "scaled-head" for p in report["paired"])
    text = (tmp_path / "cmp" / "report.md").read_text()
    assert "| Copy acc |" in text.replace(" | train tokens", " |") and "| scaled-head |" in text
    assert json.loads((tmp_path / "cmp" / "results.json").read_text())["methods"]["scaled-head"]["lr"] == 3e-4


def test_a_name_already_in_a_table_is_refused(registries):
    with pytest.raises(ValueError, match="already registered"):
        register_task(TASK_TABLE["lambada"])
    with pytest.raises(ValueError, match="already registered"):
        register_method(METHODS["lora"])
