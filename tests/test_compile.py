"""The compiled path: no graph break inside an adapted block of any family, a compiled run that matches eager, the
default's policy, the flags, and one line (then eager) where inductor has no C++ compiler."""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import pytest
import torch
import transformers
from conftest import FAMILY_NAMES, TINY_CONFIGS, CharTokenizer, input_ids, tiny_model

from preproj import PreProjConfig, attach
from preproj.core import compiling
from preproj.core.compiling import compiled_blocks, wants_compile
from preproj.core.families import decoder_layers
from preproj.training import TrainArgs, train

BLOCK_CHANGES = ("preproj+skip+gate", "preproj+skip+value-residual")


def first_layer_call(model, ids) -> tuple[tuple, dict]:
    """The arguments the model gives its first decoder layer in a forward of `ids`."""
    seen = {}

    def grab(module, args, kwargs):
        seen.setdefault("call", (args, kwargs))

    handle = decoder_layers(model)[0].register_forward_pre_hook(grab, with_kwargs=True)
    with torch.no_grad():
        model(ids, use_cache=False)
    handle.remove()
    return seen["call"]


def graph_breaks(model, layer_index: int = 0) -> tuple[int, list[str]]:
    torch._dynamo.reset()
    args, kwargs = first_layer_call(model, input_ids())
    layer = decoder_layers(model)[layer_index]
    explained = torch._dynamo.explain(layer)(*args, **kwargs)
    return explained.graph_break_count, [str(b.reason) for b in explained.break_reasons]


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_an_adapted_block_of_every_family_compiles_without_a_graph_break(family):
    model = attach(tiny_model(family), PreProjConfig(mode="preproj+skip"))
    count, reasons = graph_breaks(model)
    assert count == 0, reasons


@pytest.mark.parametrize("mode", BLOCK_CHANGES)
def test_the_block_changes_compile_without_a_graph_break(mode):
    model = attach(tiny_model("llama"), PreProjConfig(mode=mode))
    count, reasons = graph_breaks(model, layer_index=1)  # layer 1: the value residual mixes in layer 0's values
    assert count == 0, reasons


def compiled_graphs(model, ids) -> tuple[int, dict]:
    """(distinct graphs compiled, graph breaks by reason) for a forward and backward of `ids` under compiled_blocks."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    with compiled_blocks(model, True, "cpu"):
        model(ids, labels=ids, use_cache=False).loss.backward()
    return counters["stats"]["unique_graphs"], dict(counters["graph_break"])


@pytest.mark.parametrize("mode", ["preproj+skip", *BLOCK_CHANGES, "preproj+skip+pre-mlp"])
def test_every_layer_reuses_the_compiled_block_instead_of_compiling_its_own(mode):
    config = TINY_CONFIGS["llama"]()
    config.num_hidden_layers = 6  # recompiling per layer would show as up to 6 graphs (dynamo stops at 8)
    torch.manual_seed(0)
    model = attach(transformers.AutoModelForCausalLM.from_config(config), PreProjConfig(mode=mode)).train()
    graphs, breaks = compiled_graphs(model, input_ids())
    # Two variants of the block: the first layer's input needs no gradient (the frozen embedding), the others' do.
    # The pre-MLP runs in a forward pre-hook of the layer, which dynamo compiles as a frame of its own: one graph more.
    assert not breaks and graphs == (3 if mode.endswith("pre-mlp") else 2), (graphs, breaks)


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(f"line {i}: the quick brown fox jumps over the lazy dog {i * 7}" for i in range(120)))
    return str(path)


def six_steps(tmp_path, corpus, name: str, compile: bool) -> tuple[dict, list[dict]]:
    args = TrainArgs(model="tiny", out=str(tmp_path / name), data=corpus, steps=6, batch_size=2, seq_len=32, lr=1e-2,
                     warmup=2, eval_every=3, eval_batches=2, save_every=6, precision="fp32", device="cpu",
                     compile=compile)
    summary, model = train(args, tiny_model("llama"), CharTokenizer(), progress=False)
    log = [json.loads(line) for line in (tmp_path / name / "train_log.jsonl").read_text().splitlines()]
    assert all(layer._compiled_call_impl is None for layer in decoder_layers(model))  # eager again afterwards
    return summary, log


def test_a_compiled_six_step_run_matches_eager(tmp_path, corpus):
    eager, eager_log = six_steps(tmp_path, corpus, "eager", compile=False)
    compiled, compiled_log = six_steps(tmp_path, corpus, "compiled", compile=True)
    assert (eager["compiled"], compiled["compiled"]) == (False, True)
    assert json.loads((tmp_path / "compiled" / "train_config.json").read_text())["compile"] is True
    # Inductor fuses RMSNorm, RoPE, SiLU and the softmax and reorders their float32 sums, so an op may round
    # differently in its last bits (float32's relative 1e-7), and six AdamW steps carry that into the losses. A
    # relative 1e-4 leaves room for that growth and stays far below what a wrong graph does: a dropped skip, a mask
    # or a position error moves these losses in the first or second decimal.
    for a, b in zip(eager_log, compiled_log, strict=True):
        for key in ("loss", "heldout_loss"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-4), (a["step"], key)
    assert compiled["skip_norms"] == pytest.approx(eager["skip_norms"], rel=1e-4)
    assert compiled["first_step_seconds"] > 0 and compiled["median_step_seconds"] > 0


def test_the_default_compiles_where_it_was_measured_faster(monkeypatch):
    monkeypatch.delenv("PREPROJ_COMPILE", raising=False)
    assert wants_compile(None, "cpu", bf16=True) and not wants_compile(None, "cpu", bf16=False)
    assert wants_compile(None, "cuda", bf16=False) and not wants_compile(None, "mps", bf16=True)
    assert wants_compile(True, "cpu", bf16=False) and not wants_compile(False, "cuda", bf16=True)
    monkeypatch.setenv("PREPROJ_COMPILE", "0")
    assert not wants_compile(None, "cpu", bf16=True) and wants_compile(True, "cpu", bf16=True)
    monkeypatch.setenv("PREPROJ_COMPILE", "maybe")
    with pytest.raises(ValueError, match="PREPROJ_COMPILE must be 1 or 0"):
        wants_compile(None, "cpu", bf16=True)


def test_without_a_cpp_compiler_one_line_says_so_and_the_model_runs_eager(monkeypatch, caplog):
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    compiling.cannot_compile.cache_clear()
    model = attach(tiny_model("llama"), PreProjConfig())
    try:
        with caplog.at_level(logging.WARNING), compiled_blocks(model, True, "cpu") as compiled:
            assert not compiled
            assert all(layer._compiled_call_impl is None for layer in decoder_layers(model))
            model(input_ids())
    finally:
        compiling.cannot_compile.cache_clear()
    lines = [r.getMessage() for r in caplog.records if "compile" in r.getMessage()]
    assert len(lines) == 1 and "no C++ compiler found (/nonexistent/g++" in lines[0] and "running eager" in lines[0]


@pytest.mark.parametrize(("argv", "expected"), [([], None), (["--compile"], True), (["--no-compile"], False)])
def test_every_command_that_trains_or_scores_takes_compile_and_no_compile(argv, expected):
    from preproj.cli import build_parser

    parser = build_parser()
    for command in ("train", "pretrain", "eval", "compare", "scaling"):
        ns = parser.parse_args([command, *argv])
        assert ns.compile is expected, command


def test_a_peft_lora_model_compiles_and_scores_as_eager():
    from preproj.methods import build_method

    model = build_method(tiny_model("llama"), "lora").eval()
    ids = input_ids()
    with torch.no_grad():
        eager = model(input_ids=ids).logits
        with compiled_blocks(model, True, "cpu") as compiled:
            assert compiled
            # every model a process compiles adds variants of the one block forward; past the limit they run eager
            assert torch._dynamo.config.recompile_limit >= compiling.RECOMPILE_LIMIT
            fused = model(input_ids=ids).logits
    torch.testing.assert_close(fused, eager, rtol=1e-4, atol=1e-5)  # float32 sums reordered, nothing more


def test_a_model_that_trains_its_head_does_not_recompile_every_step():
    """The loss path of `pretrain` (the head trains, so the model's own loss runs): no K/V cache is built, whose
    per-layer slot would make dynamo compile every layer at every step."""
    from torch._dynamo.utils import counters

    from preproj.core.loss import causal_lm_loss

    model = attach(tiny_model("llama"), PreProjConfig()).requires_grad_(True).train()
    torch._dynamo.reset()
    counters.clear()
    with compiled_blocks(model, True, "cpu"):
        for _ in range(3):
            causal_lm_loss(model, input_ids(), input_ids()).backward()
    assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])


def test_a_killed_compiled_run_resumes_to_the_same_adapter_bitwise(tmp_path, corpus):
    from safetensors.torch import load_file

    def args(name: str, **kw) -> TrainArgs:
        return TrainArgs(model="tiny", out=str(tmp_path / name), data=corpus, steps=6, batch_size=2, seq_len=32,
                         lr=1e-2, warmup=2, eval_every=3, eval_batches=2, save_every=3, precision="fp32", device="cpu",
                         compile=True, **kw)

    train(args("full"), tiny_model("llama"), CharTokenizer(), progress=False)
    model = tiny_model("llama")
    body, calls = model.model, {"n": 0}
    forward = body.forward

    def killed_forward(*a, **k):  # structure check, held-out (2), 4 steps, then step 5 dies
        calls["n"] += 1
        if calls["n"] == 1 + 2 + 4 + 2 + 1:
            raise KeyboardInterrupt("killed")
        return forward(*a, **k)

    body.forward = killed_forward
    with pytest.raises(KeyboardInterrupt):
        train(args("killed"), model, CharTokenizer(), progress=False)
    with pytest.raises(ValueError, match="compile True -> False"):  # the other setting would round otherwise
        train(replace(args("killed", resume=True), compile=False), tiny_model("llama"), CharTokenizer(),
              progress=False)
    train(args("killed", resume=True), tiny_model("llama"), CharTokenizer(), progress=False)
    reference, result = (load_file(tmp_path / name / "adapter_model.safetensors") for name in ("full", "killed"))
    assert set(result) == set(reference) and all(torch.equal(result[k], reference[k]) for k in reference)
