"""`preproj pretrain --task mnist`: the vision classifier through the text side's loop (counts, learning, per-item
files, the model directory, resume, bad input)."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
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
from preproj.training.scratch_vision import train_flops_per_example, vision_shape
from preproj.vision import ClipShape, ClipTransformer, ImageClassifier, VisionShape


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return small_mnist(tmp_path_factory.mktemp("data"))


TINY = {"mnist": dict(patch_size=7, epochs=2),
        "moving-mnist": dict(patch_size=16, frames=8, context=4, tokens=32 * 64 * 32),
        "moving-mnist-direction": dict(patch_size=16, frames=8, tubelet=4, tokens=32 * 32 * 32)}
"""32 steps of 32 examples each."""


def tiny(root: Path, out: Path, task: str = "mnist", **overrides) -> PretrainArgs:
    return PretrainArgs(**{**dict(task=task, out=str(out), data_dir=str(root), layers=2, d_model=32, heads=2,
                                  batch_size=32, lr=3e-3, warmup=2, eval_every=8, eval_batches=2, save_every=4,
                                  precision="fp32", device="cpu", compile=False), **TINY[task], **overrides})


TASK_SHAPES = {
    "mnist": dict(patch_size=7),
    "moving-mnist": dict(patch_size=16, frames=8, context=4, tubelet=2),
    "moving-mnist-direction": dict(patch_size=16, frames=8, tubelet=4),
}


@pytest.mark.parametrize("task", TASK_SHAPES)
@pytest.mark.parametrize("mode", pretrain_methods())
def test_flops_per_example_agree_with_torch_flop_counter(task, mode):
    """The count against FlopCounterMode on one forward and backward pass with eager attention, every weight
    trainable."""
    shape = vision_shape(PretrainArgs(task=task, layers=2, d_model=24, heads=2, **TASK_SHAPES[task]))
    torch.manual_seed(0)
    model = build_method((ImageClassifier if task == "mnist" else ClipTransformer)(shape), mode).requires_grad_(True)
    model.encoder.set_attn_implementation("eager")
    batch = 3
    if task == "mnist":
        inputs, labels = torch.rand(batch, 1, 28, 28), torch.tensor([0, 1, 2])
    elif task == "moving-mnist":
        inputs, labels = torch.rand(batch, 4, 64, 64), torch.rand(batch, 4, 64, 64)
    else:
        inputs, labels = torch.rand(batch, 8, 64, 64), torch.tensor([0, 1, 3])
    with FlopCounterMode(display=False) as counter:
        model(inputs, labels).backward()
    assert counter.get_total_flops() == train_flops_per_example(shape, mode) * batch


@pytest.mark.parametrize("match", ["params", "flops"])
def test_a_plain_vision_model_matched_to_the_adapted_one_is_within_two_percent(match):
    args = PretrainArgs(task="mnist", layers=3, d_model=64, heads=4, method="base", match=match)
    plain, adapted = vision_shape(args), vision_shape(replace(args, method="preproj+skip", match=None))
    assert plain.config().intermediate_size > adapted.config().intermediate_size
    if match == "params":
        def measure(shape, mode):
            return sum(p.numel() for p in build_method(ImageClassifier(shape), mode).parameters())
    else:
        def measure(shape, mode):
            return train_flops_per_example(shape, mode)
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


@pytest.mark.parametrize("task", ["mnist", pytest.param("moving-mnist", marks=pytest.mark.integration)])
def test_a_killed_vision_run_resumes_to_the_same_weights_bitwise(task, data, tmp_path, monkeypatch):
    pretrain(tiny(data, tmp_path / "full", task), progress=False)
    model_type = ImageClassifier if task == "mnist" else ClipTransformer
    forward, calls = model_type.forward, {"n": 0}

    def killed(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 1 + 2 + 6:  # structure check, held-out loss (2 batches), step 6 of 32
            raise KeyboardInterrupt("killed")
        return forward(self, *a, **k)

    monkeypatch.setattr(model_type, "forward", killed)
    with pytest.raises(KeyboardInterrupt):
        pretrain(tiny(data, tmp_path / "killed", task), progress=False)
    monkeypatch.setattr(model_type, "forward", forward)
    assert torch.load(tmp_path / "killed" / "checkpoint" / "state.pt", weights_only=True)["step"] == 4
    pretrain(tiny(data, tmp_path / "killed", task, resume=True), progress=False)
    for name in ("model.safetensors", "adapter/adapter_model.safetensors"):
        a, b = load_file(tmp_path / "full" / name), load_file(tmp_path / "killed" / name)
        assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a), name
    key = task.replace("-", "_")
    items = [(tmp_path / run / f"items.{key}.jsonl").read_text() for run in ("full", "killed")]
    assert items[0] == items[1]


@pytest.mark.integration
@pytest.mark.parametrize("task", ["moving-mnist", "moving-mnist-direction"])
def test_pretraining_on_moving_mnist_learns_and_writes_per_clip_files(task, data, tmp_path):
    summary, model = pretrain(tiny(data, tmp_path / "run", task), progress=False)
    log = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["heldout_loss"] < 0.9 * log[0]["heldout_loss"]
    key = task.replace("-", "_")
    for name, which in ((key, "test"), (f"{key}_shuffled", "test_shuffled")):
        items = [json.loads(line) for line in (tmp_path / "run" / f"items.{name}.jsonl").read_text().splitlines()]
        assert len(items) == 1_000 and {r["task"] for r in items} == {name}
        assert np.mean([r["loss"] for r in items]) == pytest.approx(summary["loss"][which], rel=1e-9)
        assert ("acc" in items[0]) == (task == "moving-mnist-direction")
    reloaded = ClipTransformer.from_pretrained(tmp_path / "run")
    assert reloaded.shape == model.shape


@pytest.mark.parametrize("argv, message", [
    (["--patch-size", "5"], "patches of 5 pixels do not tile a 28-pixel image"),
    (["--task", "cifar"], "--task must be one of text, mnist, moving-mnist"),
    (["--epochs", "0"], "argument --epochs: must be > 0"),
    (["--data-dir", "{tmp}/nowhere"], "nowhere' is not a directory"),
    (["--data-dir", "{tmp}"], "MNIST needs mnist/mnist.npz in the data directory"),
    (["--task", "moving-mnist", "--tubelet", "3"], "tubelets of 3 frames must tile the clip (16 frames)"),
    (["--task", "moving-mnist", "--context", "16"], "context 16 must be below frames 16"),
    (["--task", "moving-mnist-direction", "--patch-size", "7"], "patches of 7 pixels do not tile a 64-pixel frame"),
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


@pytest.mark.integration
def test_a_declared_vision_study_runs_records_itself_and_pairs_variants_item_by_item(data, tmp_path, capsys):
    """runner = "scaling" with task = "mnist": a tiny grid from a committed study file; every run records the file,
    the plan comes from the file, and the comparisons pair the variants over test digits and seeds."""
    import subprocess

    from preproj.experiments.study import load_study, runs_older_than_plan

    repo = tmp_path / "repo"
    repo.mkdir()
    for argv in (["init", "-q"], ["config", "user.email", "t@t"], ["config", "user.name", "t"]):
        subprocess.run(["git", "-C", str(repo), *argv], check=True, capture_output=True)
    (repo / "v.toml").write_text(f"""
runner = "scaling"
declared = true
task = "mnist"
out = "{tmp_path / 'out'}"
data_dir = "{data}"
sizes = "1x64"
variants = ["preproj+skip", "base@params"]
seeds = 2
epochs = 1
patch_size = 7
batch_size = 32
lr = 3e-3
warmup = 2
eval_every = 8
precision = "fp32"
compile = false
device = "cpu"

[plan]
alpha = 0.05
families = [{{ name = "against the plain model", correction = "holm", reference = "base@params" }}]
""")
    for argv in (["add", "v.toml"], ["commit", "-q", "-m", "plan"]):
        subprocess.run(["git", "-C", str(repo), *argv], check=True, capture_output=True)
    assert main(["study", "run", str(repo / "v.toml"), "--quiet"]) == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    entry = results["sizes"]["1x64"]
    compared = entry["paired"]["base@params"]["preproj+skip"]
    assert set(compared) == {"mnist.loss", "mnist.acc"}
    accuracy = compared["mnist.acc"]
    assert accuracy["higher_is_better"] and not compared["mnist.loss"]["higher_is_better"]
    assert accuracy["items"] == SMALL_MNIST["test"] and accuracy["seeds"] == [2, 2]
    assert accuracy["test"] == "seed-paired"
    assert set(accuracy["adjusted"]) == {"against the plain model"}
    variant = entry["variants"]["preproj+skip"]
    assert len(variant["test_accuracy"]) == 2 and len(variant["items"]) == 2
    summary = json.loads((Path(variant["items"][0]) / "summary.json").read_text())
    assert summary["provenance"]["study"]["sha256"] == load_study(repo / "v.toml").sha256
    assert runs_older_than_plan(load_study(repo / "v.toml")) == []
    report = (tmp_path / "out" / "report.md").read_text()
    assert "# preproj scaling: mnist" in report and "preproj+skip, mnist.acc:" in report


@pytest.mark.integration
def test_a_diverged_sweep_point_loses_the_sweep_and_is_not_retried(data, tmp_path, monkeypatch, caplog):
    from preproj.experiments import scaling
    from preproj.training import TrainingDiverged

    real, calls = scaling.pretrain, []

    def pretrain_or_diverge(args, progress=True):
        calls.append(args.lr)
        if args.lr == 1.0:
            raise TrainingDiverged("Loss became nan at step 3")
        return real(args, progress)

    monkeypatch.setattr(scaling, "pretrain", pretrain_or_diverge)
    grid = scaling.ScalingArgs(task="mnist", out=str(tmp_path / "grid"), data_dir=str(data), sizes="1x64",
                               variants="preproj+skip", seeds=1, lrs="3e-3,1", sweep_tokens=16 * 32 * 4, epochs=1,
                               patch_size=7, batch_size=32, warmup=2, eval_every=8, precision="fp32", compile=False,
                               device="cpu")
    with caplog.at_level("INFO", logger="preproj"):
        results = scaling.run_scaling(grid, progress=False)
    assert "run 3 of 3: " in caplog.text and "preproj+skip/seed0 (lr 0.003, 1 epoch(s)) ..." in caplog.text
    variant = results["sizes"]["1x64"]["variants"]["preproj+skip"]
    assert variant["lr"] == 3e-3 and variant["sweep"]["1"] == [None] and variant["sweep"]["0.003"][0] > 0
    assert (tmp_path / "grid" / "1x64" / "sweep" / "preproj+skip@1" / "seed0" / "diverged.json").is_file()
    sweep = f"| preproj+skip | **{variant['sweep']['0.003'][0]:.4f}** | diverged |"
    report = (tmp_path / "grid" / "report.md").read_text()
    assert f"| variant | lr 0.003 | lr 1 |\n|---|---|---|\n{sweep}" in report
    assert "a better rate may lie beyond it: preproj+skip (lowest)." in report
    calls.clear()
    scaling.run_scaling(grid, progress=False)
    assert calls == []  # every run, the diverged point included, is read back


@pytest.mark.parametrize("task", ["mnist", "moving-mnist"])
def test_attention_spread_evenly_measures_the_uniform_distance_and_an_even_share(task):
    """With Q zeroed every score is equal, so every layer spreads its attention evenly: the probe must give the
    grid's mean pairwise distance and 1/T to every position. Scrambled queries give other values."""
    from preproj.training.scratch_vision import Split, attention_by_depth

    shape = vision_shape(PretrainArgs(task=task, layers=2, d_model=24, heads=2, **TASK_SHAPES[task]))
    torch.manual_seed(0)
    model = (ImageClassifier if task == "mnist" else ClipTransformer)(shape)
    inputs = torch.randint(0, 256, (5, 1, 28, 28) if task == "mnist" else (5, 4, 64, 64), dtype=torch.uint8)
    split = Split(inputs, torch.zeros(5, dtype=torch.long))
    with torch.no_grad():
        for layer in model.encoder.transformer.layers:
            layer.attention.q_proj.weight.zero_()
    even = attention_by_depth(model, split, 2, torch.device("cpu"))
    tokens = len(even["received"][0])
    assert even["distance"] == pytest.approx([even["uniform_distance"]] * 2, rel=1e-5)
    assert all(x == pytest.approx(1 / tokens, abs=1e-6) for row in even["received"] for x in row)
    with torch.no_grad():
        for layer in model.encoder.transformer.layers:
            layer.attention.q_proj.weight.normal_(std=3.0)
            layer.attention.k_proj.weight.normal_(std=3.0)
    sharp = attention_by_depth(model, split, 2, torch.device("cpu"))
    assert abs(sharp["distance"][0] - even["uniform_distance"]) > 1e-3
    assert model.encoder.config._attn_implementation != "eager"  # put back as it was


def test_the_attention_each_position_receives_is_mapped_onto_its_grid_and_drawn(tmp_path):
    """The probe's per-token shares (mean over seeds, times the tokens) land on the patch grid for images and on time
    slots for clips, in row-major token order; the report draws them and names each variant's peak."""
    from preproj.experiments.scaling_report import plots, received_maps, vision_markdown

    image = asdict(VisionShape(patch_size=7))  # a 4 x 4 grid
    shares = [[0.0] * 16 for _ in range(2)]
    shares[1][6] = 1.0  # layer 1 puts everything on row 1, column 2
    seeds = [shares, [[1 / 16] * 16, [1 / 16] * 16]]
    maps = received_maps(image, seeds)
    assert maps.shape == (2, 4, 4) and maps[1, 1, 2] == pytest.approx(8.5) and maps[0, 0, 0] == pytest.approx(0.5)
    clip = asdict(ClipShape(frames=8, context=4, tubelet=2, patch_size=32))  # 4 slots of 2 x 2 patches
    first_slot = [[0.25] * 4 + [0.0] * 12]
    assert received_maps(clip, [first_slot]).tolist() == [[4.0, 0.0, 0.0, 0.0]]
    assert received_maps(clip, [None]) is None  # a run from before the probe
    for task, shape, received in (("mnist", image, seeds), ("moving-mnist", clip, [first_slot, first_slot])):
        variant = {"shape": shape, "params": 1, "train_flops_per_token": 1, "seeds": 2, "validation_loss": [1.0, 1.1],
                   "test_loss": [1.0, 1.1], "shuffled_test_loss": [2.0, 2.1], "curves": [[(1, 2.0), (2, 1.0)]] * 2,
                   "skip_norms": [[0.1] * len(received[0])] * 2, "attention_distance": [[1.0] * len(received[0])] * 2,
                   "uniform_attention_distance": 1.5, "attention_received": received}
        results = {"args": {"task": task, "epochs": 1, "batch_size": 8, "lr": 1e-3, "precision": "fp32", "seeds": 2},
                   "plan": {"families": []},
                   # base@flops at base@params's width shares its runs: read and drawn once, under the first name
                   "sizes": {"1x64": {"variants": {"preproj+skip": variant, "base@flops": variant}, "paired": {}}}}
        out = tmp_path / task
        out.mkdir()
        plots(out, results)
        assert (out / "attention_received.png").stat().st_size > 0
        peaks = "0.50, 8.50" if task == "mnist" else "4.00"
        text = vision_markdown(results)
        assert f"position in attention_received.png): preproj+skip {peaks}." in text
        assert "attention_distance.png): preproj+skip 1.00" in text
        assert "norm by layer (mean over the seeds; skip_norms.png): preproj+skip " + ", ".join(
            ["0.10"] * len(received[0])) + "." in text
        assert "base@flops" not in text.split("Mean attention")[1]


@pytest.mark.parametrize("model_type", [ImageClassifier, ClipTransformer])
def test_inspect_shows_where_the_modules_sit_in_a_vision_run_and_text_commands_refuse_it(model_type, tmp_path,
                                                                                      capsys):
    task = "mnist" if model_type is ImageClassifier else "moving-mnist"
    from preproj.methods.registry import save_model_dir

    shape = vision_shape(PretrainArgs(task=task, layers=2, d_model=24, heads=2, **TASK_SHAPES[task]))
    save_model_dir(build_method(model_type(shape), "preproj+skip"), "preproj+skip", tmp_path / "run")
    assert main(["inspect", "--model", str(tmp_path / "run"), "--mode", "preproj+skip"]) == 0
    said = capsys.readouterr().out
    assert "encoder.transformer.layers.1.attention encoder.transformer.layers.1.attention_norm" in said
    assert "no K/V cache" in said and "(pixtral family)" in said
    for command in (["eval", "--tasks", "lambada"], ["train", "--out", str(tmp_path / "trained")]):
        assert main([command[0], "--model", str(tmp_path / "run"), *command[1:]]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"holds a preproj vision model ({model_type.model_type}), not a language model" in err
    assert not (tmp_path / "trained").exists()


def test_a_vision_run_with_a_learned_position_trains_and_reloads(data, tmp_path):
    summary, model = pretrain(tiny(data, tmp_path / "run", position="learned", epochs=1), progress=False)
    assert summary["shape"]["position"] == "learned" and model.position.table.requires_grad
    reloaded = ImageClassifier.from_pretrained(tmp_path / "run")
    assert reloaded.shape.position == "learned"
    assert torch.equal(reloaded.position.table, load_file(tmp_path / "run" / "model.safetensors")["position.table"])
