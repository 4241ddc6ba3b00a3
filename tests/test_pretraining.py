"""`preproj pretrain`: shapes, counts, matched baselines, training from scratch and the model directory."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import preproj
from preproj.cli import main
from preproj.methods import build_method
from preproj.training.probes import first_token_attention, uniform_first_token_attention
from preproj.training.scratch import (
    PretrainArgs,
    Shape,
    build_model,
    count_params,
    matched_plain,
    pretrain,
    pretrain_methods,
    train_flops_per_token,
    train_tokenizer,
)

SHAPES = [Shape(2, 64, 4, 4, 176, 300), Shape(3, 48, 6, 2, 128, 512)]  # MHA, and GQA 6/2
CORPUS = ["the cat sat on the mat and the dog ate the bone while the bird sang a song. " * 2] * 200


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(CORPUS, 300)


def built(shape: Shape, mode: str, tokenizer, context: int = 64):
    return build_method(build_model(shape, context, tokenizer, seed=0), mode).requires_grad_(True)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", pretrain_methods())
def test_parameter_count_is_the_models(shape, mode, tokenizer):
    shape = replace(shape, vocab=len(tokenizer))
    assert sum(p.numel() for p in built(shape, mode, tokenizer).parameters()) == count_params(shape, mode)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", pretrain_methods())
def test_flops_per_token_agree_with_torch_flop_counter(shape, mode, tokenizer):
    """The matcher's count against FlopCounterMode on one forward and backward pass (eager attention, whose
    score products the counter sees as matmuls), every weight trainable."""
    shape = replace(shape, vocab=len(tokenizer))
    model = built(shape, mode, tokenizer)
    model.set_attn_implementation("eager")
    batch, seq = 2, 32
    ids = torch.randint(0, shape.vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    assert counter.get_total_flops() == train_flops_per_token(shape, mode, seq) * batch * seq


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("match", ["params", "flops"])
@pytest.mark.parametrize("to", ["preproj+skip", "preproj", "skip"])
def test_matched_plain_models_are_within_two_percent(shape, match, to, tokenizer):
    shape = replace(shape, vocab=len(tokenizer))
    plain = matched_plain(shape, match, to, seq_len=64)
    assert (plain.layers, plain.d_model, plain.heads, plain.kv_heads) == (shape.layers, shape.d_model, shape.heads,
                                                                          shape.kv_heads)
    assert plain.intermediate > shape.intermediate  # the adapted model is bigger, so the plain one widens
    if match == "params":
        have, want = sum(p.numel() for p in built(plain, "base", tokenizer).parameters()), count_params(shape, to)
    else:
        have, want = train_flops_per_token(plain, "base", 64), train_flops_per_token(shape, to, 64)
    print(f"{match} matched to {to}: plain {have:,} vs adapted {want:,} ({100 * (have / want - 1):+.2f}%)")
    assert abs(have / want - 1) < 0.02


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "repeated.txt"
    path.write_text("\n".join(CORPUS))
    return path


def small_args(out, text_file, **kw) -> PretrainArgs:
    base = dict(out=str(out), data=str(text_file), tokenizer="train:300", layers=2, d_model=64, heads=4,
                tokens=64 * 8 * 60, seq_len=64, batch_size=8, lr=3e-3, warmup=5, eval_every=20, save_every=30,
                device="cpu", precision="fp32", sample_tokens=4)
    return PretrainArgs(**{**base, **kw})


@pytest.mark.parametrize("method", ["preproj+skip", "base", "gate-head", "value-residual", "pre-mlp"])
def test_pretraining_learns_repeated_text_and_the_model_directory_round_trips(method, text_file, tmp_path):
    summary, model = pretrain(small_args(tmp_path / "run", text_file, method=method), progress=False)
    assert summary["steps"] == 60
    assert summary["final_heldout_loss"] < 0.2 * summary["initial_heldout_loss"]  # from ~ln(vocab) to memorised
    assert summary["params"] == sum(p.numel() for p in model.parameters())
    assert set(summary["samples"]) and summary["loss"]["validation"] < 0.5

    loaded, tokenizer = preproj.load_model(str(tmp_path / "run"), device="cpu")
    if method != "base":
        loaded = preproj.load_adapter(loaded, tmp_path / "run" / "adapter")
    ids = torch.tensor([tokenizer.encode(CORPUS[0][:60])])
    model.eval()
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    assert (tmp_path / "run" / "adapter").exists() == (method != "base")


def test_a_matched_baseline_reports_both_counts(text_file, tmp_path):
    summary, model = pretrain(small_args(tmp_path / "run", text_file, method="base", match="params", tokens=64 * 8 * 2),
                              progress=False)
    target = summary["matched_to"]["params"]
    assert abs(summary["params"] / target - 1) < 0.02
    assert summary["params"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("argv, message", [
    (["--d-model", "130", "--heads", "4"], "not a multiple of --heads"),
    (["--kv-heads", "3"], "must divide --heads"),
    (["--match", "params"], "use it with --method base"),
    (["--method", "lora"], "--method must be one of"),
    (["--tokenizer", "train:12"], "needs N >= 300"),
    (["--tokens", "0"], "--tokens"),
])
def test_bad_pretrain_arguments_are_refused_in_one_line(argv, message, text_file, tmp_path, capsys):
    code = main(["pretrain", "--data", str(text_file), "--out", str(tmp_path / "x"), "--device", "cpu", *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_pretrain_resumed_with_another_rate_is_refused(text_file, tmp_path):
    pretrain(small_args(tmp_path / "run", text_file, method="preproj+skip", tokens=64 * 8 * 6, save_every=3),
             progress=False)
    recorded = (tmp_path / "run" / "train_config.json").read_text()
    with pytest.raises(ValueError, match=r"started with other arguments \(lr 0\.003 -> 0\.01\)"):
        pretrain(small_args(tmp_path / "run", text_file, method="preproj+skip", tokens=64 * 8 * 6, save_every=3,
                            lr=1e-2, resume=True), progress=False)
    assert (tmp_path / "run" / "train_config.json").read_text() == recorded


def test_the_attention_on_the_first_token_of_uniform_attention_is_the_harmonic_mean(tokenizer):
    """With Q and K zeroed every score is 0: query q spreads 1/(q+1) over the q+1 positions it sees, so the mean
    over queries 1..T-1 is (H_T - 1) / (T - 1). The model keeps its own attention implementation afterwards."""
    shape = replace(SHAPES[1], vocab=len(tokenizer))
    model = built(shape, "value-residual", tokenizer)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.base_layer.q_proj.weight.zero_()
    seq = 32
    sink = first_token_attention(model, tokenizer, CORPUS, seq, 4, torch.device("cpu"), windows=6)
    harmonic = sum(1 / k for k in range(1, seq + 1))
    assert sink == pytest.approx([(harmonic - 1) / (seq - 1)] * shape.layers, rel=1e-6)
    assert uniform_first_token_attention(seq) == pytest.approx((harmonic - 1) / (seq - 1), rel=1e-12)
    assert model.config._attn_implementation == "sdpa" and model.training
