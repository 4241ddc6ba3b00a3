"""benchmarks/run.py on a tiny model: its sections run, and the FLOPs it counts are the right ones.

No timing is asserted here; the benchmark itself prints the measured ratios."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import torch
from conftest import set_native_bf16, tiny_model

from preproj import PreProjConfig, attach

RUN = Path(__file__).resolve().parents[1] / "benchmarks" / "run.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("preproj_bench", RUN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_section_counts_exactly_the_matmuls_a_frozen_probe_needs(bench):
    base = tiny_model("llama")  # d=64, 3 layers, pre-projection width 80
    peak = {"bf16": ((64, 64, 64), 1e9), "fp32": ((64, 64, 64), 1e9)}
    # The suite runs eager (PREPROJ_COMPILE=0), so the product's setting here is auto's precision, eager.
    settings = [("preproj+skip", "fp32", "eager"), ("preproj+skip", "bf16-frozen", "eager")]
    r = bench.bench_train(base, rounds=1, log=lambda msg: None, peak=peak, batch=2, seq=16, settings=settings)
    rows, tokens = r["rows"], 2 * 16
    product = r["product"]
    assert product.endswith("/eager")
    assert set(rows) == {"preproj+skip/fp32/eager", "preproj+skip/bf16-frozen/eager", "naive/fp32/eager"} \
        | {f"{m}/{product}" for m in ("preproj+skip", "lora", "base")}
    assert set(r["paired_ratios"]) == {"vs_naive_fp32", "step_vs_lora", "step_vs_base", "bf16_speedup"}
    assert all(row["step_s"] > 0 and row["tokens_per_s"] > 0 and row["mfu"] > 0 for row in rows.values())
    assert set(r["peak_in_rounds"]) == {"bf16_flop_per_s", "fp32_flop_per_s"}
    d, h = 64, 80
    adapter = r["trainable_params"]["preproj+skip"]
    assert adapter == 3 * (2 * d * h + d * d)
    # Over the bare base's step, the adapter adds forward (2N), input-gradient (2N) and weight-gradient (2N)
    # matmuls per token, except the input gradient of layer 0's W_up: nothing below it trains.
    extra = rows[f"preproj+skip/{product}"]["flops_per_step"] - rows[f"base/{product}"]["flops_per_step"]
    assert extra == tokens * (6 * adapter - 2 * d * h)
    assert r["module_flop_share"] == extra / rows[f"base/{product}"]["flops_per_step"]
    assert base.model.layers[0].self_attn.__class__.__name__ != "PreProjAttention"  # the base was copied, not changed


def test_head_section_counts_the_heads_flops(bench):
    """The head's FLOPs: forward (2 V d per scored position) and the hidden states' gradient (2 V d), nothing for
    the frozen weight; the body-only step runs exactly the rest."""
    base = tiny_model("llama")
    r = bench.bench_head(base, rounds=1, log=lambda msg: None, batch=2, seq=16)
    assert set(r["time_share"]) == {"fp32", "bf16"} and set(r["round_seconds"]) == {"step/fp32", "step/bf16",
                                                                                   "body/fp32", "body/bf16"}
    scored = 2 * (16 - 1)  # every position but the last has a target
    assert r["head_flops"] == scored * 4 * base.config.vocab_size * base.config.hidden_size
    assert r["flop_share"] == r["head_flops"] / r["step_flops"]


def test_generate_kv_and_the_targets_table(bench):
    base = tiny_model("gpt_neox")
    before = {k: v.clone() for k, v in base.state_dict().items()}
    adapted = attach(copy.deepcopy(base), PreProjConfig())
    g = bench.bench_generate(base, adapted, rounds=1, new_tokens=3, log=lambda msg: None)
    assert set(g["rows"]) == {"float32/batch1", "float32/batch8", "bfloat16/batch1", "bfloat16/batch8"}
    assert g["flop_ratio"] > 1
    # the adapter's linear layers add kernel time, and the ratio counts each of them (three per adapted layer)
    assert all(row["kernel_ratio"] > 1 for row in g["rows"].values())
    assert all(torch.equal(v, before[k]) for k, v in base.state_dict().items())  # bf16 runs used copies
    kv = bench.bench_kv(base, adapted)
    assert kv["ratio"] == 1.0 and kv["base_bytes"] > 0

    r = {"generate": g, "kv": kv}
    r["targets"] = bench.targets(r)
    assert r["targets"]["kv_cache_ratio"]["met"]
    assert r["targets"]["generation_overhead"]["bound"] == g["flop_ratio"]  # the FLOP ratio is the bound
    table = bench.format_table(r)
    assert "K/V cache" in table and "float32/batch8" in table
    assert f"| {g['rows']['bfloat16/batch1']['kernel_ratio']:.3f} |" in table


def test_eval_adapters_section_times_every_method_standalone(bench, monkeypatch):
    from conftest import CharTokenizer, data_dir

    assert data_dir() is not None, "../shared/data or $PREPROJ_DATA_DIR is needed"
    monkeypatch.setattr(bench, "EVAL_ADAPTER_ITEMS", 1)
    base = tiny_model("llama").eval()
    base.config.max_position_embeddings = 4096  # CharTokenizer: a character per token; 2048-token windows
    r = bench.bench_eval_adapters(base, CharTokenizer(), data_dir(), rounds=1, log=lambda msg: None)
    assert set(r["rows"]) == {"preproj", "skip", "preproj+skip", "lora", "preproj+lora"}
    assert all(row["ratio"] > 0 and row["adapter_s"] > 0 for row in r["rows"].values())
    assert r["worst"] == max(row["ratio"] for row in r["rows"].values())
    assert "eval_adapter_overhead" in bench.figures({"eval_adapters": r})


def test_profile_section_accounts_for_the_whole_call(bench):
    from conftest import CharTokenizer

    base = tiny_model("llama").eval()
    r = bench.bench_profile(base, CharTokenizer(), log=lambda msg: None)
    labels = [t["label"] for t in r["tables"]]
    assert labels[0].startswith("train step") and labels[-1].startswith("evaluation batch")
    for t in r["tables"]:
        assert set(t["seconds"]) == set(bench.CATEGORIES)
        # every category is a share of the one profiled call, and together they are that call
        assert all(v >= 0 for v in t["seconds"].values())
        assert sum(t["seconds"].values()) == pytest.approx(t["wall_seconds"], rel=0.05)
        assert t["seconds"]["GEMMs"] > 0 and all(g["calls"] > 0 and g["alone_flop_per_s"] > 0 for g in t["gemms"])
    assert r["tables"][0]["seconds"]["optimizer (clipping, AdamW)"] > 0
    assert r["tables"][0]["seconds"]["loss (LM head and softmax)"] > 0
    assert "| GEMMs |" in bench.format_profile(r) and r["cpu"]


def test_a_training_steps_ceiling_counts_its_gemms_at_their_speed_alone_and_the_rest_as_measured(bench):
    """Two shapes of 10 GFLOP each: 0.02 s and 0.01 s alone (0.03 s), 0.005 s of GEMMs beyond the listed shapes,
    attention and the loss 0.015 s: the floor is 0.05 s, so a 25 GFLOP step against a 1 TFLOP/s peak reaches 50%."""
    seconds = dict.fromkeys(bench.CATEGORIES, 0.0) | {"GEMMs": 0.045, "attention": 0.01,
                                                     "loss (LM head and softmax)": 0.005}
    shape = {"a": [1000, 1000], "b": [1000, 5000], "dtype": "bf16", "calls": 1}
    gemms = [{**shape, "flop_per_s": 10e9 / 0.025, "seconds": 0.025, "alone_flop_per_s": 10e9 / 0.02},
             {**shape, "flop_per_s": 10e9 / 0.015, "seconds": 0.015, "alone_flop_per_s": 10e9 / 0.01}]
    table = {"label": "train step, bf16-mixed, compiled", "wall_seconds": 0.1, "seconds": seconds, "gemms": gemms}
    text = bench.profile_ceiling(table, 25e9, 1e12)
    assert "take 0.030 s at each shape's speed alone, 67% of the large-GEMM peak" in text
    assert "the step would take 0.050 s: 50% MFU, against 25% in this call" in text
    train = {"rows": {"preproj+skip/bf16-mixed/compiled": {"flops_per_step": 25e9}},
             "peak_in_rounds": {"bf16_flop_per_s": 1e12, "fp32_flop_per_s": 1e11}}
    assert text in bench.format_profile({"cpu": "x", "tables": [table]}, train)


def test_the_evaluation_ceiling_frees_everything_but_the_gemms_and_attention(bench):
    seconds = dict.fromkeys(bench.CATEGORIES, 0.0) | {"GEMMs": 0.05, "attention": 0.01}
    shape = {"a": [8, 4], "b": [4, 4], "dtype": "fp32", "calls": 1}
    gemms = [{**shape, "flop_per_s": 1e9, "seconds": 0.04, "alone_flop_per_s": 2e9}]  # half as fast as alone
    table = {"label": "evaluation batch (8 x 123 tokens), fp32", "wall_seconds": 0.1, "seconds": seconds,
             "gemms": gemms}
    text = bench.eval_ceiling(table)
    # 0.02 s alone + 0.01 s of GEMMs beyond the listed shapes + 0.01 s of attention = 0.04 s of a 0.1 s call
    assert "GEMMs take 0.020 s at each shape's speed alone" in text and "0.040 s, 2.50x faster" in text
    assert text in bench.format_profile({"cpu": "x", "tables": [table]}, {"rows": {}})


@pytest.mark.parametrize("native", [True, False])
def test_the_product_setting_is_what_preproj_train_picks(bench, monkeypatch, native):
    """The targets are checked in `preproj train`'s default setting: on a CPU with native bf16 that is the frozen
    base stored in bf16, compiled (a benchmark that asked 'auto' without saying the base is frozen timed
    bf16-mixed as the default), and fp32 eager where bf16 is emulated."""
    set_native_bf16(monkeypatch, native)
    monkeypatch.delenv("PREPROJ_COMPILE")  # the suite's own default (eager), not the product's
    assert bench.product_setting(torch.device("cpu")) == (("bf16-frozen", "compiled") if native else ("fp32", "eager"))
