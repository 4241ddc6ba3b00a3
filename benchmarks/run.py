"""Speed and memory of preproj on the embedded model, as ratios measured side by side in one run.

    python benchmarks/run.py [--model smollm2-135m] [--out benchmarks/results/bench.json] [--only train,generate,...]
    python benchmarks/run.py --profile      # where a step's time goes, op by op, and which kernels run the GEMMs

Sections (each prints as it goes; the table and the targets come at the end; JSON goes to --out):

  peak      the bf16 and fp32 matmul peak of this machine: the fastest of large square and model-shaped
            products; the train section runs that product in every round next to the steps
  head      the LM head and loss's share of a frozen-probe training step (time, side by side; FLOPs)
  train     one frozen-probe training step (batch 4 x seq 256: autocast, fused loss, backward, clip,
            AdamW): preproj+skip in bf16-mixed, bf16-frozen and fp32, each eager and compiled; parameter-
            matched LoRA and the bare base (a frozen base whose embedding output requires grad, so backward
            runs through every layer as for any adapter) in the setting `preproj train` picks here by
            default; the naive fp32 loop a user writes without preproj (wrapper modules, torch's AdamW, the
            model's own loss), the bar; and compiled bf16-frozen with eager attention, for reference.
            FLOPs: the matmuls torch actually ran (FlopCounterMode) plus attention at 12 L T d per
            token (nanoGPT's convention; FlopCounterMode does not count the CPU flash kernel).
            MFU = FLOP/s over the peak of the same dtype in the same round (median over rounds).
  generate  greedy tokens/s, adapted (preproj+skip, paper init) over base, batch 1 and 8, fp32 and bf16
  kv        K/V cache bytes after a 1024-token prefill, adapted over base
  eval      `preproj eval` time over lm-evaluation-harness HFLM time, same items, model and dtype
  memory    peak resident memory of a 4-step `preproj train` run and of a `preproj eval` run, each in
            a fresh process, next to the resident memory of just loading the model
  profile   (--profile) one training step, eager and in the default setting, and one evaluation batch
            under torch.profiler: seconds in GEMMs (by shape, against the same product alone), attention,
            elementwise ops, compiled kernels, casts, the loss, the optimizer and Python
  isa       (--profile, CPU) the oneDNN kernel of every GEMM in a bf16 step (ONEDNN_VERBOSE), and the
            step with oneDNN held to AVX-512 bf16 (ONEDNN_MAX_CPU_ISA) against the default: what AMX adds

Rounds are interleaved (A B C, A B C, ...); times are medians over rounds and each ratio is the
median of the per-round ratios, so a machine that slows down mid-run slows every contender alike.
The ratios are what count.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import record_function
from torch.utils.flop_counter import FlopCounterMode

from preproj import PreProjConfig, attach, load_model
from preproj.core.compiling import compiled_blocks
from preproj.core.loss import causal_lm_loss
from preproj.experiments.inspection import kv_cache_bytes
from preproj.methods import build_method
from preproj.runtime.files import write_json
from preproj.runtime.precision import compute_context as compute_context_for
from preproj.runtime.precision import precision as precision_for
from preproj.runtime.precision import resolve_device
from preproj.training import make_optimizer
from preproj.training.args import TrainArgs
from preproj.training.loop import resolved_args

TARGETS = {  # name: (comparison, bound, what it says); a bound of None is computed from the run (see bounds())
    "vs_naive_fp32": (">=", 2.5, "naive fp32 loop's step time / preproj+skip's in the product setting"),
    "train_mfu_bf16": (">=", 0.50, "preproj+skip training MFU in the product setting (bf16 peak)"),
    "train_step_vs_base": ("<=", None, "preproj+skip step / bare base step (bound 1 + 1.1 x the modules' FLOP share)"),
    "train_step_vs_lora": ("<=", 1.05, "preproj+skip step time / param-matched LoRA's"),
    "generation_overhead": ("<=", None, "greedy generation time, adapted / base (worst of batch 1, 8; bound: FLOPs)"),
    "kv_cache_ratio": ("==", 1.0, "K/V cache bytes, adapted / base"),
    "eval_vs_harness": ("<=", 0.5, "preproj eval time / harness HFLM time"),
    "eval_adapter_overhead": ("<=", 1.30, "`preproj eval --adapter` time / the base's (worst method)"),
    "train_memory_gib": ("<=", 2.85, "peak resident memory of a 4-step `preproj train`, GiB"),
}
BATCH, SEQ = 4, 256
DEVICE = torch.device("cpu")  # set from --device in main(); every tensor below is made on it
DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
PRECISION_OF = {"bf16": "bf16-mixed", "fp32": "fp32"}
EVAL_LIMITS = {"lambada": 200, "hellaswag": 50, "arc_easy": 100, "wikitext": 3}
EVAL_ADAPTER_ITEMS = 2  # per task (LAMBADA items, WikiText-2 documents at 2048-token windows) for eval_adapters


def synchronize() -> None:
    """Wait for the device's queued work: GPU kernels run asynchronously, so a timer must wait for them."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def interleaved_times(fns: dict, rounds: int) -> dict[str, list[float]]:
    """Seconds of each call of each fn over `rounds` interleaved rounds (after one warm-up call each)."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            synchronize()
            start = time.perf_counter()
            fn()
            synchronize()
            times[name].append(time.perf_counter() - start)
    return times


def paired_ratio(times: dict[str, list[float]], num: str, den: str) -> float:
    """Median over rounds of num's time over den's time in the same round: neighbours in time share the
    machine's state, so this is steadier than a ratio of medians on a noisy machine."""
    return statistics.median(a / b for a, b in zip(times[num], times[den]))


# --- peak ----------------------------------------------------------------------------------------

def matmul_peak(dtype: torch.dtype, shapes: list[tuple[int, int, int]] | None = None,
                seconds: float = 1.0) -> tuple[float, tuple[int, int, int]]:
    """(FLOP/s, shape) of the fastest of `shapes` in `dtype`; by default large square products, the peak MFU is
    measured against. (A model-shaped product repeated alone can beat it: its operands stay in cache, which they
    do not in a training step.)"""
    sizes = (1024, 2048, 3072) + ((8192,) if DEVICE.type == "cuda" else ())  # a GPU needs large products to peak
    shapes = shapes or [(n, n, n) for n in sizes]
    best = (0.0, shapes[0])
    for m, k, n in shapes:
        a, b = torch.randn(m, k, dtype=dtype, device=DEVICE), torch.randn(k, n, dtype=dtype, device=DEVICE)
        a @ b
        synchronize()
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / len(shapes) or calls < 3:
            a @ b
            calls += 1
            if calls % 16 == 0:
                synchronize()
        synchronize()
        best = max(best, (2 * m * k * n * calls / (time.perf_counter() - start), (m, k, n)))
    return best


def peak_workload(dtype: torch.dtype, shape: tuple[int, int, int], flop_per_s: float, seconds: float = 0.5):
    """(fn, FLOPs per call): the peak product repeated for about `seconds`, to time in the same rounds as the steps."""
    m, k, n = shape
    a, b = torch.randn(m, k, dtype=dtype, device=DEVICE), torch.randn(k, n, dtype=dtype, device=DEVICE)
    reps = max(1, round(seconds * flop_per_s / (2 * m * k * n)))

    def run() -> None:
        for _ in range(reps):
            a @ b

    return run, 2 * m * k * n * reps


# --- train ---------------------------------------------------------------------------------------

def training_setup(base, method: str, weights: torch.dtype = torch.float32):
    """(model, optimizer or None) ready for `train_step`; the base is deep-copied (in `weights`), never modified."""
    model = copy.deepcopy(base).to(weights)
    if method == "base":
        model.requires_grad_(False)
        model.get_input_embeddings().register_forward_hook(lambda mod, inp, out: out.requires_grad_())
        model.train()
        return model, None
    model = build_method(model, method).train()
    return model, make_optimizer([p for p in model.parameters() if p.requires_grad], lr=1e-6)


def train_step(model, optimizer, ids: torch.Tensor, precision: str) -> None:
    """What one `preproj train` micro-step with one micro-batch does (training/loop.py)."""
    with record_function("preproj::forward"), compute_context_for(precision, ids.device):
        loss = causal_lm_loss(model, ids, ids)
    with record_function("preproj::backward"):
        loss.backward()
    if optimizer is not None:
        with record_function("preproj::optimizer"):
            torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def naive_setup(base):
    """The loop a user writes in thirty lines without preproj's training code: the wrapper modules on the float32
    base, torch's AdamW, the model's own loss, float32 throughout."""
    model = attach(copy.deepcopy(base), PreProjConfig(mode="preproj+skip")).train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)

    def step(ids: torch.Tensor) -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    return step


def step_flops(model, optimizer, ids: torch.Tensor, precision: str) -> float:
    counter = FlopCounterMode(display=False)
    with counter:
        train_step(model, optimizer, ids, precision)
    counted = counter.get_flop_counts()["Global"]
    if any("scaled_dot_product" in str(op) for op in counted):
        raise RuntimeError("FlopCounterMode counted attention; drop the analytic attention term.")
    cfg = model.config if hasattr(model, "config") else model.get_base_model().config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    attention = 12 * cfg.num_hidden_layers * ids.shape[1] * cfg.num_attention_heads * head_dim * ids.numel()
    return counter.get_total_flops() + attention


def product_setting(device: torch.device) -> tuple[str, str]:
    """(precision, eager or compiled) that `preproj train` picks by default on `device`, asked of its own rule."""
    chosen = resolved_args(TrainArgs(), device)
    return chosen.precision, "compiled" if chosen.compile else "eager"


TRAIN_SETTINGS = [  # (method, precision, mode); the product's own setting is added if it is not among them
    ("preproj+skip", "bf16-mixed", "eager"), ("preproj+skip", "bf16-mixed", "compiled"),
    ("preproj+skip", "bf16-frozen", "eager"), ("preproj+skip", "bf16-frozen", "compiled"),
    ("preproj+skip", "fp32", "eager"), ("preproj+skip", "fp32", "compiled"),
    ("preproj+skip", "bf16-frozen", "compiled, eager attention"),  # `--attn-implementation eager`, for reference
]


def bench_train(base, rounds: int, log, peak: dict, batch: int = BATCH, seq: int = SEQ,
                settings: list[tuple[str, str, str]] = TRAIN_SETTINGS) -> dict:
    """`peak`: {"bf16": (shape, flop_per_s), "fp32": ...} from matmul_peak. The peak product runs in every
    round next to the steps, and each round's MFU divides by that round's peak: a machine that slows
    down for a while slows both. LoRA and the bare base run in the product's setting (what `preproj train` picks
    here by default), as preproj+skip does in every setting; the naive float32 loop is the bar."""
    ids = torch.randint(0, base.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    product = product_setting(DEVICE)
    settings = list(dict.fromkeys([*settings, *((m, *product) for m in ("preproj+skip", "lora", "base"))]))
    steps, flops, trainable, holds = {}, {}, {}, contextlib.ExitStack()
    for method, precision, mode in settings:
        weights = precision_for(precision).weights
        model, opt = training_setup(base, method, weights)
        if method not in flops:
            trainable[method] = sum(p.numel() for p in model.parameters() if p.requires_grad)
            flops[method] = step_flops(model, opt, ids, "fp32")  # FLOPs do not depend on the dtype
            log(f"  {method}: {flops[method] / 1e9:.0f} GFLOP per step of {ids.numel()} tokens")
        if mode.endswith("eager attention"):
            (model.get_base_model() if hasattr(model, "get_base_model") else model).set_attn_implementation("eager")
        if mode.startswith("compiled"):
            holds.enter_context(compiled_blocks(model, True, DEVICE))
        key = f"{method}/{precision}/{mode}"
        steps[key] = lambda m=model, o=opt, p=precision: train_step(m, o, ids, p)
        start = time.perf_counter()
        steps[key]()  # the warm-up call: for a compiled setting, the compile
        log(f"  {key:<32} first step {time.perf_counter() - start:6.1f} s")
    naive = naive_setup(base)
    steps["naive/fp32/eager"] = lambda: naive(ids)
    flops["naive"] = flops["preproj+skip"]  # the same matmuls, run the slow way
    peak_flops = {}
    for dtype, (shape, flop_per_s) in peak.items():
        steps[f"peak/{dtype}"], peak_flops[dtype] = peak_workload(getattr(torch, DTYPES[dtype]), shape, flop_per_s)
    log(f"  timing {len(steps)} configurations x {rounds} rounds ...")
    with holds:
        times = interleaved_times(steps, rounds)
    peak_rounds = {dtype: [peak_flops[dtype] / t for t in times.pop(f"peak/{dtype}")] for dtype in peak}
    rows = {}
    for key, t in times.items():
        s = statistics.median(t)
        method, precision, mode = key.split("/")
        dtype = "fp32" if precision == "fp32" else "bf16"
        mfu = statistics.median(flops[method] / ti / p for ti, p in zip(t, peak_rounds[dtype]))
        rows[key] = {"method": method, "precision": precision, "mode": mode, "step_s": s,
                     "tokens_per_s": ids.numel() / s, "flops_per_step": flops[method],
                     "flop_per_s": flops[method] / s, "mfu": mfu, "round_seconds": t}
        log(f"  {key:<32} {s:6.2f} s/step  {ids.numel() / s:6.0f} tok/s  "
            f"{flops[method] / s / 1e9:6.1f} GFLOP/s  MFU {mfu:.0%}")
    mine = "/".join(product)
    ratios = {"vs_naive_fp32": paired_ratio(times, "naive/fp32/eager", f"preproj+skip/{mine}"),
              "step_vs_lora": paired_ratio(times, f"preproj+skip/{mine}", f"lora/{mine}"),
              "step_vs_base": paired_ratio(times, f"preproj+skip/{mine}", f"base/{mine}"),
              "bf16_speedup": paired_ratio(times, "preproj+skip/fp32/eager", f"preproj+skip/{mine}")}
    peaks = {f"{dtype}_flop_per_s": statistics.median(p) for dtype, p in peak_rounds.items()}
    return {"batch": batch, "seq_len": seq, "product": mine, "rows": rows, "paired_ratios": ratios,
            "module_flop_share": (flops["preproj+skip"] - flops["base"]) / flops["base"],
            "peak_in_rounds": peaks, "trainable_params": trainable}


def bench_head(base, rounds: int, log, batch: int = BATCH, seq: int = SEQ) -> dict:
    """The LM head's share of a frozen-probe training step (preproj+skip, fp32 and bf16): the whole step against
    the same step with the head and loss replaced by a fixed linear function of the final hidden states, timed
    in interleaved rounds; and its share of the step's FLOPs (FlopCounterMode). What sizes runs on a model
    whose vocabulary is large (Gemma 3: 262k tokens)."""
    from preproj.core.loss import body_and_head

    ids = torch.randint(0, base.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    model, optimizer = training_setup(base, "preproj+skip")
    body, _ = body_and_head(model)
    direction = torch.randn(batch, seq, base.config.hidden_size, generator=torch.Generator().manual_seed(1)).to(DEVICE)

    def body_step(precision: str) -> None:
        with compute_context_for("bf16-mixed" if precision == "bf16" else "fp32", ids.device):
            hidden = body(input_ids=ids).last_hidden_state
        (hidden.float() * direction).sum().backward()
        optimizer.zero_grad(set_to_none=True)

    steps = {f"{part}/{precision}": (lambda p=precision: train_step(model, optimizer, ids, PRECISION_OF[p]))
             if part == "step"
             else (lambda p=precision: body_step(p)) for part in ("step", "body") for precision in ("fp32", "bf16")}
    with FlopCounterMode(display=False) as whole:
        train_step(model, optimizer, ids, "fp32")
    with FlopCounterMode(display=False) as without_head:
        body_step("fp32")
    head_flops = whole.get_total_flops() - without_head.get_total_flops()
    flop_share = head_flops / whole.get_total_flops()
    times = interleaved_times(steps, rounds)
    shares = {p: 1 - paired_ratio(times, f"body/{p}", f"step/{p}") for p in ("fp32", "bf16")}
    for p in shares:
        log(f"  {p}: step {statistics.median(times[f'step/{p}']):.2f} s, without the head "
            f"{statistics.median(times[f'body/{p}']):.2f} s: the head and loss take {shares[p]:.0%} of the step")
    log(f"  the head's share of the step's matmul FLOPs: {flop_share:.0%} (vocabulary {base.config.vocab_size:,})")
    return {"batch": batch, "seq_len": seq, "vocab": base.config.vocab_size, "flop_share": flop_share,
            "head_flops": head_flops, "step_flops": whole.get_total_flops(), "time_share": shares,
            "round_seconds": times}


# --- profile: where a step's time goes ---------------------------------------------------------------

GEMMS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}
ELEMENTWISE = ("pow", "rsqrt", "mean", "silu", "gelu", "sigmoid", "mul", "add", "sub", "div", "neg", "cat", "cos",
               "sin", "exp", "sum", "where", "masked_fill", "softmax", "embedding", "index", "gather", "amax", "log")
CATEGORIES = ("GEMMs", "attention", "norms, RoPE, activations, residual adds", "compiled kernels (fused)",
              "dtype casts", "loss (LM head and softmax)", "optimizer (clipping, AdamW)", "other ops",
              "Python and dispatch (wall time not in any op)")


def category(event, ancestors: list[str]) -> str:
    name = event.name
    if "preproj::optimizer" in ancestors:
        return "optimizer (clipping, AdamW)"
    if any(a.startswith("LinearCrossEntropy") for a in ancestors) or name.startswith("LinearCrossEntropy"):
        return "loss (LM head and softmax)"
    if name in GEMMS:
        return "GEMMs"
    if "scaled_dot_product" in name or "flash_attention" in name:
        return "attention"
    if "cpp_fused" in name or "Compiled" in name or name.startswith("graph_"):
        return "compiled kernels (fused)"
    if name in ("aten::copy_", "aten::_to_copy", "aten::to"):
        return "dtype casts"
    if name.startswith("aten::") and any(name.removeprefix("aten::").rstrip("_").startswith(e) for e in ELEMENTWISE):
        return "norms, RoPE, activations, residual adds"
    return "other ops"


def gemm_alone(shape_a: list[int], shape_b: list[int], dtype: torch.dtype, calls: int = 20) -> float:
    """FLOP/s of the product a @ b alone, in a loop."""
    a, b = torch.randn(*shape_a, dtype=dtype, device=DEVICE), torch.randn(*shape_b, dtype=dtype, device=DEVICE)
    torch.mm(a, b)
    synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        torch.mm(a, b)
    synchronize()
    return 2 * shape_a[0] * shape_a[1] * shape_b[1] * calls / (time.perf_counter() - start)


def profile_table(fn, label: str, dtype: str, log) -> dict:
    """One call of `fn` under torch.profiler (after two warm-up calls): seconds by category, and the GEMMs by shape
    with the FLOP/s each reached against the same product run alone in `dtype` (bf16 or fp32, the GEMMs' dtype)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    fn()
    synchronize()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
        synchronize()
    wall = time.perf_counter() - start
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    gemms: dict[tuple, dict] = {}
    events = prof.events()
    for event in events:
        if event.device_type.name != "CPU" or event.thread != events[0].thread:
            continue  # only the main thread's events: intra-op worker threads run inside their caller's time
        ancestors, parent = [], event.cpu_parent
        while parent is not None:
            ancestors.append(parent.name)
            parent = parent.cpu_parent
        self_s = event.self_cpu_time_total / 1e6
        where = category(event, ancestors)
        seconds[where] += self_s
        if where == "GEMMs" and event.name == "aten::mm" and len(event.input_shapes) >= 2:
            a, b = event.input_shapes[:2]
            key = (tuple(a), tuple(b), dtype)
            row = gemms.setdefault(key, {"calls": 0, "seconds": 0.0})
            row["calls"] += 1
            row["seconds"] += self_s
    counted = sum(seconds.values())
    seconds["Python and dispatch (wall time not in any op)"] = max(0.0, wall - counted)
    gemm_rows = []
    for (a, b, dtype), row in sorted(gemms.items(), key=lambda kv: -kv[1]["seconds"])[:12]:
        flops = 2 * a[0] * a[1] * b[1] * row["calls"]
        alone = gemm_alone(list(a), list(b), getattr(torch, DTYPES[dtype]))
        gemm_rows.append({"a": list(a), "b": list(b), "dtype": dtype, "calls": row["calls"], "seconds": row["seconds"],
                          "flop_per_s": flops / max(row["seconds"], 1e-12), "alone_flop_per_s": alone})
    log(f"  {label}: {wall:.2f} s; " + ", ".join(f"{k.split(' (')[0]} {v / wall:.0%}" for k, v in seconds.items()
                                                   if v / wall >= 0.02))
    return {"label": label, "wall_seconds": wall, "seconds": seconds, "gemms": gemm_rows}


def bench_profile(base, tokenizer, log) -> dict:
    """A training step (the product's setting, and the same eager) and an evaluation batch, each op timed."""
    from preproj.evaluation.engine import LogLikelihood

    ids = torch.randint(0, base.config.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    precision, mode = product_setting(DEVICE)
    tables = []
    model, opt = training_setup(base, "preproj+skip", precision_for(precision).weights)
    dtype = "fp32" if precision == "fp32" else "bf16"

    def step() -> None:
        train_step(model, opt, ids, precision)

    tables.append(profile_table(step, f"train step, {precision}, eager", dtype, log))
    if mode == "compiled":
        with compiled_blocks(model, True, DEVICE):
            tables.append(profile_table(step, f"train step, {precision}, compiled", dtype, log))
    scorer = LogLikelihood(attach(copy.deepcopy(base), PreProjConfig()).eval(), tokenizer, precision="fp32",
                           progress=False)
    g = torch.Generator().manual_seed(2)
    pairs = [(torch.randint(0, base.config.vocab_size, (120,), generator=g).tolist(),
              torch.randint(0, base.config.vocab_size, (3,), generator=g).tolist()) for _ in range(8)]
    tables.append(profile_table(lambda: scorer(pairs), "evaluation batch (8 x 123 tokens), fp32", "fp32", log))
    return {"batch": BATCH, "seq_len": SEQ, "cpu": cpu_name(), "tables": tables}


def cpu_name() -> str:
    """The CPU's model name and its matrix extensions (lscpu), which decide what bf16 costs."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return "unknown"
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("Flags")), [])
    extensions = [f for f in ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2") if f in flags]
    return f"{model} ({', '.join(extensions)})"


def bench_isa(model_name: str, log) -> dict:
    """Which oneDNN kernels run the bf16 training step's GEMMs (ONEDNN_VERBOSE), and the step with AMX against the
    same step with oneDNN held to AVX-512 bf16 (ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16), each in fresh processes,
    alternating."""
    def child_run(env: dict) -> dict:
        proc = subprocess.run([sys.executable, __file__, "--child", "step", "--model", model_name, "--device", "cpu"],
                              capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1", **env},
                              check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"isa child failed:\n{proc.stderr[-2000:]}")
        return {"out": proc.stdout, "result": json.loads(proc.stdout.strip().splitlines()[-1])}

    verbose = child_run({"ONEDNN_VERBOSE": "1", "PREPROJ_CHILD_STEPS": "1"})["out"]
    impls: dict[str, dict[str, int]] = {}
    for line in verbose.splitlines():
        parts = line.split(",")
        if len(parts) > 12 and parts[2] == "primitive" and parts[3] == "exec" and parts[5] == "matmul":
            shapes = parts[-2]
            impls.setdefault(parts[6], {})
            impls[parts[6]][shapes] = impls[parts[6]].get(shapes, 0) + 1
    for impl, shapes in impls.items():
        log(f"  {impl}: {sum(shapes.values())} matmul calls, {len(shapes)} shapes")
    times = {"default": [], "avx512_core_bf16": []}
    for _ in range(2):
        for name, env in (("default", {}), ("avx512_core_bf16", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"})):
            times[name] += child_run(env)["result"]["step_seconds"]
    ratio = statistics.median(times["avx512_core_bf16"]) / statistics.median(times["default"])
    log(f"  step with oneDNN held to AVX-512 bf16 / default: {ratio:.2f}")
    return {"matmul_kernels": impls, "step_seconds": times, "avx512_over_default": ratio}


# --- generate, kv ----------------------------------------------------------------------------------

def linear_weights(model) -> int:
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def linear_kernel_ratio(base, adapted, dtype: torch.dtype, batch: int, rounds: int, calls: int = 200) -> float:
    """Adapted over base: the time one decoding step's linear layers take (every nn.Linear once, M = batch rows; the
    LM head too, which generate() applies to the last position only), each distinct weight shape timed alone. It is
    what the two models' matmul kernels alone predict for their generation time ratio, against the FLOP ratio."""
    counts = {name: collections.Counter(tuple(m.weight.shape) for m in model.modules()
                                        if isinstance(m, torch.nn.Linear))
              for name, model in (("base", base), ("adapted", adapted))}
    seconds = {}
    for shape in sorted(set(counts["base"]) | set(counts["adapted"])):
        w = torch.randn(shape, dtype=dtype, device=DEVICE)
        x = torch.randn(batch, 1, shape[1], dtype=dtype, device=DEVICE)

        def run(w=w, x=x) -> None:
            for _ in range(calls):
                torch.nn.functional.linear(x, w)
        seconds[shape] = statistics.median(interleaved_times({"gemv": run}, rounds)["gemv"]) / calls
    total = {k: sum(n * seconds[shape] for shape, n in c.items()) for k, c in counts.items()}
    return total["adapted"] / total["base"]


def bench_generate(base, adapted, rounds: int, new_tokens: int, log) -> dict:
    flop_ratio = linear_weights(adapted) / linear_weights(base)  # matmul FLOPs per generated token
    rows = {}
    for dtype in (torch.float32, torch.bfloat16):
        models = {"base": base, "adapted": adapted}
        if dtype != torch.float32:  # copies: a round trip through bf16 would change the base for later sections
            models = {k: copy.deepcopy(m).to(dtype) for k, m in models.items()}
        for batch in (1, 8):
            ids = torch.randint(0, base.config.vocab_size, (batch, 32), generator=torch.Generator().manual_seed(batch))
            ids = ids.to(DEVICE)
            kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                      do_sample=False, pad_token_id=0)
            runs = {k: (lambda m=m, ids=ids, kw=kw: m.generate(ids, **kw)) for k, m in models.items()}
            t = interleaved_times(runs, rounds)
            key = f"{str(dtype).removeprefix('torch.')}/batch{batch}"
            rows[key] = {"base_tok_s": batch * new_tokens / statistics.median(t["base"]),
                         "adapted_tok_s": batch * new_tokens / statistics.median(t["adapted"]),
                         "ratio": paired_ratio(t, "adapted", "base"), "round_seconds": t,
                         "kernel_ratio": linear_kernel_ratio(models["base"], models["adapted"], dtype, batch, rounds)}
            log(f"  {key:<16} base {rows[key]['base_tok_s']:6.1f} tok/s  "
                f"adapted {rows[key]['adapted_tok_s']:6.1f} tok/s  time ratio {rows[key]['ratio']:.3f}  "
                f"linear kernels alone {rows[key]['kernel_ratio']:.3f}")
    return {"prompt_tokens": 32, "new_tokens": new_tokens, "flop_ratio": flop_ratio, "rows": rows}


def bench_kv(base, adapted) -> dict:
    b, a = kv_cache_bytes(base, 1024, base.config.vocab_size), kv_cache_bytes(adapted, 1024, base.config.vocab_size)
    return {"context": 1024, "base_bytes": b, "adapted_bytes": a, "ratio": a / b}


# --- eval ------------------------------------------------------------------------------------------

def bench_eval(model, tokenizer, data: Path, limits: dict, harness_batch: int, log) -> dict:
    from preproj.evaluation import evaluate
    from preproj.evaluation.harness import run_harness, write_local_tasks

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        write_local_tasks(Path(tmp), data, limits={"wikitext": limits["wikitext"]})
        for k, (task, limit) in enumerate(limits.items()):
            runs = {
                "preproj": lambda t=task, n=limit: evaluate(model, tokenizer, [t], limit=n, data_dir=data,
                                                            progress=False),
                "harness": lambda t=task, n=limit: run_harness(model, tokenizer, [f"preproj_{t}"], limit=n,
                                                               batch_size=harness_batch, include_path=tmp),
            }
            order = list(runs) if k % 2 == 0 else list(runs)[::-1]  # neither always runs on a warmer machine
            seconds = {}
            for name in order:
                synchronize()
                start = time.perf_counter()
                runs[name]()
                synchronize()
                seconds[name] = time.perf_counter() - start
            rows.append({"task": task, "limit": limit, "preproj_s": seconds["preproj"], "harness_s": seconds["harness"],
                         "ratio": seconds["preproj"] / seconds["harness"]})
            log(f"  {task:<10} n={limit:<4} preproj {seconds['preproj']:6.1f} s  harness {seconds['harness']:6.1f} s  "
                f"ratio {rows[-1]['ratio']:.2f}")
    total = sum(r["preproj_s"] for r in rows) / sum(r["harness_s"] for r in rows)
    return {"harness_batch_size": harness_batch, "rows": rows, "ratio": total}


def bench_eval_adapters(base, tokenizer, data: Path, rounds: int, log) -> dict:
    """Each method's saved adapter evaluated as `preproj eval --adapter` does it (loaded from its files, a LoRA merged),
    against the base, interleaved: the median over rounds of the two times in the same round."""
    from preproj.core.adapter import load_adapter
    from preproj.evaluation import evaluate
    from preproj.methods import build_method, default_methods, save_method
    from preproj.methods.lora import merged_for_evaluation

    def scorer(model):
        return lambda: evaluate(model, tokenizer, ["lambada", "wikitext"], limit=EVAL_ADAPTER_ITEMS, max_length=2048,
                                data_dir=data, progress=False)

    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in (m for m in default_methods() if m != "base"):
            built = build_method(copy.deepcopy(base), name)
            for param_name, param in built.named_parameters():
                if "lora_B" in param_name:  # B starts at zero; a trained LoRA's is not, and merging must not skip it
                    torch.nn.init.normal_(param, std=1e-3)
            save_method(built, name, Path(tmp) / name)
            loaded = merged_for_evaluation(load_adapter(copy.deepcopy(base), Path(tmp) / name)).eval()
            times = interleaved_times({"adapter": scorer(loaded), "base": scorer(base)}, rounds)
            rows[name] = {"adapter_s": min(times["adapter"]), "base_s": min(times["base"]),
                          "ratio": paired_ratio(times, "adapter", "base")}
            log(f"  {name:<13} adapter {rows[name]['adapter_s']:6.1f} s  base {rows[name]['base_s']:6.1f} s  "
                f"ratio {rows[name]['ratio']:.2f}")
            del built, loaded
    return {"items": EVAL_ADAPTER_ITEMS, "rows": rows, "worst": max(r["ratio"] for r in rows.values())}


# --- memory (each job in a fresh process) ----------------------------------------------------------

def child(job: str, model_name: str, data: str | None) -> None:
    """Run one job and print {"peak_rss_bytes": ...} as the last line of stdout."""
    if job == "load":  # and one short forward, so that every weight page is really resident
        model, _ = load_model(model_name, device=DEVICE)
        with torch.no_grad():
            model(torch.zeros(1, 128, dtype=torch.long, device=DEVICE))
    elif job == "train":
        from preproj.training import TrainArgs, train

        with tempfile.TemporaryDirectory() as tmp:
            train(TrainArgs(model=model_name, out=tmp + "/run", data_dir=data, steps=4, eval_every=4, save_every=4,
                            device=str(DEVICE)),
                  progress=False)
    elif job == "step":  # eager preproj+skip steps in the product's precision, for bench_isa
        precision = product_setting(DEVICE)[0]
        base, _ = load_model(model_name, device=DEVICE)
        model, opt = training_setup(base, "preproj+skip", precision_for(precision).weights)
        ids = torch.randint(0, base.config.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
        seconds = []
        for _ in range(int(os.environ.get("PREPROJ_CHILD_STEPS", "4"))):
            start = time.perf_counter()
            train_step(model, opt, ids, precision)
            seconds.append(time.perf_counter() - start)
        print(json.dumps({"step_seconds": seconds[1:] or seconds}))
        return
    elif job == "eval":
        from preproj.evaluation import evaluate

        model, tokenizer = load_model(model_name, device=DEVICE)
        evaluate(model, tokenizer, ["lambada"], limit=100, data_dir=data, progress=False)
        evaluate(model, tokenizer, ["wikitext"], limit=2, data_dir=data, max_length=2048, progress=False)
    peak_gpu = torch.cuda.max_memory_allocated(DEVICE) if DEVICE.type == "cuda" else None
    print(json.dumps({"peak_rss_bytes": peak_rss_bytes(), "peak_gpu_bytes": peak_gpu}))


def peak_rss_bytes() -> int:
    """This process's peak resident memory. Linux's VmHWM starts afresh at exec; ru_maxrss would
    carry over the peak of the parent that forked us."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere



def bench_memory(model_name: str, data: Path, log) -> dict:
    out, gpu = {}, {}
    for job in ("load", "train", "eval"):
        proc = subprocess.run([sys.executable, __file__, "--child", job, "--model", model_name, "--data-dir", str(data),
                               "--device", str(DEVICE)],
                              capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1"}, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"memory job {job!r} failed:\n{proc.stderr[-2000:]}")
        measured = json.loads(proc.stdout.strip().splitlines()[-1])
        out[job], gpu[job] = measured["peak_rss_bytes"], measured["peak_gpu_bytes"]
        log(f"  {job:<6} peak RSS {out[job] / 2**30:.2f} GiB"
            + (f", peak GPU memory {gpu[job] / 2**30:.2f} GiB" if gpu[job] is not None else ""))
    jobs = {"load": "load_model and one 128-token forward", "train": "preproj train, 4 steps x 4 x 256, bf16-mixed",
            "eval": "preproj eval, 100 LAMBADA items and 2 WikiText documents at max length 2048, fp32"}
    return {"peak_rss_bytes": out, "peak_gpu_bytes": gpu, "jobs": jobs}


# --- report ----------------------------------------------------------------------------------------

def figures(r: dict) -> dict[str, float]:
    f = {}
    if "train" in r:
        t = r["train"]
        f["vs_naive_fp32"] = t["paired_ratios"]["vs_naive_fp32"]
        if t["product"].split("/")[0] != "fp32":
            f["train_mfu_bf16"] = t["rows"][f"preproj+skip/{t['product']}"]["mfu"]
        f["train_step_vs_base"] = t["paired_ratios"]["step_vs_base"]
        f["train_step_vs_lora"] = t["paired_ratios"]["step_vs_lora"]
    if "generate" in r:
        f["generation_overhead"] = max(row["ratio"] for row in r["generate"]["rows"].values())
    if "kv" in r:
        f["kv_cache_ratio"] = r["kv"]["ratio"]
    if "eval" in r:
        f["eval_vs_harness"] = r["eval"]["ratio"]
    if "eval_adapters" in r:
        f["eval_adapter_overhead"] = r["eval_adapters"]["worst"]
    if "memory" in r:
        f["train_memory_gib"] = r["memory"]["peak_rss_bytes"]["train"] / 2**30
    return f


def bounds(r: dict) -> dict[str, float]:
    """Every target's bound; those that depend on the model come from the run itself."""
    b = {name: bound for name, (_, bound, _) in TARGETS.items() if bound is not None}
    if "train" in r:
        b["train_step_vs_base"] = 1 + 1.1 * r["train"]["module_flop_share"]
    if "generate" in r:
        b["generation_overhead"] = r["generate"]["flop_ratio"]
    return b


def targets(r: dict) -> dict[str, dict]:
    """Each target the run measured: what it says, the value, the bound and whether it is met."""
    limit = bounds(r)
    return {name: {"what": TARGETS[name][2], "value": value, "op": TARGETS[name][0], "bound": limit[name],
                   "met": met(name, value, limit[name])} for name, value in figures(r).items()}


def met(name: str, value: float, bound: float) -> bool:
    op = TARGETS[name][0]
    return {">=": value >= bound, "<=": value <= bound, "==": value == bound}[op]


def gemms_alone(t: dict) -> tuple[float, float]:
    """A profiled call's listed GEMMs timed at each shape's speed alone, and the seconds of its GEMMs beyond the
    listed shapes (as measured)."""
    alone = sum(g["flop_per_s"] * g["seconds"] / g["alone_flop_per_s"] for g in t["gemms"])
    return alone, t["seconds"]["GEMMs"] - sum(g["seconds"] for g in t["gemms"])


def profile_ceiling(t: dict, flops: float, peak: float) -> str:
    """What the profiled training step could reach with its kernels as they are: its GEMMs at each shape's speed
    alone (those beyond the listed shapes at their measured time), attention and the loss as measured, everything
    else free."""
    gemm_flop = sum(g["flop_per_s"] * g["seconds"] for g in t["gemms"])
    alone, beyond = gemms_alone(t)
    rest = t["seconds"]["attention"] + t["seconds"]["loss (LM head and softmax)"]
    floor = alone + beyond + rest
    return (f"Ceiling of the {t['label']}: its GEMMs ({gemm_flop / 1e9:.0f} of the step's {flops / 1e9:.0f} GFLOP) "
            f"take {alone:.3f} s at each shape's speed alone, {gemm_flop / alone / peak:.0%} of the large-GEMM peak; "
            f"with attention and the loss as measured ({rest:.3f} s) and everything else free, the step would take "
            f"{floor:.3f} s: {flops / floor / peak:.0%} MFU, against {flops / t['wall_seconds'] / peak:.0%} in this "
            "call.")


def eval_ceiling(t: dict) -> str:
    """How much faster the profiled evaluation batch could get with its arithmetic as it is: its GEMMs at each
    shape's speed alone, attention as measured, everything else free."""
    alone, beyond = gemms_alone(t)
    floor = alone + beyond + t["seconds"]["attention"]
    return (f"Ceiling of the {t['label']}: its GEMMs take {alone:.3f} s at each shape's speed alone; with attention as "
            f"measured and everything else free, the batch would take {floor:.3f} s, "
            f"{t['wall_seconds'] / floor:.2f}x faster than this call.")


def format_profile(p: dict, train: dict | None = None) -> str:
    """The profile as markdown: one table of categories per profiled call, then each call's GEMMs by shape, and
    with the training rows of the same run, each training step's ceiling (profile_ceiling)."""
    tables = p["tables"]
    lines = ["", f"Where the time goes (torch.profiler, one call each; CPU: {p['cpu']})", "",
             "| part | " + " | ".join(t["label"] for t in tables) + " |", "|---" * (len(tables) + 1) + "|"]
    for part in CATEGORIES:
        cells = [f"{t['seconds'][part]:.3f} s ({t['seconds'][part] / t['wall_seconds']:.0%})" for t in tables]
        lines.append(f"| {part} | " + " | ".join(cells) + " |")
    lines.append("| whole call | " + " | ".join(f"{t['wall_seconds']:.3f} s" for t in tables) + " |")
    for t in tables:
        lines += ["", f"GEMMs of the {t['label']} (aten::mm, the largest first)", "",
                  "| a | b | dtype | calls | seconds | GFLOP/s | alone | in context / alone |",
                  "|---|---|---|---|---|---|---|---|"]
        for g in t["gemms"]:
            lines.append(f"| {'x'.join(map(str, g['a']))} | {'x'.join(map(str, g['b']))} | {g['dtype']} | "
                         f"{g['calls']} | {g['seconds']:.3f} | {g['flop_per_s'] / 1e9:.0f} | "
                         f"{g['alone_flop_per_s'] / 1e9:.0f} | {g['flop_per_s'] / g['alone_flop_per_s']:.2f} |")
    for t in [t for t in tables if t["label"].startswith("train step, ")] if train else ():
        _, precision, mode = (part.strip() for part in t["label"].split(","))
        row = train["rows"].get(f"preproj+skip/{precision}/{mode}")
        if row:
            peak = train["peak_in_rounds"]["fp32_flop_per_s" if precision == "fp32" else "bf16_flop_per_s"]
            lines += ["", profile_ceiling(t, row["flops_per_step"], peak)]
    lines += [line for t in tables if t["label"].startswith("evaluation batch") for line in ("", eval_ceiling(t))]
    return "\n".join(lines)


def format_table(r: dict) -> str:
    lines = []
    if "train" in r:
        peak = r["train"]["peak_in_rounds"]
        lines += ["", f"Training step, batch {r['train']['batch']} x seq {r['train']['seq_len']} "
                      f"(matmul peak in the same rounds: bf16 {peak['bf16_flop_per_s'] / 1e9:.0f}, "
                      f"fp32 {peak['fp32_flop_per_s'] / 1e9:.0f} GFLOP/s)",
                  "| method | precision | mode | step (s) | tokens/s | GFLOP/s | MFU |",
                  "|---|---|---|---|---|---|---|"]
        for key, row in r["train"]["rows"].items():
            mine = " (default here)" if key.split("/", 1)[1] == r["train"]["product"] else ""
            lines.append(f"| {row['method']} | {row['precision']} | {row['mode']}{mine} | {row['step_s']:.2f} | "
                         f"{row['tokens_per_s']:.0f} | {row['flop_per_s'] / 1e9:.0f} | {row['mfu']:.0%} |")
    if "generate" in r:
        g = r["generate"]
        lines += ["", f"Greedy generation, {g['prompt_tokens']}-token prompt + {g['new_tokens']} tokens "
                      f"(matmul FLOP ratio adapted/base {g['flop_ratio']:.3f})",
                  "| dtype / batch | base tok/s | adapted tok/s | time ratio | linear kernels alone |",
                  "|---|---|---|---|---|"]
        for key, row in g["rows"].items():
            kernels = f"{row['kernel_ratio']:.3f}" if "kernel_ratio" in row else "–"  # runs before it was measured
            lines.append(f"| {key} | {row['base_tok_s']:.1f} | {row['adapted_tok_s']:.1f} | {row['ratio']:.3f} | "
                         f"{kernels} |")
    if "kv" in r:
        kv = r["kv"]
        lines += ["", f"K/V cache at {kv['context']} tokens: base {kv['base_bytes']:,} B, "
                      f"adapted {kv['adapted_bytes']:,} B"]
    if "eval" in r:
        lines += ["", f"preproj eval vs lm-evaluation-harness HFLM (batch {r['eval']['harness_batch_size']}), "
                      "adapted model, fp32",
                  "| task | items | preproj (s) | harness (s) | ratio |", "|---|---|---|---|---|"]
        for row in r["eval"]["rows"]:
            lines.append(f"| {row['task']} | {row['limit']} | {row['preproj_s']:.1f} | {row['harness_s']:.1f} | "
                         f"{row['ratio']:.2f} |")
    if "eval_adapters" in r:
        lines += ["", f"`preproj eval --adapter` vs the base ({r['eval_adapters']['items']} LAMBADA items and "
                  "WikiText-2 documents, 2048-token windows, fp32; LoRA merged)",
                  "| method | adapter (s) | base (s) | ratio |", "|---|---|---|---|"]
        for name, row in r["eval_adapters"]["rows"].items():
            lines.append(f"| {name} | {row['adapter_s']:.1f} | {row['base_s']:.1f} | {row['ratio']:.2f} |")
    if "profile" in r:
        lines.append(format_profile(r["profile"], r.get("train")))
    if "isa" in r:
        lines += ["", "oneDNN matmul kernels in a bf16 training step (ONEDNN_VERBOSE): "
                  + "; ".join(f"{impl} {sum(s.values())} calls" for impl, s in r["isa"]["matmul_kernels"].items()),
                  f"Step time with oneDNN held to AVX-512 bf16 / default: {r['isa']['avx512_over_default']:.2f}"]
    if "memory" in r:
        rss = r["memory"]["peak_rss_bytes"]
        lines += ["", "Peak resident memory: " + ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in rss.items())]
    if r["targets"]:
        lines += ["", "| target | measured | bound | met |", "|---|---|---|---|"]
        for t in r["targets"].values():
            bound = f"{t['op']} {round(t['bound'], 3):g}"
            lines.append(f"| {t['what']} | {t['value']:.3f} | {bound} | {'yes' if t['met'] else 'NO'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present, else CPU), cpu, cuda, cuda:N or mps")
    parser.add_argument("--data-dir", default=None, help="default: $PREPROJ_DATA_DIR")
    parser.add_argument("--out", default="benchmarks/results/bench.json")
    parser.add_argument("--only", default=None,
                        help="comma-separated sections (default: peak,train,generate,kv,eval,eval_adapters,memory; "
                             "with --profile, none); also head (the LM head's share of a training step)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds per figure")
    parser.add_argument("--profile", action="store_true",
                        help="profile a training step and an evaluation batch op by op (torch.profiler), and show "
                             "which oneDNN kernels run the GEMMs; alone, or with the sections --only names")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens generated per generation call")
    parser.add_argument("--harness-batch-size", type=int, default=16)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    global DEVICE
    DEVICE = resolve_device(args.device)
    if args.child:
        return child(args.child, args.model, args.data_dir)

    from preproj.data import resolve_data_dir

    only = args.only or ("" if args.profile else "peak,train,generate,kv,eval,eval_adapters,memory")
    sections = [s.strip() for s in only.split(",") if s.strip()] + (["profile", "isa"] if args.profile else [])
    known = {"peak", "train", "head", "generate", "kv", "eval", "eval_adapters", "memory", "profile", "isa"}
    unknown = set(sections) - known
    if unknown:
        raise SystemExit(f"Unknown sections {sorted(unknown)}; choose from {','.join(sorted(known))}.")
    data = resolve_data_dir(args.data_dir)
    if data is None and {"eval", "eval_adapters", "memory"} & set(sections):
        raise SystemExit("The eval and memory sections need the data: set --data-dir or PREPROJ_DATA_DIR "
                         "(../shared/data).")
    wall = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - wall:6.0f}s] {msg}", flush=True)

    log(f"loading {args.model}; torch {torch.__version__}, {torch.get_num_threads()} threads, CPU {cpu_name()}")
    base, tokenizer = load_model(args.model, device=DEVICE)
    base.eval()
    d, ffn = base.config.hidden_size, getattr(base.config, "intermediate_size", 4 * base.config.hidden_size)
    r = {"model": args.model, "device": str(DEVICE), "cpu": cpu_name(), "torch": torch.__version__,
         "threads": torch.get_num_threads(), "rounds": args.rounds}

    if "peak" in sections or "train" in sections:
        log("peak: matmul roofline")
        peak = {dtype: matmul_peak(getattr(torch, name))[::-1] for dtype, name in DTYPES.items()}
        r["peak"] = {f"{dtype}_{k}": v for dtype, (shape, flop_per_s) in peak.items()
                     for k, v in (("flop_per_s", flop_per_s), ("shape", shape))}
        model_shapes = [(BATCH * SEQ, d, d), (BATCH * SEQ, d, ffn), (BATCH * SEQ, ffn, d)]
        r["peak"] |= {f"{dtype}_model_shaped_flop_per_s": matmul_peak(getattr(torch, name), model_shapes)[0]
                      for dtype, name in DTYPES.items()}
        log("  " + ", ".join(f"{dtype} {f / 1e9:.0f} GFLOP/s at {'x'.join(map(str, shape))} (model-shaped alone: "
                             f"{r['peak'][dtype + '_model_shaped_flop_per_s'] / 1e9:.0f})"
                             for dtype, (shape, f) in peak.items()))
    if "train" in sections:
        log("train: one frozen-probe step per method and precision, the peak product in every round")
        r["train"] = bench_train(base, args.rounds, log, peak)
    if "head" in sections:
        log("head: the LM head's share of a frozen-probe training step")
        r["head"] = bench_head(base, args.rounds, log)
    if {"generate", "kv", "eval"} & set(sections):  # one adapted model (paper init) serves all three
        adapted = attach(copy.deepcopy(base), PreProjConfig())
    if "generate" in sections:
        log(f"generate: greedy, {args.new_tokens} new tokens")
        r["generate"] = bench_generate(base, adapted, args.rounds, args.new_tokens, log)
    if "kv" in sections:
        r["kv"] = bench_kv(base, adapted)
        log(f"kv: adapted/base = {r['kv']['ratio']:.6f}")
    if "eval" in sections:
        log("eval: preproj eval vs lm-evaluation-harness")
        r["eval"] = bench_eval(adapted, tokenizer, data, EVAL_LIMITS, args.harness_batch_size, log)
    if "eval_adapters" in sections:
        log("eval_adapters: each method's saved adapter evaluated standalone vs the base")
        r["eval_adapters"] = bench_eval_adapters(base, tokenizer, data, args.rounds, log)
    if "profile" in sections:
        log("profile: one training step and one evaluation batch under torch.profiler")
        r["profile"] = bench_profile(base, tokenizer, log)
    if "isa" in sections and DEVICE.type == "cpu":
        log("isa: oneDNN's matmul kernels (ONEDNN_VERBOSE) and AMX against AVX-512 bf16")
        r["isa"] = bench_isa(args.model, log)
    if "memory" in sections:
        log("memory: peak RSS of fresh processes")
        r["memory"] = bench_memory(args.model, data, log)

    r["targets"] = targets(r)
    r["wall_seconds"] = time.monotonic() - wall
    write_json(args.out, r)
    print(format_table(r))
    missed = [t["what"] for t in r["targets"].values() if not t["met"]]
    print(f"\nsummary: {len(r['targets']) - len(missed)}/{len(r['targets'])} targets met"
          + (f" (missed: {'; '.join(missed)})" if missed else "")
          + f"; {r['wall_seconds'] / 60:.1f} min; wrote {args.out}")


if __name__ == "__main__":
    main()
