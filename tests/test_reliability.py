"""Nothing lost, nothing silent: bad input, faults and concurrent runs.

A table of malformed invocations of every command, each of which must exit 2 with one line that says
what was wrong and no traceback; the same through the Python API; a run directory owned by one
process at a time; SIGINT/SIGTERM ending a run with a checkpoint that resumes bit for bit; a failed
write leaving the previous files intact; and property-based round trips.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import CharTokenizer, data_dir, input_ids, tiny_model, tiny_model_dir
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from preproj import AdapterError, PreProjConfig, attach, load_adapter, save_adapter
from preproj.cli import main
from preproj.core.adapter import config_from_metadata
from preproj.data import DataNotFound
from preproj.runtime.files import RunInUse, RunLock, WriteFailed, atomic_write
from preproj.training import PretrainArgs, TrainArgs, TrainingInterrupted, pretrain, train

LINES = [f"line {i}: the quick brown fox jumps over the lazy dog and keeps running far away {i * 7}"
         for i in range(300)]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A tiny model directory, a corpus, and files that are wrong in the ways users get them wrong."""
    root = tmp_path_factory.mktemp("reliability")
    (root / "corpus.txt").write_text("\n".join(LINES))
    (root / "empty.txt").write_text("")
    (root / "short-held.txt").write_text("\n".join(f"fox {i}" for i in range(40)))
    (root / "latin1.txt").write_bytes("\n".join(LINES[:2] + ["café " + line for line in LINES]).encode("latin-1"))
    model = tiny_model_dir(root / "model", LINES)
    gpt2 = tiny_model("gpt2")
    save_adapter(attach(gpt2, PreProjConfig()), root / "gpt2-adapter")
    llama_adapter = root / "llama-adapter"
    from preproj import load_model

    save_adapter(attach(load_model(str(model), device="cpu")[0], PreProjConfig()), llama_adapter)
    truncated = root / "truncated-adapter"
    truncated.mkdir()
    (truncated / "adapter_config.json").write_text((llama_adapter / "adapter_config.json").read_text())
    (truncated / "adapter_model.safetensors").write_bytes(
        (llama_adapter / "adapter_model.safetensors").read_bytes()[:100])
    corrupt = root / "corrupt-run"
    (corrupt / "checkpoint").mkdir(parents=True)
    (corrupt / "train_log.jsonl").write_text('{"step": 0}\n')
    (corrupt / "checkpoint" / "state.pt").write_bytes(b"\x00garbage" * 10)
    held = root / "held-run"
    held.mkdir()
    (held / "train_log.jsonl").write_text('{"step": 0}\n')
    (root / "a-file").write_text("not a directory")
    return {"root": root, "model": str(model), "corpus": str(root / "corpus.txt")}


def T(env, *extra):  # a training command on the tiny model that would otherwise run
    return ["train", "--model", env["model"], "--data", env["corpus"], "--steps", "2", "--batch-size", "2",
            "--seq-len", "16", "--device", "cpu", "--precision", "fp32", "--out", str(env["root"] / "unused"), *extra]


def E(env, *extra):  # an evaluation command on the tiny model that would otherwise run
    return ["eval", "--model", env["model"], "--tasks", "lambada", "--limit", "2", "--device", "cpu",
            "--data-dir", str(data_dir()), *extra]


CASES = [
    # (id, argv builder, what the one line must say)
    ("eval-limit-negative", lambda e: E(e, "--limit", "-3"), "argument --limit: must be >= 1, got -3"),
    ("eval-limit-zero", lambda e: E(e, "--limit", "0"), "argument --limit: must be >= 1, got 0"),
    ("eval-limit-text", lambda e: E(e, "--limit", "abc"), "argument --limit: expected an integer, got 'abc'"),
    ("eval-batch-tokens-zero", lambda e: E(e, "--batch-tokens", "0"), "--batch-tokens: must be >= 1"),
    ("eval-max-length-one", lambda e: E(e, "--max-length", "1"), "--max-length: must be >= 2"),
    ("eval-max-length-huge", lambda e: E(e, "--max-length", "100000"),
     "--max-length 100000 exceeds this model's context of 256"),
    ("eval-task-unknown", lambda e: E(e, "--tasks", "nope"), "Unknown task(s) ['nope']"),
    ("eval-tasks-empty", lambda e: E(e, "--tasks", ","), "Unknown task(s) []"),
    ("eval-protocol", lambda e: E(e, "--protocol", "lm-eval"), "protocol must be one of"),
    ("eval-precision-bf16", lambda e: E(e, "--precision", "bf16"), "'bf16' alone is ambiguous"),
    ("eval-precision-fp8", lambda e: E(e, "--precision", "fp8"), "precision must be auto or one of fp32, bf16-mixed"),
    ("eval-device-tpu", lambda e: E(e, "--device", "tpu"), "Unknown device 'tpu'"),
    ("eval-device-cuda", lambda e: E(e, "--device", "cuda:7"), "CUDA"),
    ("eval-model-missing", lambda e: E(e, "--model", str(e["root"] / "nothing")), "No such directory"),
    ("eval-model-file", lambda e: E(e, "--model", str(e["root"] / "a-file")), "is a file, not a model directory"),
    ("eval-adapter-missing", lambda e: E(e, "--adapter", str(e["root"] / "nothing")), "No adapter_config.json"),
    ("eval-adapter-other-family", lambda e: E(e, "--adapter", str(e["root"] / "gpt2-adapter")),
     "model family mismatch"),
    ("eval-adapter-truncated", lambda e: E(e, "--adapter", str(e["root"] / "truncated-adapter")),
     "truncated or corrupt"),
    ("eval-items-without-out", lambda e: E(e, "--items"), "--items writes next to --out; give --out too"),
    ("eval-data-dir-missing", lambda e: E(e, "--data-dir", str(e["root"] / "nothing")), "is not a directory"),
    ("train-steps-zero", lambda e: T(e, "--steps", "0"), "argument --steps: must be >= 1, got 0"),
    ("train-batch-zero", lambda e: T(e, "--batch-size", "0"), "argument --batch-size: must be >= 1"),
    ("train-accum-negative", lambda e: T(e, "--grad-accum", "-1"), "argument --grad-accum: must be >= 1"),
    ("train-seq-one", lambda e: T(e, "--seq-len", "1"), "argument --seq-len: must be >= 2"),
    ("train-seq-huge", lambda e: T(e, "--seq-len", "100000"),
     "--seq-len 100000 exceeds this model's context of 256"),
    ("train-lr-zero", lambda e: T(e, "--lr", "0"), "argument --lr: must be > 0, got 0"),
    ("train-lr-negative", lambda e: T(e, "--lr=-1e-3"), "argument --lr: must be > 0"),
    ("train-lr-nan", lambda e: T(e, "--lr", "nan"), "argument --lr: must be > 0, got nan"),
    ("train-lr-inf", lambda e: T(e, "--lr", "inf"), "argument --lr: must be > 0, got inf"),
    ("train-lr-text", lambda e: T(e, "--lr", "fast"), "argument --lr: expected a number"),
    ("train-warmup-negative", lambda e: T(e, "--warmup", "-1"), "argument --warmup: must be >= 0"),
    ("train-weight-decay-negative", lambda e: T(e, "--weight-decay", "-0.1"), "argument --weight-decay: must be >= 0"),
    ("train-clip-negative", lambda e: T(e, "--max-grad-norm", "-1"), "argument --max-grad-norm: must be >= 0"),
    ("train-eval-every-zero", lambda e: T(e, "--eval-every", "0"), "argument --eval-every: must be >= 1"),
    ("train-save-every-zero", lambda e: T(e, "--save-every", "0"), "argument --save-every: must be >= 1"),
    ("train-eval-batches-zero", lambda e: T(e, "--eval-batches", "0"), "argument --eval-batches: must be >= 1"),
    ("train-nproc-zero", lambda e: T(e, "--nproc", "0"), "argument --nproc: must be >= 1"),
    ("train-lines-zero", lambda e: T(e, "--lines", "0"), "argument --lines: must be >= 1"),
    ("train-lora-rank-zero", lambda e: T(e, "--lora-rank", "0"),
     "--lora-rank must be a positive integer, 'paper' or one of preproj, skip, preproj+skip (the rank that matches "
     "that method's trainable parameters), got '0'"),
    ("train-seed-negative", lambda e: T(e, "--seed", "-5"), "argument --seed: must be >= 0"),
    ("train-unknown-flag", lambda e: T(e, "--learning-rate", "1e-3"), "unrecognized arguments: --learning-rate"),
    ("train-method", lambda e: T(e, "--method", "adapterv2"), "method must be one of"),
    ("train-strategy", lambda e: T(e, "--strategy", "deepspeed"), "strategy must be one of ddp, fsdp"),
    ("train-packing", lambda e: T(e, "--packing", "chunks"), "packing must be 'pack' or 'lines'"),
    ("train-precision", lambda e: T(e, "--precision", "bf16"), "'bf16' alone is ambiguous"),
    ("train-attention", lambda e: T(e, "--attn-implementation", "flash"),
     "attn_implementation must be 'sdpa' or 'eager'"),
    ("train-data-missing", lambda e: T(e, "--data", str(e["root"] / "nothing.txt")), "neither a known corpus"),
    ("train-data-empty", lambda e: T(e, "--data", str(e["root"] / "empty.txt")),
     "has no text: every line is empty"),
    ("train-data-short-held-out", lambda e: T(e, "--data", str(e["root"] / "short-held.txt")),
     "tokens of held-out text (for a file of your own, its last 5% of lines) in 2 lines: fewer than one window of 16"),
    ("train-data-not-utf8", lambda e: T(e, "--data", str(e["root"] / "latin1.txt")),
     "latin1.txt is not UTF-8 text (byte 0xe9 on line 3 is not valid UTF-8): convert it, for a Latin-1 file with "
     "`iconv -f latin1 -t utf-8 latin1.txt > latin1.utf8.txt`"),
    ("train-checkpoint-corrupt", lambda e: [*T(e, "--resume"), "--out", str(e["root"] / "corrupt-run")],
     "could not be read"),
    ("train-out-holds-a-run", lambda e: [*T(e), "--out", str(e["root"] / "held-run")],
     "already holds a run; pass --resume"),
    ("train-out-is-a-file", lambda e: [*T(e), "--out", str(e["root"] / "a-file" / "run")], "Cannot use"),
    ("compare-seeds-zero", lambda e: ["compare", "--seeds", "0"], "argument --seeds: must be >= 1"),
    ("compare-steps-zero", lambda e: ["compare", "--steps", "0"], "argument --steps: must be >= 1"),
    ("compare-limit-negative", lambda e: ["compare", "--limit", "-1"], "argument --limit: must be >= 1"),
    ("compare-methods", lambda e: ["compare", "--methods", "base,dora", "--out", str(e["root"] / "c1")],
     "Unknown method 'dora'; choose from"),
    ("compare-preset", lambda e: ["compare", "--preset", "gpu", "--out", str(e["root"] / "c2")],
     "preset must be one of"),
    ("compare-precisions", lambda e: ["compare", "--precision", "bf16-true", "--eval-precision", "fp32",
                                      "--out", str(e["root"] / "c3")], "pick two that load the base alike"),
    ("inspect-context-zero", lambda e: ["inspect", "--context", "0"], "argument --context: must be >= 1"),
    ("inspect-new-tokens-negative", lambda e: ["inspect", "--new-tokens", "-1"],
     "argument --new-tokens: must be >= 1"),
    ("inspect-mode", lambda e: ["inspect", "--model", e["model"], "--device", "cpu", "--mode", "lora"],
     "mode must join some of"),
    ("inspect-model-missing", lambda e: ["inspect", "--model", str(e["root"] / "nothing")], "No such directory"),
    ("inspect-mode-before-the-model-loads", lambda e: ["inspect", "--model", str(e["root"] / "nothing"), "--mode",
                                                       "preproj+banana"], "mode must join some of"),
    ("harness-limit-negative", lambda e: ["harness", "--tasks", "x", "--limit", "-1"],
     "argument --limit: must be >= 1"),
    ("harness-batch-zero", lambda e: ["harness", "--tasks", "x", "--batch-size", "0"],
     "argument --batch-size: must be >= 1"),
    ("harness-fewshot-negative", lambda e: ["harness", "--tasks", "x", "--num-fewshot", "-2"],
     "argument --num-fewshot: must be >= 0"),
    ("harness-no-tasks", lambda e: ["harness"], "the following arguments are required: --tasks"),
    ("paired-missing-files", lambda e: ["paired", str(e["root"] / "a.items.jsonl"), str(e["root"] / "b.items.jsonl")],
     "a.items.jsonl: no such file"),
    ("paired-a-directory", lambda e: ["paired", str(e["root"]), str(e["root"])], "not items files"),
    ("no-command", lambda e: [], "the following arguments are required: command"),
    ("unknown-command", lambda e: ["finetune"], "invalid choice: 'finetune'"),
]


@pytest.mark.integration
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_invocation_is_one_clear_line(env, case, capsys, monkeypatch):
    assert data_dir() is not None, "../shared/data or $PREPROJ_DATA_DIR is needed"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same answer with or without a GPU
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _, argv, says = case
    assert main(argv(env)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0] == err.strip().splitlines()[-1], err
    assert says in errors[0], errors[0]


def test_the_suite_covers_every_command(monkeypatch):
    monkeypatch.setattr("test_reliability.data_dir", lambda: Path("data"))
    fake = {"root": Path("r"), "model": "m", "corpus": "c"}
    commands = {argv[0] for argv in (build(fake) for _, build, _ in CASES) if argv}
    assert len(CASES) >= 40 and commands == {"eval", "train", "compare", "inspect", "harness", "finetune", "paired"}


@pytest.mark.parametrize("make, says", [
    (lambda: PreProjConfig(mode="lora"), "mode must join some of"),
    (lambda: PreProjConfig(expansion=0), "expansion must be a positive number"),
    (lambda: PreProjConfig(activation="tanh"), "activation must be one of"),
    (lambda: PreProjConfig(adapter_dtype="int8"), "adapter_dtype must be one of"),
    (lambda: PreProjConfig(layers=["a"]), "list of layer indices"),
    (lambda: PreProjConfig(skip_init_std=-1), "non-negative"),
    (lambda: attach(tiny_model("llama"), PreProjConfig(layers=[99])), "out of range"),
    (lambda: attach(attach(tiny_model("llama")), PreProjConfig()), "already carries a preproj adapter"),
    (lambda: train(TrainArgs(lr=-1)), "--lr must be > 0"),
    (lambda: train(TrainArgs(steps=0)), "--steps must be >= 1"),
])
def test_python_api_bad_input_is_a_value_error(make, says):
    with pytest.raises(ValueError, match=None) as info:
        make()
    assert says in str(info.value)


def test_a_data_file_that_is_not_there_fails_before_any_model_loads(tmp_path):
    """The model named here does not exist either: the data's error comes first, so no one waits for a load."""
    missing = dict(model=str(tmp_path / "no-model"), data=str(tmp_path / "nothing.txt"), out=str(tmp_path / "run"))
    with pytest.raises(DataNotFound, match="neither a known corpus"):
        train(TrainArgs(**missing))
    with pytest.raises(DataNotFound, match="neither a known corpus"):
        pretrain(PretrainArgs(data=missing["data"], out=missing["out"]))
    assert not (tmp_path / "run").exists()


def test_a_run_that_fails_before_writing_anything_leaves_no_directory(env, tmp_path, capsys):
    """The lock is the only file such a run made; the directory it made for it goes too (one it found stays)."""
    short = str(env["root"] / "short-held.txt")
    assert main([*T(env, "--data", short), "--out", str(tmp_path / "run")]) == 2
    assert "tokens of held-out text" in capsys.readouterr().err and not (tmp_path / "run").exists()
    (tmp_path / "mine").mkdir()
    assert main([*T(env, "--data", short), "--out", str(tmp_path / "mine")]) == 2
    assert (tmp_path / "mine").is_dir()


def test_adapter_of_another_family_is_refused(tmp_path):
    save_adapter(attach(tiny_model("gpt2"), PreProjConfig()), tmp_path / "a")
    with pytest.raises(AdapterError, match="model family mismatch"):
        load_adapter(tiny_model("llama"), tmp_path / "a")
    # a family row that serves several model types names the model's own type (Gemma 3 is not "gemma2")
    save_adapter(attach(tiny_model("gemma3_text"), PreProjConfig()), tmp_path / "g")
    with pytest.raises(AdapterError, match=r"adapter: 'gemma3_text' \(family 'gemma2'\), model: 'llama'\)"):
        load_adapter(tiny_model("llama"), tmp_path / "g")


# --- a run directory belongs to one process ---------------------------------------------------------

def test_a_second_owner_is_refused_with_the_owners_name(tmp_path):
    with RunLock(tmp_path / "run", "preproj train"), \
            pytest.raises(RunInUse, match=rf"in use by preproj train \(pid {os.getpid()} on .*, started"), \
            RunLock(tmp_path / "run", "preproj train"):
        pass
    with RunLock(tmp_path / "run", "preproj train"):  # released on exit: the next owner gets it
        pass


def test_compare_and_train_refuse_an_owned_directory(tmp_path):
    from preproj.experiments.compare import CompareArgs, run_compare

    with RunLock(tmp_path, "preproj compare"):
        with pytest.raises(RunInUse, match="in use by preproj compare"):
            run_compare(CompareArgs(methods="base", out=str(tmp_path), device="cpu"), progress=False)
        with pytest.raises(RunInUse, match="in use by preproj compare"):
            train(TrainArgs(out=str(tmp_path), device="cpu"), tiny_model("llama"), CharTokenizer(), progress=False)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "preproj", *args]


@pytest.mark.integration
def test_concurrent_runs_refused_and_sigterm_resumes_bitwise(env, tmp_path):
    """Two `preproj train` on one --out: the second is refused while the first runs. SIGTERM stops the
    first after a step with a checkpoint; --resume then ends where an uninterrupted run ends, bit for bit."""
    args = ["train", "--model", env["model"], "--data", env["corpus"], "--steps", "400", "--batch-size", "2",
            "--seq-len", "32", "--save-every", "1000", "--eval-every", "1000", "--device", "cpu", "--precision", "fp32",
            "--lr", "1e-3"]
    quiet = {**os.environ, "TQDM_DISABLE": "1"}
    reference = tmp_path / "reference"
    subprocess.run(_cli(*args, "--out", str(reference)), check=True, capture_output=True, env=quiet, timeout=600)

    run = tmp_path / "run"
    first = subprocess.Popen(_cli(*args, "--out", str(run)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=quiet)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not ((run / "train_log.jsonl").is_file()
                                               and len((run / "train_log.jsonl").read_text().splitlines()) >= 3):
        time.sleep(0.05)
    second = subprocess.run(_cli(*args, "--out", str(run)), capture_output=True, text=True, env=quiet, timeout=120,
                            check=False)
    assert second.returncode == 2
    assert f"is in use by preproj train (pid {first.pid}" in second.stderr and "Traceback" not in second.stderr

    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "stopped by SIGTERM after step" in err and "--resume" in err and "Traceback" not in err
    state = torch.load(run / "checkpoint" / "state.pt", weights_only=True)
    assert 0 < state["step"] < 400 and not (run / "summary.json").exists()

    resumed = subprocess.run(_cli(*args, "--out", str(run), "--resume"), capture_output=True, text=True, env=quiet,
                             timeout=600, check=False)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a, b = load_file(reference / "adapter_model.safetensors"), load_file(run / "adapter_model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_sigint_stops_after_the_step_and_resume_is_bitwise(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(LINES))

    def args(out, **kw):
        return TrainArgs(**{**dict(model="tiny", out=str(tmp_path / out), data=str(corpus), steps=8, batch_size=2,
                                   seq_len=32, eval_every=4, eval_batches=1, save_every=100, precision="fp32",
                                   device="cpu", lr=1e-2), **kw})

    train(args("full"), tiny_model("llama"), CharTokenizer(), progress=False)
    model = tiny_model("llama")
    forward, calls = model.model.forward, {"n": 0}

    def interrupted(*a, **k):
        calls["n"] += 1
        if calls["n"] == 1 + 1 + 3:  # attach's structure check, held-out, the 3rd step: Ctrl-C mid-step
            os.kill(os.getpid(), signal.SIGINT)
        return forward(*a, **k)

    model.model.forward = interrupted
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when the tests run as a background job
    with pytest.raises(TrainingInterrupted,
                       match=r"stopped by SIGINT after step 3; the checkpoint of that step is in") as info:
        train(args("run"), model, CharTokenizer(), progress=False)
    assert info.value.signal == signal.SIGINT
    assert torch.load(tmp_path / "run" / "checkpoint" / "state.pt", weights_only=True)["step"] == 3
    assert signal.getsignal(signal.SIGINT) == before  # the handler is put back
    train(args("run", resume=True), tiny_model("llama"), CharTokenizer(), progress=False)
    a, b = (load_file(tmp_path / "full" / "adapter_model.safetensors"),
            load_file(tmp_path / "run" / "adapter_model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_second_ctrl_c_during_a_checkpoint_write_is_one_line_and_the_last_checkpoint_stands(env, tmp_path, capsys,
                                                                                             monkeypatch):
    run = tmp_path / "run"
    argv = [*T(env, "--steps", "6", "--save-every", "2", "--eval-every", "100"), "--out", str(run)]
    real_save, saves = torch.save, {"n": 0}

    def save(obj, f, *a, **k):
        saves["n"] += 1
        if saves["n"] == 2:  # the checkpoint at step 4: Ctrl-C, then Ctrl-C again, while it is written
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", save)
    assert main(argv) == 128 + signal.SIGINT
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and err.splitlines()[-1].startswith("preproj train: stopped at once by Ctrl-C; the "
                                                                      "last good checkpoint is kept")
    assert "--resume" in err.splitlines()[-1]
    assert torch.load(run / "checkpoint" / "state.pt", weights_only=True)["step"] == 2
    assert not list((run / "checkpoint").glob(".*.tmp"))
    monkeypatch.setattr(torch, "save", real_save)
    assert main([*argv, "--resume"]) == 0


# --- a failed write keeps the last good files ------------------------------------------------------

def test_a_failed_write_leaves_the_previous_file(tmp_path):
    path = tmp_path / "f.json"
    path.write_text("good")

    def full_disk(tmp):
        Path(tmp).write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(WriteFailed,
                       match=r"Could not write .*f\.json \(No space left on device\); the previous version is intact"):
        atomic_write(path, full_disk)
    assert path.read_text() == "good" and [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_full_disk_during_a_checkpoint_keeps_the_last_good_one(tmp_path, monkeypatch):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(LINES))
    args = TrainArgs(model="tiny", out=str(tmp_path / "run"), data=str(corpus), steps=8, batch_size=2, seq_len=32,
                     eval_every=100, eval_batches=1, save_every=3, precision="fp32", device="cpu")
    real_save, saves = torch.save, {"n": 0}

    def save(obj, f, *a, **k):
        saves["n"] += 1
        if saves["n"] == 2:  # the checkpoint at step 6
            Path(f).write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(WriteFailed, match=r"state\.pt \(No space left on device\); the previous version is intact"):
        train(args, tiny_model("llama"), CharTokenizer(), progress=False)
    monkeypatch.setattr(torch, "save", real_save)
    state = torch.load(tmp_path / "run" / "checkpoint" / "state.pt", weights_only=True)
    assert state["step"] == 3 and all(torch.isfinite(t).all() for t in state["params"].values())
    summary, _ = train(TrainArgs(**{**args.__dict__, "resume": True}), tiny_model("llama"), CharTokenizer(),
                       progress=False)
    assert summary["steps"] == 8


def test_full_disk_during_an_adapter_write_keeps_the_previous_adapter(tmp_path, monkeypatch):
    model = attach(tiny_model("llama"), PreProjConfig())
    save_adapter(model, tmp_path)
    before = (tmp_path / "adapter_model.safetensors").read_bytes()
    with torch.no_grad():
        next(p for p in model.parameters() if p.requires_grad).add_(1.0)

    def no_space(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("preproj.core.adapter.save_file", no_space)
    with pytest.raises(WriteFailed, match="the previous version is intact"):
        save_adapter(model, tmp_path)
    assert (tmp_path / "adapter_model.safetensors").read_bytes() == before


# --- properties --------------------------------------------------------------------------------------

configs = st.builds(
    PreProjConfig,
    mode=st.sampled_from(["preproj", "skip", "preproj+skip"]),
    expansion=st.floats(0.1, 3.0, allow_nan=False),
    activation=st.sampled_from(["silu", "gelu", "relu"]),
    preproj_init_std=st.floats(0.0, 0.1),
    skip_init_std=st.floats(0.0, 0.1),
    layers=st.none() | st.lists(st.integers(0, 2), min_size=1, max_size=3),
    adapter_dtype=st.sampled_from(["float32", "bfloat16"]),
)


@settings(max_examples=60, deadline=None)
@given(configs)
def test_config_json_round_trip(config):
    assert PreProjConfig.from_json(config.to_json()) == config


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(["mode", "expansion", "activation", "layers", "adapter_dtype", "skip_init_std",
                                        "bogus"]),
                       st.none() | st.integers(-3, 3) | st.floats(allow_nan=True) | st.text(max_size=8)
                       | st.lists(st.integers(-2, 5), max_size=3)))
def test_any_config_dict_builds_or_says_why(data):
    try:
        config = PreProjConfig.from_dict(data)
    except ValueError as e:
        assert str(e)
    else:
        assert PreProjConfig.from_dict(config.to_dict()) == config


@settings(max_examples=15, deadline=None)
@given(configs, st.sampled_from(["llama", "gpt_neox", "gpt2"]), st.integers(0, 2**16))
def test_adapter_round_trip_gives_identical_logits(tmp_path_factory, config, family, seed):
    model = tiny_model(family)
    torch.manual_seed(seed)
    attach(model, config)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.normal_(std=0.05)
    path = tmp_path_factory.mktemp("adapter")
    save_adapter(model, path)
    loaded = load_adapter(tiny_model(family), path)
    ids = input_ids()
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    assert config_from_metadata(json.loads((path / "adapter_config.json").read_text())) == config


def test_a_stopped_eval_resumes_at_the_batch_it_was_in(env, tmp_path, monkeypatch):
    """`preproj eval --out` keeps each scored batch in OUT.journal: stopped in its second task and run again, it
    scores only what was left and writes what an uninterrupted run writes."""
    from preproj.evaluation import LogLikelihood

    argv = E(env, "--tasks", "lambada,arc_easy", "--limit", "3", "--max-length", "64", "--batch-tokens", "32")
    whole, stopped = tmp_path / "whole.json", tmp_path / "stopped.json"
    real, calls = LogLikelihood._score_batch, []

    def counted(self, batch, n):
        if stop_at is not None and len(calls) == stop_at:
            raise KeyboardInterrupt
        calls.append(n)
        return real(self, batch, n)

    monkeypatch.setattr(LogLikelihood, "_score_batch", counted)
    stop_at = None
    assert main([*argv, "--out", str(whole)]) == 0
    stop_at = len(calls) - 1
    calls.clear()
    assert main([*argv, "--out", str(stopped)]) == 128 + signal.SIGINT  # Ctrl-C: one line, the journal kept
    assert len((tmp_path / "stopped.json.journal").read_text().splitlines()) == stop_at
    calls.clear()
    stop_at = None
    assert main([*argv, "--out", str(stopped)]) == 0
    assert len(calls) == 1  # the batch it was in
    a, b = json.loads(whole.read_text()), json.loads(stopped.read_text())
    assert a.pop("seconds").keys() == b.pop("seconds").keys()
    assert a.pop("provenance").keys() == b.pop("provenance").keys() and a == b  # the records differ in their time
    assert not (tmp_path / "stopped.json.journal").exists()
