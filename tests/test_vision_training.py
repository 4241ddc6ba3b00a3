"""`preproj pretrain --task mnist`: the vision classifier through the text side's loop (counts, learning, per-item
files, the model directory, resume, bad input)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SMALL_MNIST, small_mnist
from safetensors.torch import load_file
from torch.utils.flop_counter import FlopCounterMode

from preproj.cli import main
from preproj.core.adapter import load_adapter
from preproj.methods import build_method
from preproj.training.scratch import PretrainArgs, pretrain, pretrain_methods
from preproj.training.scratch_vision import _flops_per_patch, vision_shape
from preproj.vision import ImageClassifier


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return small_mnist(tmp_path_factory.mktemp("data"))


def tiny(root: Path, out: Path, **overrides) -> PretrainArgs:
    return replace(PretrainArgs(task="mnist", out=str(out), data_dir=str(root), layers=2, d_model=32, heads=2,
                                patch_size=7, batch_size=32, epochs=2, lr=3e-3, warmup=2, eval_every=8,
                                eval_batches=2, save_every=4, precision="fp32", device="cpu", compile=False),
                   **overrides)


@pytest.mark.parametrize("mode", pretrain_methods())
def test_flops_per_patch_agree_with_torch_flop_counter(mode):
    """The count against FlopCounterMode on one forward and backward pass with eager attention, every weight
    trainable; the head's share per patch is rounded down, so the totals agree to its remainder."""
    shape = vision_shape(PretrainArgs(task="mnist", layers=2, d_model=32, heads=2, patch_size=7))
    torch.manual_seed(0)
    model = build_method(ImageClassifier(shape), mode).requires_grad_(True)
    model.encoder.set_attn_implementation("eager")
    batch, patches = 3, shape.grid ** 2
    with FlopCounterMode(display=False) as counter:
        model(torch.rand(batch, 1, 28, 28), torch.tensor([0, 1, 2])).backward()
    counted, ours = counter.get_total_flops(), _flops_per_patch(shape, mode, patches) * batch * patches
    assert 0 <= counted - ours < batch * patches, (counted, ours)


@pytest.mark.parametrize("match", ["params", "flops"])
def test_a_plain_vision_model_matched_to_the_adapted_one_is_within_two_percent(match):
    args = PretrainArgs(task="mnist", layers=3, d_model=64, heads=4, method="base", match=match)
    plain, adapted = vision_shape(args), vision_shape(replace(args, method="preproj+skip", match=None))
    assert plain.config().intermediate_size > adapted.config().intermediate_size
    patches = plain.grid ** 2
    if match == "params":
        def measure(shape, mode):
            return sum(p.numel() for p in build_method(ImageClassifier(shape), mode).parameters())
    else:
        def measure(shape, mode):
            return _flops_per_patch(shape, mode, patches)
    assert abs(measure(plain, "base") / measure(adapted, "preproj+skip") - 1) < 0.02


def test_pretraining_on_mnist_learns_and_writes_per_item_files_and_a_model_directory(data, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["pretrain", "--task", "mnist", "--out", str(out), "--data-dir", str(data), "--layers", "2",
                 "--d-model", "32", "--heads", "2", "--patch-size", "7", "--batch-size", "32", "--epochs", "4",
                 "--lr", "3e-3", "--warmup", "2", "--eval-every", "16", "--eval-batches", "2",
                 "--precision", "fp32", "--device", "cpu", "--no-compile", "--quiet"]) == 0
    said = capsys.readouterr().out
    assert "summary: preproj+skip from scratch" in said and "test accuracy" in said and "patches/s" in said
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 4 * 512 // 32
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["heldout_loss"] < 0.8 * log[0]["heldout_loss"]
    assert summary["accuracy"]["test"] > 0.3  # ten classes: chance is 0.1
    for task in ("mnist", "mnist_shuffled"):
        items = [json.loads(line) for line in (out / f"items.{task}.jsonl").read_text().splitlines()]
        assert [r["index"] for r in items] == list(range(SMALL_MNIST["test"]))
        assert {r["task"] for r in items} == {task}
        assert abs(np.mean([r["acc"] for r in items]) - summary["accuracy"][task.replace("mnist", "test")]) < 1e-9
    # the directory is the model: loaded with its adapter, it gives the scores the run reported
    model = load_adapter(ImageClassifier.from_pretrained(out), out / "adapter").eval()
    with np.load(data / "mnist" / "mnist.npz") as data:
        images, labels = torch.from_numpy(data["test_images"]).unsqueeze(1), torch.from_numpy(data["test_labels"])
    with torch.no_grad():
        logits = model(images)
    items = [json.loads(line) for line in (out / "items.mnist.jsonl").read_text().splitlines()]
    assert (logits.argmax(-1) == labels).tolist() == [r["acc"] == 1.0 for r in items]
    losses = torch.nn.functional.cross_entropy(logits, labels.long(), reduction="none")
    assert torch.allclose(losses, torch.tensor([r["loss"] for r in items]), atol=1e-5)


def test_a_killed_vision_run_resumes_to_the_same_weights_bitwise(data, tmp_path, monkeypatch):
    pretrain(tiny(data, tmp_path / "full"), progress=False)
    forward, calls = ImageClassifier.forward, {"n": 0}

    def killed(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 1 + 2 + 6:  # structure check, held-out loss (2 batches), step 7 of 32
            raise KeyboardInterrupt("killed")
        return forward(self, *a, **k)

    monkeypatch.setattr(ImageClassifier, "forward", killed)
    with pytest.raises(KeyboardInterrupt):
        pretrain(tiny(data, tmp_path / "killed"), progress=False)
    monkeypatch.setattr(ImageClassifier, "forward", forward)
    assert torch.load(tmp_path / "killed" / "checkpoint" / "state.pt", weights_only=True)["step"] == 4
    pretrain(tiny(data, tmp_path / "killed", resume=True), progress=False)
    for name in ("model.safetensors", "adapter/adapter_model.safetensors"):
        a, b = load_file(tmp_path / "full" / name), load_file(tmp_path / "killed" / name)
        assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a), name
    items = [(tmp_path / run / "items.mnist.jsonl").read_text() for run in ("full", "killed")]
    assert items[0] == items[1]


@pytest.mark.parametrize("argv, message", [
    (["--patch-size", "5"], "patches of 5 pixels do not tile a 28-pixel image"),
    (["--task", "cifar"], "--task must be one of text, mnist"),
    (["--epochs", "0"], "argument --epochs: must be > 0"),
    (["--data-dir", "{tmp}/nowhere"], "nowhere' is not a directory"),
    (["--data-dir", "{tmp}"], "MNIST needs mnist/mnist.npz in the data directory"),
])
def test_bad_vision_arguments_are_refused_in_one_line_and_leave_no_run_directory(argv, message, data, tmp_path,
                                                                                capsys):
    out = tmp_path / "run"
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    base = ["pretrain", "--task", "mnist", "--out", str(out), "--data-dir", str(data), "--device", "cpu"]
    assert main([*base, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists()
