"""`preproj export`: the exported directory loads with transformers alone (in a subprocess where preproj cannot be
imported) and computes what the attached model computes, for every family in the table, a custom structure, a
preproj+lora model and a `pretrain` output."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import FAMILY_NAMES, VOCAB, tiny_model, tiny_model_dir

import preproj
from preproj import ExportError, PreProjConfig, attach, export
from preproj.core.config import MODES

BLOCK_CHANGES = [("all-changes", "llama", "preproj+skip+gate-head+value-residual+pre-mlp", [1, 2]),
                 ("gate-after-norm", "gemma3_text", "skip+gate+value-residual", None)]

# A check script's opening: `import preproj` fails after it, so whatever loads is transformers' and the directory's
# own code.
WITHOUT_PREPROJ = r"""
import json, sys, torch
sys.modules["preproj"] = None
try:
    import preproj
    raise SystemExit("preproj was importable")
except ImportError:
    pass
"""
CHECK = WITHOUT_PREPROJ + r"""
from transformers import AutoModelForCausalLM

results = {}
for case in json.load(open(sys.argv[1])):
    model = AutoModelForCausalLM.from_pretrained(case["dir"], trust_remote_code=True, **case.get("load", {})).eval()
    ids = torch.tensor(case["ids"])
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
        cached = model.generate(ids[:1], max_new_tokens=6, do_sample=False, use_cache=True, pad_token_id=0)
        uncached = model.generate(ids[:1], max_new_tokens=6, do_sample=False, use_cache=False, pad_token_id=0)
    saved = None
    if case.get("resave"):
        model.save_pretrained(case["dir"] + "-resaved")
        again = AutoModelForCausalLM.from_pretrained(case["dir"] + "-resaved", trust_remote_code=True).eval()
        with torch.no_grad():
            saved = (again(input_ids=ids).logits.float() - logits).abs().max().item()
    results[case["name"]] = {"class": type(model).__name__, "dtype": str(next(model.parameters()).dtype),
                             "logits": logits.tolist(), "cached": cached.tolist(), "uncached": uncached.tolist(),
                             "resaved_diff": saved}
json.dump(results, open(sys.argv[2], "w"))
"""


def run_without_preproj(tmp_path: Path, cases: list[dict], check: str = CHECK) -> dict:
    """`check` (a script: cases.json in, results out) run where preproj cannot be imported."""
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "hf_modules"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": ""}
    done = subprocess.run([sys.executable, "-c", check, str(tmp_path / "cases.json"), str(tmp_path / "out.json")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((tmp_path / "out.json").read_text())


def randomise(model: torch.nn.Module) -> None:
    """Adapter weights far from their near-zero init, so that a module left out of the export would show."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if any(part in name for part in (".preproj.", ".attn_gate.", ".pre_mlp.", "lora_")) \
                    or name.endswith(".skip.weight"):
                param.normal_(std=0.05)
            elif name.endswith(".value_mix"):
                param.uniform_(0.2, 0.8)


def reference(model, ids: torch.Tensor) -> dict:
    with torch.no_grad():
        return {"logits": model(input_ids=ids).logits.float(),
                "cached": model.generate(ids[:1], max_new_tokens=6, do_sample=False, use_cache=True,
                                         pad_token_id=0).tolist()}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Every family (modes in turn), a custom structure, a bf16 export and a preproj+lora model, exported, then
    loaded and run in one subprocess without preproj."""
    tmp = tmp_path_factory.mktemp("export")
    ids = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(0))
    cases, refs = [], {}
    for i, family in enumerate(FAMILY_NAMES):
        model = tiny_model(family)
        attach(model, PreProjConfig(mode=MODES[i % len(MODES)], layers=[0, 1] if i % 2 else None))
        randomise(model)
        refs[family] = reference(model, ids)
        cases.append({"name": family, "dir": str(export(model, tmp / family)), "ids": ids.tolist(),
                      "resave": family in ("llama", "gemma3_text")})

    for name, family, mode, layers in BLOCK_CHANGES:  # the block changes compared from scratch, through their hooks
        model = attach(tiny_model(family), PreProjConfig(mode=mode, layers=layers))
        randomise(model)
        refs[name] = reference(model, ids)
        cases.append({"name": name, "dir": str(export(model, tmp / name)), "ids": ids.tolist()})

    model = tiny_model("llama")
    attach(model, PreProjConfig(structure={"layers": "model.layers", "attention": "self_attn",
                                           "input_norm": "input_layernorm"}))
    randomise(model)
    refs["custom"] = reference(model, ids)
    cases.append({"name": "custom", "dir": str(export(model, tmp / "custom")), "ids": ids.tolist()})
    cases.append({"name": "bf16", "dir": str(export(model, tmp / "bf16", dtype="bfloat16")), "ids": ids.tolist()})
    cases.append({"name": "bf16-as-fp32", "dir": str(tmp / "bf16"), "ids": ids.tolist(),
                  "load": {"dtype": "float32"}})

    from peft import LoraConfig, get_peft_model

    model = attach(tiny_model("llama"), PreProjConfig())
    model = get_peft_model(model, LoraConfig(r=4, target_modules=r".*\.self_attn\.base_layer\.(q_proj|v_proj)"))
    randomise(model)
    refs["preproj+lora"] = reference(model, ids)
    cases.append({"name": "preproj+lora", "dir": str(export(model, tmp / "preproj+lora")), "ids": ids.tolist()})
    return tmp, refs, run_without_preproj(tmp, cases)


@pytest.mark.parametrize("name", [*FAMILY_NAMES, "custom", *(case[0] for case in BLOCK_CHANGES)])
def test_export_computes_what_the_attached_model_computes(exported, name):
    _, refs, results = exported
    got = results[name]
    assert got["class"] == "PreProjForCausalLM" and got["dtype"] == "torch.float32"
    assert torch.allclose(torch.tensor(got["logits"]), refs[name]["logits"], atol=1e-6, rtol=0)
    assert got["cached"] == refs[name]["cached"]
    assert got["uncached"] == got["cached"]


def test_export_round_trips_through_save_pretrained(exported):
    _, _, results = exported
    assert results["llama"]["resaved_diff"] == 0.0
    assert results["gemma3_text"]["resaved_diff"] == 0.0


def test_lora_half_is_merged_into_the_base_weights(exported):
    tmp, refs, results = exported
    assert torch.allclose(torch.tensor(results["preproj+lora"]["logits"]), refs["preproj+lora"]["logits"], atol=1e-5)
    assert results["preproj+lora"]["cached"] == refs["preproj+lora"]["cached"]
    from safetensors.torch import load_file

    keys = load_file(tmp / "preproj+lora" / "model.safetensors")
    assert not [k for k in keys if "lora_" in k] and "model.layers.0.self_attn.base_layer.q_proj.weight" in keys


def test_bf16_export_stores_and_loads_bf16_and_respects_a_requested_dtype(exported):
    tmp, refs, results = exported
    from safetensors.torch import load_file

    assert {t.dtype for t in load_file(tmp / "bf16" / "model.safetensors").values()} == {torch.bfloat16}
    assert json.loads((tmp / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    assert results["bf16"]["dtype"] == "torch.bfloat16" and results["bf16-as-fp32"]["dtype"] == "torch.float32"
    error = (torch.tensor(results["bf16"]["logits"]) - refs["custom"]["logits"]).abs().max()
    assert 0 < error < 0.05 * refs["custom"]["logits"].abs().max()


def test_export_directory_holds_safetensors_config_code_and_card_only(exported):
    tmp, _, _ = exported
    files = {p.name for p in (tmp / "gemma3_text").iterdir()}
    assert files == {"model.safetensors", "config.json", "modeling_preproj.py", "preproj_modules.py",
                     "generation_config.json", "README.md"}
    config = json.loads((tmp / "gemma3_text" / "config.json").read_text())
    assert config["model_type"] == "preproj_gemma3_text"
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_preproj.PreProjForCausalLM"
    assert config["preproj"]["skip_after"] == "post_attention_layernorm"
    modeling = (tmp / "gemma3_text" / "modeling_preproj.py").read_text()
    assert "import Gemma3ForCausalLM as BaseForCausalLM" in modeling
    assert imported_packages(modeling) == {"__future__", "transformers", ".preproj_modules"}
    assert imported_packages((tmp / "gemma3_text" / "preproj_modules.py").read_text()) == {"__future__", "torch"}


def test_export_is_readable_as_a_plain_directory_under_the_umask(tmp_path):
    umask = os.umask(0o027)
    try:
        out = export(attach(tiny_model("llama"), PreProjConfig()), tmp_path / "shared")
    finally:
        os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o750
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o640}, modes


def imported_packages(source: str) -> set[str]:
    """The top-level packages `source` imports; a relative import as .module."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add("." + node.module if node.level else node.module.split(".")[0])
    return found


def test_export_refuses_a_model_without_an_adapter_and_a_used_directory(tmp_path):
    with pytest.raises(ExportError, match="carries no preproj adapter"):
        export(tiny_model("llama"), tmp_path / "plain")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="already exists and is not empty"):
        export(attach(tiny_model("llama"), PreProjConfig()), tmp_path / "used")
    assert (tmp_path / "used" / "keep.txt").read_text() == "mine"
    assert not list(tmp_path.glob(".*export*"))


def test_cli_exports_a_pretrain_run_with_its_tokenizer_and_card(tmp_path):
    from preproj.cli import main

    text = tmp_path / "text.txt"
    text.write_text("\n".join(f"Line {i}: the quick brown fox jumps over the lazy dog {i % 7} times."
                              for i in range(200)))
    run = tmp_path / "run"
    assert main(["pretrain", "--data", str(text), "--out", str(run), "--layers", "2", "--d-model", "32",
                 "--heads", "2", "--seq-len", "32", "--batch-size", "2", "--tokens", "256", "--tokenizer", "train:300",
                 "--device", "cpu", "--precision", "fp32", "--sample-tokens", "2", "--quiet"]) == 0
    assert main(["export", "--model", str(run), "--out", str(tmp_path / "exported"), "--quiet"]) == 0
    card = (tmp_path / "exported" / "README.md").read_text()
    assert "preproj (preproj+skip)" in card and "## Training" in card and "## Licence" in card
    model, tokenizer = preproj.load_model(str(run))
    preproj.load_adapter(model, run / "adapter")
    ids = torch.tensor([tokenizer.encode("The cat sat on the mat.")])
    refs = {"pretrain": reference(model, ids)}
    results = run_without_preproj(tmp_path, [{"name": "pretrain", "dir": str(tmp_path / "exported"),
                                              "ids": ids.tolist()}])
    assert torch.allclose(torch.tensor(results["pretrain"]["logits"]), refs["pretrain"]["logits"], atol=1e-6, rtol=0)
    assert results["pretrain"]["cached"] == refs["pretrain"]["cached"]
    assert (tmp_path / "exported" / "tokenizer.json").is_file()


@pytest.mark.integration
def test_eval_scores_an_export_only_with_the_trust_its_user_gives(tmp_path, capsys):
    """Without a terminal transformers cannot ask whether to run the directory's code; preproj says what it is and
    which flag allows it, and with the flag scores the export as it scores the run the export came from."""
    from conftest import data_dir

    from preproj.cli import main

    text = tmp_path / "text.txt"
    text.write_text("\n".join(f"Line {i}: the quick brown fox jumps over the lazy dog {i % 7} times."
                              for i in range(200)))
    run, exported = tmp_path / "run", tmp_path / "exported"
    assert main(["pretrain", "--data", str(text), "--out", str(run), "--layers", "2", "--d-model", "32",
                 "--heads", "2", "--seq-len", "32", "--batch-size", "2", "--tokens", "256", "--tokenizer", "train:300",
                 "--device", "cpu", "--precision", "fp32", "--sample-tokens", "2", "--quiet"]) == 0
    assert main(["export", "--model", str(run), "--out", str(exported), "--quiet"]) == 0
    scoring = ["eval", "--tasks", "lambada", "--limit", "3", "--device", "cpu", "--data-dir", str(data_dir()),
               "--quiet"]
    capsys.readouterr()
    assert main([*scoring, "--model", str(exported)]) == 2
    err = capsys.readouterr().err.strip()
    assert "carries its own modeling code (modeling_preproj.py" in err and "--trust-remote-code" in err
    assert err.splitlines()[-1].startswith("preproj eval: error:") and "Traceback" not in err
    assert main([*scoring, "--model", str(exported), "--trust-remote-code", "--out", str(tmp_path / "x.json")]) == 0
    assert main([*scoring, "--model", str(run), "--adapter", str(run / "adapter"),
                 "--out", str(tmp_path / "r.json")]) == 0
    ours, theirs = (json.loads((tmp_path / f"{n}.json").read_text())["tasks"]["lambada"] for n in ("x", "r"))
    assert ours["n"] == theirs["n"] == 3 and ours["acc"] == theirs["acc"]
    assert ours["perplexity"] == pytest.approx(theirs["perplexity"], rel=1e-5)


def test_cli_export_without_an_adapter_says_what_to_give(tmp_path, capsys):
    from preproj.cli import main

    model_dir = tiny_model_dir(tmp_path / "m", ["some text to train a tokenizer on"] * 20)
    assert main(["export", "--model", str(model_dir), "--out", str(tmp_path / "x")]) == 2
    assert "--adapter is required" in capsys.readouterr().err


def test_the_embedded_model_exports_with_its_tokenizer_licence_and_logits(smollm2, tmp_path):
    model, tokenizer = smollm2
    attach(model, PreProjConfig(mode="skip"))
    try:
        randomise(model)
        ids = torch.tensor([tokenizer.encode("The capital of France is")])
        refs = reference(model, ids)
        export(model, tmp_path / "smollm2-skip", tokenizer)
    finally:
        preproj.detach(model)
    card = (tmp_path / "smollm2-skip" / "README.md").read_text()
    assert "license: apache-2.0" in card and "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in card
    results = run_without_preproj(tmp_path, [{"name": "smollm2", "dir": str(tmp_path / "smollm2-skip"),
                                              "ids": ids.tolist()}])
    assert torch.allclose(torch.tensor(results["smollm2"]["logits"]), refs["logits"], atol=1e-5, rtol=0)
    assert results["smollm2"]["cached"] == refs["cached"]


def test_the_card_describes_the_block_changes_and_counts_their_parameters(exported):
    tmp, _, _ = exported
    card = (tmp / "all-changes" / "README.md").read_text()
    config = PreProjConfig(mode="preproj+skip+gate-head+value-residual+pre-mlp")
    d, heads = 64, 4
    assert f"{config.added_params(2, d, d, heads):,} parameters added" in card  # layers 1 and 2
    for words in ("gated attention (one gate", "a value residual", "a pre-attention MLP", "a pre-projection"):
        assert words in card
    assert 'AutoTokenizer.from_pretrained("PATH", trust_remote_code=True)' in card
