"""Several processes for real: `preproj train --nproc 2` (torchrun, gloo on CPU) on a tiny model directory.

Each check compares against one process: DDP and FSDP2 at micro-batch b on 2 processes against 1
process at 2b, a run with one rank killed and resumed against an uninterrupted one, and distributed
evaluation against a single process's JSON.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import data_dir, small_mnist, tiny_model_dir
from safetensors.torch import load_file

from preproj import load_adapter, load_model
from preproj.cli import main

LINES = [f"line {i}: the quick brown fox jumps over the lazy dog and keeps running far away {i * 7}"
         for i in range(300)]
TRAIN = ["--data", "CORPUS", "--grad-accum", "2", "--seq-len", "32", "--lr", "1e-2", "--warmup", "2",
         "--eval-every", "3", "--eval-batches", "2", "--save-every", "2", "--precision", "fp32", "--device", "cpu"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(LINES))
    model = tiny_model_dir(root / "model", LINES)
    return root, str(model), [str(corpus) if a == "CORPUS" else a for a in TRAIN]


def preproj_cmd(*args: str, nproc: int = 2) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "preproj",
            *args]


def run(cmd: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "TQDM_DISABLE": "1"},
                          check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def log_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def adapter_of(out: Path) -> dict[str, torch.Tensor]:
    return load_file(out / "adapter_model.safetensors")


@pytest.fixture(scope="module")
def single(setup):
    """One process at micro-batch 4: the reference."""
    root, model, train = setup
    assert main(["train", "--model", model, *train, "--steps", "6", "--batch-size", "4",
                 "--out", str(root / "single")]) == 0
    return root / "single"


def assert_same_run(a: Path, b: Path, tol: float, adapter: str = "") -> None:
    """The same training log and adapter (in `adapter` under each run: pretrain writes it to OUT/adapter)."""
    ta, tb = adapter_of(a / adapter), adapter_of(b / adapter)
    assert ta
    assert set(ta) == set(tb)
    for k in ta:
        assert torch.allclose(ta[k], tb[k], rtol=0, atol=tol), (k, float((ta[k] - tb[k]).abs().max()))
    la, lb = log_of(a), log_of(b)
    assert [r["step"] for r in la] == [r["step"] for r in lb]
    for ra, rb in zip(la, lb, strict=True):
        for key in ("loss", "heldout_loss"):
            assert (key in ra) == (key in rb)
            if key in ra:
                assert abs(ra[key] - rb[key]) <= tol, (ra, rb)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_equal_one_process_at_twice_the_batch(setup, single, strategy):
    root, model, train = setup
    out = root / f"two-{strategy}"
    proc = run(preproj_cmd("train", "--model", model, *train, "--steps", "6", "--batch-size", "2",
                           "--strategy", strategy, "--out", str(out)))
    assert proc.stdout.count("summary:") == 1  # rank 0 alone reports
    assert_same_run(single, out, 1e-5)
    config = json.loads((out / "train_config.json").read_text())
    assert config["world_size"] == 2 and config["global_batch_size"] == 4
    # the saved adapter is the usual two files, unsharded, and loads into one process
    fresh = load_adapter(load_model(model, device="cpu")[0], out)
    reference = load_adapter(load_model(model, device="cpu")[0], single)
    ids = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(fresh(ids).logits, reference(ids).logits, atol=1e-4)
    if strategy == "fsdp":  # the sharded checkpoint holds exactly the parameters the adapter file was written from
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        assert (out / "checkpoint" / "meta.pt").is_file() and list((out / "checkpoint").glob("*.distcp"))
        dcp_to_torch_save(str(out / "checkpoint"), str(root / "fsdp-full.pt"))
        full = torch.load(root / "fsdp-full.pt", weights_only=True)["model"]
        saved = adapter_of(out)
        for k, v in saved.items():
            i, rest = k.split(".", 2)[1:]
            assert torch.equal(full[f"model.model.layers.{i}.self_attn.{rest}"], v), k
        del dcp


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _rank_of(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_killed_rank_resumes_to_the_same_adapter_bitwise(setup, strategy):
    root, model, train = setup
    args = ["train", "--model", model, *train, "--steps", "30", "--batch-size", "2", "--strategy", strategy]
    full = root / f"full-{strategy}"
    run(preproj_cmd(*args, "--out", str(full)))

    killed = root / f"killed-{strategy}"
    proc = subprocess.Popen(preproj_cmd(*args, "--out", str(killed)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "TQDM_DISABLE": "1"})
    deadline, victim = time.monotonic() + 240, None
    while victim is None and time.monotonic() < deadline and proc.poll() is None:
        log = killed / "train_log.jsonl"
        if log.is_file() and len(log.read_text().splitlines()) >= 6:  # past the checkpoint at step 4
            victim = next((p for p in _children(proc.pid) if _rank_of(p) == 1), None)
            if victim:
                os.kill(victim, signal.SIGKILL)
        time.sleep(0.01)
    proc.communicate(timeout=120)
    assert victim is not None, "the run ended before rank 1 could be killed"
    assert proc.returncode != 0, "torchrun reported success although rank 1 was killed"
    steps_done = log_of(killed)[-1]["step"]
    assert steps_done < 30 and not (killed / "summary.json").exists()

    run(preproj_cmd(*args, "--out", str(killed), "--resume"))
    a, b = adapter_of(full), adapter_of(killed)
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["step"] for r in log_of(killed)] == list(range(31))
    assert log_of(killed)[-1]["heldout_loss"] == log_of(full)[-1]["heldout_loss"]


@pytest.mark.integration
def test_distributed_eval_writes_the_single_process_json(setup, tmp_path):
    assert data_dir() is not None, "../shared/data or $PREPROJ_DATA_DIR is needed"
    _, model, _ = setup
    args = ["eval", "--model", model, "--tasks", "lambada,wikitext,arc_easy", "--limit", "7", "--max-length", "64",
            "--device", "cpu", "--data-dir", str(data_dir())]
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    # the same thread count as each torchrun worker, so that every kernel reduces in the same order
    run(["env", "OMP_NUM_THREADS=1", *preproj_cmd(*args, "--out", str(one), nproc=1)])
    run(preproj_cmd(*args, "--out", str(two)))
    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    assert a.pop("seconds").keys() == b.pop("seconds").keys()
    made = [x.pop("provenance") for x in (a, b)]  # which command, threads and when: the two differ there alone
    assert made[0]["git_commit"] == made[1]["git_commit"] and made[0]["threads"] == 1
    assert a == b and a["tasks"]["lambada"]["n"] == 7
    assert not list(tmp_path.glob("*.journal*"))  # every process's journal goes when the evaluation is written


def test_fsdp_keeps_fp32_adapter_masters_on_a_bf16_base(setup):
    """bf16-frozen under FSDP2: a bf16 base and float32 adapter masters share each layer's shard group."""
    root, model, train = setup
    out = root / "fsdp-bf16-frozen"
    args = [a if a != "fp32" else "bf16-frozen" for a in train]
    run(preproj_cmd("train", "--model", model, *args, "--steps", "4", "--batch-size", "2", "--strategy", "fsdp",
                    "--method", "preproj+lora", "--out", str(out)))
    assert {t.dtype for t in adapter_of(out).values()} == {torch.float32}
    assert {t.dtype for t in load_file(out / "lora" / "adapter_model.safetensors").values()} == {torch.float32}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["precision"] == "bf16-frozen" and summary["final_heldout_loss"] < summary["initial_heldout_loss"]


def test_compare_refuses_fsdp_across_processes(monkeypatch, tmp_path):
    from preproj.experiments.compare import CompareArgs, run_compare
    from preproj.runtime import distributed

    monkeypatch.setattr(distributed, "setup", lambda device: distributed.Ranks(0, 2, 0))
    with pytest.raises(ValueError, match="use --strategy ddp"):
        run_compare(CompareArgs(methods="base", strategy="fsdp", device="cpu", out=str(tmp_path)), progress=False)


def pretrain_args(root: Path, vocab: int = 300, tokens: int = 4 * 4 * 32, warmup: int = 1, every: int = 2) -> list[str]:
    """A tiny `preproj pretrain` on the shared corpus, checkpointed and evaluated every `every` steps."""
    return ["pretrain", "--data", str(root / "corpus.txt"), "--tokenizer", f"train:{vocab}", "--layers", "2",
            "--d-model", "32", "--heads", "2", "--seq-len", "32", "--tokens", str(tokens), "--lr", "1e-2",
            "--warmup", str(warmup), "--eval-every", str(every), "--eval-batches", "2", "--save-every", str(every),
            "--precision", "fp32", "--device", "cpu", "--sample-tokens", "2"]


def test_pretraining_on_two_processes_equals_one_process_at_twice_the_batch(setup):
    """`preproj pretrain --nproc 2` runs train's DDP loop with every weight trainable: same losses and weights."""
    root, _, _ = setup
    common = pretrain_args(root, tokens=6 * 4 * 32, warmup=2, every=3)
    assert main([*common, "--batch-size", "4", "--out", str(root / "pt-one")]) == 0
    proc = run(preproj_cmd(*common, "--batch-size", "2", "--out", str(root / "pt-two")))
    assert proc.stdout.count("summary:") == 1
    one, two = log_of(root / "pt-one"), log_of(root / "pt-two")
    assert [r["step"] for r in one] == [r["step"] for r in two] == [0, 1, 2, 3, 4, 5, 6]
    for a, b in zip(one, two, strict=True):
        for key in ("loss", "heldout_loss"):
            assert (key in a) == (key in b) and abs(a.get(key, 0) - b.get(key, 0)) <= 1e-5, (a, b)
    wa, wb = load_file(root / "pt-one" / "model.safetensors"), load_file(root / "pt-two" / "model.safetensors")
    assert set(wa) == set(wb) and all(torch.allclose(wa[k], wb[k], rtol=0, atol=1e-5) for k in wa)
    assert adapter_of(root / "pt-one" / "adapter").keys() == adapter_of(root / "pt-two" / "adapter").keys()


def test_pretraining_sharded_by_fsdp_saves_and_scores_a_vocabulary_that_does_not_split_evenly(setup):
    """FSDP2 shards the embedding by rows: 301 rows on two processes are an uneven shard, which save_pretrained could
    not flatten, and after training the model is scored whole. Same run as one process, to rounding."""
    root, _, _ = setup
    common = pretrain_args(root, vocab=301)
    one, two = root / "fsdp-pt-one", root / "fsdp-pt-two"
    assert main([*common, "--batch-size", "4", "--out", str(one)]) == 0
    proc = run(preproj_cmd(*common, "--batch-size", "2", "--strategy", "fsdp", "--out", str(two)))
    assert proc.stdout.count("summary:") == 1
    wa, wb = load_file(one / "model.safetensors"), load_file(two / "model.safetensors")
    assert wa["model.embed_tokens.weight"].shape[0] == 301
    assert set(wa) == set(wb) and all(torch.allclose(wa[k], wb[k], rtol=0, atol=1e-5) for k in wa)
    ta, tb = adapter_of(one / "adapter"), adapter_of(two / "adapter")
    assert set(ta) == set(tb) and all(torch.allclose(ta[k], tb[k], rtol=0, atol=1e-5) for k in ta)
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (one, two))
    assert abs(sa["loss"]["validation"] - sb["loss"]["validation"]) <= 1e-5


def test_a_block_change_trained_from_scratch_on_two_processes_equals_one_process(setup):
    """The gate's hook reads the normed input inside the wrapped attention, under DDP with every weight training."""
    root, _, _ = setup
    common = [*pretrain_args(root), "--method", "preproj+skip+gate"]
    one, two = root / "gate-one", root / "gate-two"
    assert main([*common, "--batch-size", "4", "--out", str(one)]) == 0
    proc = run(preproj_cmd(*common, "--batch-size", "2", "--out", str(two)))
    assert proc.stdout.count("summary:") == 1
    assert_same_run(one, two, 1e-5, adapter="adapter")


def test_the_value_residual_under_fsdp_equals_one_process(setup, tmp_path):
    """Layer 0's values feed every later layer, each its own FSDP unit (a frozen base: the λ of every later layer
    train, sharded with their layer)."""
    root, model, train = setup
    args = ["train", "--model", model, *train, "--steps", "4", "--method", "value-residual"]
    assert main([*args, "--batch-size", "4", "--out", str(tmp_path / "one")]) == 0
    proc = run(preproj_cmd(*args, "--batch-size", "2", "--strategy", "fsdp", "--out", str(tmp_path / "two")))
    assert proc.stdout.count("summary:") == 1
    assert_same_run(tmp_path / "one", tmp_path / "two", 1e-5)


def test_the_value_residual_trained_from_scratch_under_fsdp_equals_one_process(setup):
    """Every weight trains: layer 0's value projection, resharded after its forward, gets its gradient from every
    later layer's attention as well as its own. Against one process summing the same two half-batches (at twice
    the batch, this tiny model's Adam steps amplify the summation order's rounding to ~1e-4, under DDP as well)."""
    root, _, _ = setup
    common = [*pretrain_args(root), "--method", "value-residual", "--batch-size", "2"]
    one, two = root / "vres-one", root / "vres-two"
    # each process scores its own eval batches: one process scores both shares
    assert main([*common, "--grad-accum", "2", "--eval-batches", "4", "--out", str(one)]) == 0
    proc = run(preproj_cmd(*common, "--strategy", "fsdp", "--out", str(two)))
    assert proc.stdout.count("summary:") == 1
    assert_same_run(one, two, 1e-6, adapter="adapter")
    wa, wb = load_file(one / "model.safetensors"), load_file(two / "model.safetensors")
    assert "model.layers.0.self_attn.v_proj.weight" in wa
    assert set(wa) == set(wb) and all(torch.allclose(wa[k], wb[k], rtol=0, atol=1e-6) for k in wa)


@pytest.mark.parametrize("task, shape", [
    ("mnist", ["--patch-size", "7", "--tokens", str(6 * 8 * 16)]),  # 6 steps of 8 examples, 16 or 64 tokens each
    ("moving-mnist", ["--patch-size", "16", "--frames", "8", "--context", "4", "--tokens", str(6 * 8 * 64)]),
    ("mnist", ["--patch-size", "7", "--tokens", str(6 * 8 * 16), "--strategy", "fsdp"]),
], ids=["mnist", "moving-mnist", "mnist-fsdp"])
def test_a_vision_model_pretrained_on_two_processes_equals_one_process_at_twice_the_batch(task, shape, tmp_path):
    """`preproj pretrain --task mnist|moving-mnist --nproc 2`: the examples split across processes, the same losses,
    weights and per-item scores as one process."""
    data = small_mnist(tmp_path / "data")
    common = ["pretrain", "--task", task, "--data-dir", str(data), "--layers", "2", "--d-model", "32", "--heads", "2",
              *shape, "--lr", "3e-3", "--warmup", "2", "--eval-every", "3",
              "--eval-batches", "2", "--save-every", "3", "--precision", "fp32", "--device", "cpu", "--no-compile"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert main([*common, "--batch-size", "8", "--out", str(one)]) == 0
    proc = run(preproj_cmd(*common, "--batch-size", "4", "--out", str(two)))
    assert proc.stdout.count("summary:") == 1
    la, lb = log_of(one), log_of(two)
    assert [r["step"] for r in la] == [r["step"] for r in lb] == list(range(7))
    for a, b in zip(la, lb, strict=True):
        for key in ("loss", "heldout_loss"):
            assert (key in a) == (key in b) and abs(a.get(key, 0) - b.get(key, 0)) <= 1e-5, (a, b)
    wa, wb = load_file(one / "model.safetensors"), load_file(two / "model.safetensors")
    assert set(wa) == set(wb) and all(torch.allclose(wa[k], wb[k], rtol=0, atol=1e-5) for k in wa)
    key = task.replace("-", "_")
    ia, ib = ([json.loads(x) for x in (d / f"items.{key}.jsonl").read_text().splitlines()] for d in (one, two))
    assert all(abs(a["loss"] - b["loss"]) <= 1e-5 for a, b in zip(ia, ib, strict=True))
