"""`preproj export` of a vision run: the directory loads with transformers alone (in a subprocess where preproj
cannot be imported) and computes what preproj's model computes, for images and both clip objectives, RoPE and a
learned position, the paper's modules and the block changes."""

from __future__ import annotations

import json

import pytest
import torch
from test_export import WITHOUT_PREPROJ, imported_packages, randomise, run_without_preproj
from test_vision_training import TASK_SHAPES

from preproj import PreProjConfig, attach, export
from preproj.cli import main
from preproj.methods.registry import save_model_dir
from preproj.training.scratch import PretrainArgs
from preproj.training.scratch_vision import vision_shape
from preproj.vision import ClipTransformer, ImageClassifier

CASES = [  # (name, task, mode, position)
    ("image", "mnist", "preproj+skip", "rope"),
    ("image-learned", "mnist", "preproj+skip+gate-head+value-residual+pre-mlp", "learned"),
    ("next-frame", "moving-mnist", "skip+gate+value-residual", "rope"),
    ("direction", "moving-mnist-direction", "preproj", "rope"),
]
MODEL_TYPES = {"mnist": ImageClassifier}

CHECK = WITHOUT_PREPROJ + r"""
import transformers

results = {}
for case in json.load(open(sys.argv[1])):
    loaded = {name: getattr(transformers, name).from_pretrained(case["dir"], trust_remote_code=True).eval()
              for name in case["auto"]}
    inputs = torch.tensor(case["inputs"], dtype=torch.uint8)
    labels = torch.tensor(case["labels"], dtype=getattr(torch, case["labels_dtype"]))
    with torch.no_grad():
        outs = {name: model(inputs, labels=labels) for name, model in loaded.items()}
    model = loaded["AutoModel"]
    try:
        model(inputs[..., 1:])
        refused = None
    except ValueError as e:
        refused = str(e)
    results[case["name"]] = {"class": type(model).__name__, "logits": outs["AutoModel"].logits.tolist(),
                             "loss": outs["AutoModel"].loss.item(), "refused": refused,
                             "same": [torch.equal(o.logits, outs["AutoModel"].logits) for o in outs.values()]}
json.dump(results, open(sys.argv[2], "w"))
"""


def vision_model(task: str, mode: str, position: str, seed: int = 0):
    torch.manual_seed(seed)
    shape = vision_shape(PretrainArgs(task=task, layers=2, d_model=24, heads=2, position=position,
                                      **TASK_SHAPES[task]))
    model = attach(MODEL_TYPES.get(task, ClipTransformer)(shape), PreProjConfig(mode=mode))
    randomise(model)
    return model.eval()


def example(model, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 inputs and labels the model takes: two images, or two clips (next-frame: the context, and the frames
    that follow as labels)."""
    g = torch.Generator().manual_seed(seed)
    inputs = torch.randint(0, 256, (2, *next(iter(model.example_input().values())).shape[1:]), generator=g,
                           dtype=torch.uint8)
    s = model.shape
    if getattr(s, "objective", None) == "next-frame":
        return inputs, torch.randint(0, 256, (2, s.frames - s.context, s.channels, s.size, s.size), generator=g,
                                     dtype=torch.uint8)
    return inputs, torch.randint(0, s.classes, (2,), generator=g)


def case(name: str, model, out, refs: dict, auto: list[str]) -> dict:
    """What the subprocess loads and runs for `name`, and preproj's own outputs on the same inputs into `refs`."""
    inputs, labels = example(model)
    with torch.no_grad():
        refs[name] = (model(inputs), model(inputs, labels))
    return {"name": name, "dir": str(out), "inputs": inputs.tolist(), "labels": labels.tolist(),
            "labels_dtype": str(labels.dtype).removeprefix("torch."), "auto": auto}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Each case exported from Python, and one saved as a `pretrain` run and exported by the CLI; all loaded and run
    in one subprocess without preproj."""
    tmp = tmp_path_factory.mktemp("vision-export")
    cases, refs = [], {}
    for name, task, mode, position in CASES:
        model = vision_model(task, mode, position)
        auto_map = json.loads((export(model, tmp / name) / "config.json").read_text())["auto_map"]
        cases.append(case(name, model, tmp / name, refs, [key for key in auto_map if key != "AutoConfig"]))

    model = vision_model("mnist", "preproj+skip", "rope", seed=1)
    save_model_dir(model, "preproj+skip", tmp / "run")
    code = main(["export", "--model", str(tmp / "run"), "--out", str(tmp / "cli")])
    cases.append(case("cli", model, tmp / "cli", refs, ["AutoModel"]))
    return tmp, refs, code, run_without_preproj(tmp, cases, CHECK)


@pytest.mark.parametrize("name", [*(case[0] for case in CASES), "cli"])
def test_a_vision_export_computes_what_the_vision_model_computes(exported, name):
    _, refs, code, results = exported
    logits, loss = refs[name]
    assert code == 0
    assert results[name]["class"] == "PreProjVisionModel" and all(results[name]["same"])
    assert torch.allclose(torch.tensor(results[name]["logits"]), logits, atol=1e-5)
    assert results[name]["loss"] == pytest.approx(loss.item(), abs=1e-5)
    assert results[name]["refused"].startswith("pixel_values must be (batch, ")  # one pixel column short


def test_a_vision_export_maps_the_auto_classes_of_its_task_and_carries_its_code_and_card(exported):
    tmp = exported[0]
    maps = {name: json.loads((tmp / name / "config.json").read_text())["auto_map"] for name, *_ in CASES}
    assert maps["image"]["AutoModelForImageClassification"] == "modeling_preproj_vision.PreProjVisionModel"
    assert "AutoModelForVideoClassification" in maps["direction"]
    assert set(maps["next-frame"]) == {"AutoConfig", "AutoModel"}
    assert {f.name for f in (tmp / "image").iterdir()} == {"model.safetensors", "config.json", "README.md",
                                                          "modeling_preproj_vision.py", "preproj_modules.py"}
    modeling = (tmp / "image" / "modeling_preproj_vision.py").read_text()
    assert imported_packages(modeling) == {"__future__", "dataclasses", "torch", "transformers", ".preproj_modules"}
    card = (tmp / "image" / "README.md").read_text()
    assert "pipeline_tag: image-classification" in card and "preproj (preproj+skip)" in card
    config = json.loads((tmp / "next-frame" / "config.json").read_text())
    assert config["vision"]["kind"] == "clip" and config["vision"]["objective"] == "next-frame"
    assert "id2label" not in config
    assert json.loads((tmp / "direction" / "config.json").read_text())["id2label"] == {str(i): str(i) for i in range(4)}
    assert config["preproj"]["decoder_layers"] == "encoder.transformer.layers"


def test_a_plain_vision_run_is_refused_in_one_line(tmp_path, capsys):
    torch.manual_seed(0)
    shape = vision_shape(PretrainArgs(task="mnist", layers=1, d_model=24, heads=2, **TASK_SHAPES["mnist"]))
    save_model_dir(ImageClassifier(shape), "base", tmp_path / "run")
    assert main(["export", "--model", str(tmp_path / "run"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "carries no preproj modules" in err[0]
    assert not (tmp_path / "out").exists()
