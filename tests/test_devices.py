"""Devices and precisions: one vocabulary, no tensor on a hard-coded device, and the CUDA checks.

A CPU-only machine cannot run anything on a GPU, so "nothing is created on a hard-coded device" is
checked twice over: at run time, every tensor that preproj's own code creates while training and
evaluating names its device (nothing falls back to the default device, which is the CPU); and in the
source, no device literal is passed to a call outside the few places listed below with their reason.
The tests marked `cuda` run where a GPU is (benchmarks/gpu_check.sh) and are skipped elsewhere.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import CharTokenizer, set_native_bf16, tiny_model
from torch.overrides import TorchFunctionMode

import preproj
from preproj.evaluation import LogLikelihood
from preproj.runtime.precision import PRECISIONS, precision, resolve_device
from preproj.training import TrainArgs, train

SRC = Path(preproj.__file__).resolve().parent
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: run benchmarks/gpu_check.sh on one")


def test_precision_words_mean_one_thing():
    assert set(PRECISIONS) == {"fp32", "bf16-mixed", "bf16-true", "bf16-frozen"}
    table = {name: (p.weights, p.adapter, p.autocast) for name, p in PRECISIONS.items()}
    f32, b16 = torch.float32, torch.bfloat16
    assert table == {"fp32": (f32, f32, None), "bf16-mixed": (f32, f32, b16), "bf16-true": (b16, b16, None),
                     "bf16-frozen": (b16, f32, b16)}
    with precision("bf16-mixed").autocast_context(torch.device("cpu")):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    with precision("fp32").autocast_context("cpu"):
        assert not torch.is_autocast_enabled("cpu")
    with pytest.raises(ValueError, match="'bf16' alone is ambiguous"):
        precision("bf16")
    with pytest.raises(ValueError, match="precision must be auto or one of fp32, bf16-mixed, bf16-true, bf16-frozen"):
        precision("fp16")


def test_auto_precision_is_bf16_autocast_only_where_bf16_matmuls_are_native(monkeypatch):
    # A CPU without avx512_bf16 or AMX runs bf16 matmuls several times slower than fp32 (measured: benchmarks).
    for avx512_bf16, amx, expected in ((False, False, "fp32"), (True, False, "bf16-mixed"),
                                       (False, True, "bf16-mixed")):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v)
        assert precision("auto", "cpu").name == expected
    assert precision("auto", "mps").name == "fp32"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert precision("auto", torch.device("cuda", 0)).name == "bf16-mixed"
    assert precision("auto", "cpu").weights == torch.float32  # either way the base loads in float32
    # a frozen base (frozen-probe training) is stored in bf16 where bf16 is native, unless it is given in float32
    # (results/bf16-frozen-check: equivalent to bf16-mixed within its declared margins)
    assert precision("auto", "cpu", frozen_base=True).name == "bf16-frozen"
    assert precision("auto", "cpu", frozen_base=True, base_dtype=torch.bfloat16).name == "bf16-frozen"
    assert precision("auto", "cpu", frozen_base=True, base_dtype=torch.float32).name == "bf16-mixed"
    set_native_bf16(monkeypatch, False)
    assert precision("auto", "cpu", frozen_base=True).name == "fp32"


@pytest.mark.parametrize("name", ["bf16-true", "bf16-mixed", "bf16-frozen"])
def test_bf16_matmuls_in_float32_give_the_native_numbers(monkeypatch, name):
    p = precision(name)
    model = tiny_model("llama", dtype=p.weights)
    ids = torch.randint(3, 90, (2, 24), generator=torch.Generator().manual_seed(0))
    out = {}
    for native in (True, False):
        set_native_bf16(monkeypatch, native)
        assert p.emulates_bf16("cpu") is not native and p.emulates_bf16(torch.device("meta")) is False
        model.zero_grad()
        with p.compute_context("cpu"):
            logits = model(ids).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), ids.flatten())
        loss.backward()
        out[native] = logits.float(), loss.item(), model.model.embed_tokens.weight.grad.float().clone()
    (ref, ref_loss, ref_grad), (emu, emu_loss, emu_grad) = out[True], out[False]
    assert emu.dtype == ref.dtype and emu_loss == pytest.approx(ref_loss, abs=2e-3)
    # a native GEMM and a float32 one accumulate in different orders: outputs differ by a rounding at most
    assert (emu - ref).abs().max() <= 0.02 * ref.abs().max()
    assert (emu_grad - ref_grad).abs().max() <= 0.05 * ref_grad.abs().max()
    set_native_bf16(monkeypatch, False)
    assert precision("fp32").emulates_bf16("cpu") is False


def test_emulated_bf16_training_matches_native_and_survives_activation_checkpointing(tmp_path, monkeypatch):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(f"line {i}: the quick brown fox jumps over the lazy dog and keeps running {i * 7}"
                                for i in range(60)))

    def run(out, native, **kw):
        set_native_bf16(monkeypatch, native)
        args = TrainArgs(model="tiny", out=str(tmp_path / out), data=str(corpus), steps=3, batch_size=2, seq_len=16,
                         eval_batches=1, precision="bf16-true", lr=1e-3, device="cpu", **kw)
        summary, model = train(args, tiny_model("llama", dtype=torch.bfloat16), CharTokenizer(), progress=False)
        return summary, {k: v.float() for k, v in model.named_parameters() if v.requires_grad}

    native, w_native = run("native", True)
    emulated, w_emulated = run("emulated", False)
    checkpointed, w_checkpointed = run("checkpointed", False, activation_checkpointing=True)
    assert emulated["final_heldout_loss"] == pytest.approx(native["final_heldout_loss"], abs=1e-2)
    for k in w_native:
        assert (w_emulated[k] - w_native[k]).abs().max() <= 0.05 * w_native[k].abs().max() + 1e-3, k
        assert torch.equal(w_checkpointed[k], w_emulated[k]), k  # recomputed under the same context
    assert emulated["bf16_erased_update_fraction"] == pytest.approx(native["bf16_erased_update_fraction"], abs=0.05)
    for module, fraction in native["bf16_erased_update_fraction_by_module"].items():
        assert emulated["bf16_erased_update_fraction_by_module"][module] == pytest.approx(fraction, abs=0.05), module


def test_auto_is_resolved_once_and_recorded(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(f"line {i}: the quick brown fox jumps over the lazy dog {i * 7}" for i in range(50)))
    summary, _ = train(TrainArgs(model="tiny", out=str(tmp_path / "run"), data=str(corpus), steps=1, batch_size=2,
                                 seq_len=16, eval_batches=1, device="cpu"), tiny_model("llama"), CharTokenizer(),
                       progress=False)
    assert TrainArgs().precision == "auto" and summary["precision"] == "fp32"
    assert json.loads((tmp_path / "run" / "train_config.json").read_text())["precision"] == "fp32"
    # where bf16 is native: a model passed in float32 trains in bf16-mixed (not refused as bf16-frozen's), one passed
    # in bf16 in bf16-frozen
    set_native_bf16(monkeypatch, True)
    for dtype, expected in ((torch.float32, "bf16-mixed"), (torch.bfloat16, "bf16-frozen")):
        summary, _ = train(TrainArgs(model="tiny", out=str(tmp_path / expected), data=str(corpus), steps=1,
                                     batch_size=2, seq_len=16, eval_batches=1, device="cpu"),
                           tiny_model("llama").to(dtype), CharTokenizer(), progress=False)
        assert summary["precision"] == expected
    # a run started under 'auto' resumes with the word its start resolved it to, wherever it resumes
    set_native_bf16(monkeypatch, False)
    summary, _ = train(TrainArgs(model="tiny", out=str(tmp_path / "bf16-frozen"), data=str(corpus), steps=1,
                                 batch_size=2, seq_len=16, eval_batches=1, device="cpu", resume=True),
                       tiny_model("llama").to(torch.bfloat16), CharTokenizer(), progress=False)
    assert summary["precision"] == "bf16-frozen"


def test_device_specs_resolve_or_say_what_is_wrong(monkeypatch):
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == (torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"))
    with pytest.raises(ValueError, match="Unknown device 'tpu'"):
        resolve_device("tpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="torch sees no CUDA GPU here; use --device cpu"):
        resolve_device("cuda:1")


@pytest.mark.parametrize("name", ["bf16-true", "bf16-frozen"])
def test_load_and_train_follow_the_precision(tmp_path, name):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(f"line {i}: the quick brown fox jumps over the lazy dog and keeps running far away "
                                f"{i * 7}" for i in range(50)))
    p = precision(name)
    model = tiny_model("llama", dtype=p.weights)
    summary, trained = train(TrainArgs(model="tiny", out=str(tmp_path / "run"), data=str(corpus), steps=2, batch_size=2,
                                       seq_len=16, eval_batches=1, precision=name, device="cpu"),
                             model, CharTokenizer(), progress=False)
    adapter = [p_ for p_ in trained.parameters() if p_.requires_grad]
    frozen = [p_ for p_ in trained.parameters() if not p_.requires_grad]
    assert {t.dtype for t in adapter} == {p.adapter} and {t.dtype for t in frozen} == {p.weights}
    assert summary["precision"] == name and summary["device"] == "cpu"
    assert ("bf16_erased_update_fraction" in summary) == (name == "bf16-true")


# --- nothing on a hard-coded device ----------------------------------------------------------------

FACTORIES = {torch.tensor, torch.as_tensor, torch.zeros, torch.ones, torch.empty, torch.full, torch.arange,
             torch.rand, torch.randn, torch.randint, torch.linspace, torch.eye}
# Token ids live in host memory, like a DataLoader's; each batch is moved to the model.
HOST_DATA = {"data.py", "windows.py"}


class FactoryCalls(TorchFunctionMode):
    """Records (file, line, device) of every tensor factory called directly from preproj's own source."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, int, object]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES:
            caller = sys._getframe(1)
            while caller.f_code.co_name == "__torch_function__":  # another mode passing the call on (precision.py)
                caller = caller.f_back
            if SRC in Path(caller.f_code.co_filename).resolve().parents:
                self.calls.append((Path(caller.f_code.co_filename).name, caller.f_lineno, kwargs.get("device")))
        return func(*args, **kwargs)


def test_training_and_eval_create_no_tensor_on_the_default_device(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(f"line {i}: the quick brown fox jumps over the lazy dog and keeps running far away "
                                f"{i * 7}" for i in range(50)))
    recorder = FactoryCalls()
    with recorder:
        _, model = train(TrainArgs(model="tiny", out=str(tmp_path / "run"), data=str(corpus), steps=3, batch_size=2,
                                   grad_accum=2, seq_len=16, eval_every=2, eval_batches=1, save_every=2,
                                   precision="bf16-mixed", device="cpu"),
                         tiny_model("llama"), CharTokenizer(), progress=False)
        score = LogLikelihood(model, CharTokenizer(), progress=False, precision="bf16-mixed")
        score([([1, 5, 6], [7, 8]), ([1, 9], [10])])
    seen = {name for name, _, _ in recorder.calls}
    assert {"loss.py", "engine.py"} <= seen, seen  # the recorder sees the code paths it guards
    implicit = [(name, line) for name, line, device in recorder.calls if device is None and name not in HOST_DATA]
    assert not implicit, f"tensors created on the default device instead of the model's: {implicit}"


def test_the_recorder_catches_an_implicit_device():
    recorder = FactoryCalls()
    with recorder:
        exec(compile("torch.zeros(3)\ntorch.ones(2, device=torch.device('meta'))", str(SRC / "imagined.py"), "exec"))
    assert [(name, device) for name, _, device in recorder.calls] == [("imagined.py", None),
                                                                      ("imagined.py", torch.device("meta"))]


ALLOWED_LITERALS = {
    "precision.py": "the device vocabulary itself",
    ("adapter.py", "save_adapter"): "safetensors writes from host memory",
    ("training.py", "_restore_rng"): "RNG states are host byte tensors",
    ("loading.py", "trained_weights_digest"): "hashes the weights' bytes in host memory",
    ("cli.py", "_export"): "an export is assembled and written from host memory",
}
DEVICE_WORDS = {"cpu", "cuda", "mps"}


def _device_literals(path: Path) -> list[tuple[str, int]]:
    """(function, line) of each device literal passed to a call, used as a default, or .cpu()/.cuda()."""
    found = []

    def visit(node, func_name):
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func_name
            if isinstance(child, ast.Call):
                values = list(child.args) + [k.value for k in child.keywords]
                if any(isinstance(v, ast.Constant) and isinstance(v.value, str)
                       and v.value.split(":")[0] in DEVICE_WORDS for v in values):
                    found.append((name, child.lineno))
                if isinstance(child.func, ast.Attribute) and child.func.attr in ("cpu", "cuda") and not child.args:
                    found.append((name, child.lineno))
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defaults = child.args.defaults + [d for d in child.args.kw_defaults if d is not None]
                if any(isinstance(d, ast.Constant) and d.value in DEVICE_WORDS for d in defaults):
                    found.append((name, child.lineno))
            visit(child, name)

    visit(ast.parse(path.read_text()), "<module>")
    return found


def test_no_device_literal_outside_the_listed_places():
    offending = []
    for path in sorted(SRC.glob("*.py")):
        if path.name in ALLOWED_LITERALS:
            continue
        offending += [f"{path.name}:{line} in {func}" for func, line in _device_literals(path)
                      if (path.name, func) not in ALLOWED_LITERALS]
    assert not offending, f"hard-coded devices: {offending}"


def test_the_scan_finds_what_it_looks_for(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\ndef f(x, device='cuda'):\n    y = torch.zeros(3, device='cpu')\n"
                   "    with torch.autocast('cpu'):\n        return x.cuda() + y.cpu()\n")
    assert [line for _, line in _device_literals(bad)] == [2, 3, 4, 5, 5]


# --- on a GPU ----------------------------------------------------------------------------------------

@cuda
@pytest.mark.parametrize("name", ["fp32", "bf16-mixed", "bf16-frozen"])
def test_cuda_training_matches_cpu_and_resumes_bitwise(tmp_path, name):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(f"line {i}: the quick brown fox jumps over the lazy dog and keeps running far away "
                                f"{i * 7}" for i in range(80)))

    def args(out, **kw):
        base = dict(model="tiny", out=str(tmp_path / out), data=str(corpus), steps=6, batch_size=2, seq_len=16,
                    eval_every=3, eval_batches=1, save_every=3, precision=name, lr=1e-3)
        return TrainArgs(**{**base, **kw})

    p = precision(name)
    on_gpu, model = train(args("gpu", device="cuda"), tiny_model("llama", dtype=p.weights), CharTokenizer(),
                          progress=False)
    assert next(model.parameters()).device.type == "cuda"
    on_cpu, _ = train(args("cpu", device="cpu"), tiny_model("llama", dtype=p.weights), CharTokenizer(), progress=False)
    tol = 1e-4 if name == "fp32" else 5e-2
    assert abs(on_gpu["final_heldout_loss"] - on_cpu["final_heldout_loss"]) < tol
    state = torch.load(tmp_path / "gpu" / "checkpoint" / "state.pt", weights_only=True)
    assert "cuda" in state["rng"]
    # killed during step 5 (after the checkpoint at step 3), then resumed on the GPU: the same adapter, bit for bit
    killed = tiny_model("llama", dtype=p.weights)
    forward, calls = killed.model.forward, {"n": 0}

    def dies(*a, **k):
        calls["n"] += 1
        if calls["n"] == 1 + 1 + 4 + 1 + 1:  # attach's structure check, held-out, 4 steps, held-out at step 3, step 5
            raise KeyboardInterrupt("killed")
        return forward(*a, **k)

    killed.model.forward = dies
    with pytest.raises(KeyboardInterrupt):
        train(args("resumed", device="cuda"), killed, CharTokenizer(), progress=False)
    train(args("resumed", device="cuda", resume=True), tiny_model("llama", dtype=p.weights), CharTokenizer(),
          progress=False)
    from safetensors.torch import load_file

    a, b = (load_file(tmp_path / "gpu" / "adapter_model.safetensors"),
            load_file(tmp_path / "resumed" / "adapter_model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


@cuda
def test_cuda_eval_matches_cpu():
    model = tiny_model("llama")
    pairs = [([1, 5, 6, 7, 8], [9, 10]), ([1, 9], [10, 11, 12])]
    cpu = LogLikelihood(model, CharTokenizer(), progress=False)(pairs)
    gpu = LogLikelihood(model.to("cuda"), CharTokenizer(), progress=False)(pairs)
    assert [g for _, g in cpu] == [g for _, g in gpu]
    assert all(abs(a - b) < 1e-4 for (a, _), (b, _) in zip(cpu, gpu, strict=True))


def test_preproj_runs_from_a_source_tree_that_is_not_installed(tmp_path):
    # benchmarks/gpu_check.sh runs preproj from src/ on PYTHONPATH on a GPU machine that cannot pip install it: no
    # distribution metadata, so the version is said to be unknown rather than failing the import or a saved adapter.
    import subprocess

    script = f"""
import importlib.metadata as metadata
found = metadata.version
def version(name):
    if name == "preproj":
        raise metadata.PackageNotFoundError(name)
    return found(name)
metadata.version = version
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
import json, preproj
from conftest import tiny_model
model = preproj.attach(tiny_model("llama"), preproj.PreProjConfig(mode="skip"))
preproj.save_adapter(model, {str(tmp_path)!r})
print(preproj.__version__, json.load(open({str(tmp_path / "adapter_config.json")!r}))["preproj_version"])
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["unknown", "(not", "installed)"] * 2
