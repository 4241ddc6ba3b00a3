"""Precision and device: one vocabulary for every command and for Python.

A precision word fixes three things at once: the dtype the (frozen) base model is loaded in, the
dtype of the trainable adapter weights (the masters the optimizer updates), and the autocast
context every forward runs under. Each word means the same in `train`, `eval`, `compare`,
`inspect` and the benchmark.

On a CPU without native bf16 the bf16 words keep their numbers but not the slow path: inside a
precision's compute context each bf16 matmul (linear, matmul, bmm, attention) runs as a float32 matmul
of the same bf16 values and rounds its output to bf16, which is what a native bf16 GEMM computes
(float32 accumulation, one rounding of the output), at float32 speed.

The word 'auto' is fp32 where bf16 matmuls are not native (a CPU without avx512_bf16 or AMX runs them several
times slower than fp32). Where they are (CUDA GPUs with bf16, such CPUs) it is bf16-frozen for frozen-probe
training, whose base never changes (stored in bf16: half its memory, no cast per use), and bf16-mixed wherever the
base trains or must stay float32 (pretrain, scaling, a compare scored in fp32, a model passed in float32). Entry
points resolve it once against their device and record the word used.

A device spec is 'auto' (CUDA when present, else the CPU), 'cpu', 'cuda', 'cuda:N' or 'mps'.
Under torchrun, 'auto' and 'cuda' mean this process's GPU, cuda:$LOCAL_RANK.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Precision:
    name: str
    weights: torch.dtype
    """Dtype the base model is loaded in."""
    adapter: torch.dtype
    """Dtype of the trainable adapter weights (the optimizer's masters)."""
    autocast: torch.dtype | None
    """Compute dtype of autocast around every forward; None runs each op in its inputs' dtype."""
    help: str

    @property
    def adapter_dtype_name(self) -> str:
        return str(self.adapter).removeprefix("torch.")

    def autocast_context(self, device: torch.device | str):
        """The autocast context of this precision on `device` (a null context when it has none)."""
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(torch.device(device).type, dtype=self.autocast)

    @property
    def uses_bf16(self) -> bool:
        return torch.bfloat16 in (self.weights, self.adapter, self.autocast)

    def emulates_bf16(self, device: torch.device | str) -> bool:
        """Whether this precision's bf16 matmuls run as float32 matmuls on `device` (a CPU without native bf16)."""
        return self.uses_bf16 and torch.device(device).type == "cpu" and not native_bf16("cpu")

    def compute_context(self, device: torch.device | str):
        """Where every forward runs: this precision's autocast, and on a CPU without native bf16, bf16 matmuls
        computed in float32 with the output rounded to bf16."""
        if not self.emulates_bf16(device):
            return self.autocast_context(device)
        stack = contextlib.ExitStack()
        stack.enter_context(self.autocast_context(device))
        stack.enter_context(Bf16MatmulsInFloat32())
        return stack


def compute_context(name: str | Precision, device: torch.device | str):
    """Where a forward runs under the precision named `name` on `device` (see Precision.compute_context)."""
    return precision(name).compute_context(device)


class Bf16MatmulsInFloat32(torch.overrides.TorchFunctionMode):
    """bf16 matmuls (bf16 operands, or float32 ones under bf16 autocast) computed as float32 matmuls of the
    bf16-rounded operands, the output rounded to bf16: a native bf16 GEMM's numbers (float32 accumulation),
    without the slow path of CPUs that lack avx512_bf16 and AMX. Gradients follow the casts, so they are
    rounded to bf16 where a native bf16 backward rounds them."""

    F = torch.nn.functional
    MATMULS = {F.linear, torch.matmul, torch.mm, torch.bmm, torch.addmm, torch.baddbmm, torch.Tensor.matmul,
               torch.Tensor.__matmul__, torch.Tensor.mm, torch.Tensor.bmm, F.scaled_dot_product_attention}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in self.MATMULS:
            return func(*args, **kwargs)
        autocast = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        operands = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor) and a.is_floating_point()]
        if (not operands or operands[0].device.type != "cpu"
                or not (autocast or any(a.dtype == torch.bfloat16 for a in operands))):
            return func(*args, **kwargs)

        def up(a):
            if isinstance(a, torch.Tensor) and a.is_floating_point():
                return (a if a.dtype == torch.bfloat16 else a.to(torch.bfloat16)).float()
            return a

        with torch.autocast("cpu", enabled=False):
            out = func(*(up(a) for a in args), **{k: up(v) for k, v in kwargs.items()})
        return out.to(torch.bfloat16)


@dataclass
class DeviceArgs:
    """Where a job computes, and whether it compiles."""

    device: str = "auto"
    """auto (CUDA when present, else CPU), cpu, cuda, cuda:N or mps. Under torchrun, each process's own GPU."""
    compile: bool | None = None
    """torch.compile each decoder block (inductor: the first step compiles, and inductor caches it for later runs).
    Default: where benchmarks/run.py measured it faster, a GPU or a CPU in bf16; --no-compile runs eager."""



PRECISIONS = {
    p.name: p
    for p in (
        Precision("fp32", torch.float32, torch.float32, None, "everything in float32"),
        Precision("bf16-mixed", torch.float32, torch.float32, torch.bfloat16,
                  "float32 weights and adapter masters, bf16 autocast"),
        Precision("bf16-true", torch.bfloat16, torch.bfloat16, None,
                  "pure bf16 weights, adapter included, as in the paper (docs/method.md: the frozen probe)"),
        Precision("bf16-frozen", torch.bfloat16, torch.float32, torch.bfloat16,
                  "bf16 base weights with float32 adapter masters, bf16 autocast (half the base's memory; "
                  "the paper's forward pass without its rounded-away updates, docs/method.md: what the paper "
                  "leaves open)"),
    )
}


AUTO = "auto"


def native_bf16(device: torch.device | str) -> bool:
    """Whether `device` runs bf16 matmuls natively, so that bf16 autocast is faster than fp32 there."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return False


def precision(name: str | Precision, device: torch.device | str | None = None, *, frozen_base: bool = False,
              base_dtype: torch.dtype | None = None) -> Precision:
    """The Precision named `name` ('auto' resolved against `device`, by default the one 'auto' picks); a clear
    error for anything else.

    'auto' where bf16 is native: bf16-frozen for a frozen base the caller has not loaded yet or loaded in bf16
    (frozen_base; results/bf16-frozen-check found it equivalent to bf16-mixed within declared margins, with half the
    base's memory), else bf16-mixed (a base that trains, or one given in float32)."""
    if isinstance(name, Precision):
        return name
    if name == AUTO:
        if not native_bf16(resolve_device() if device is None else device):
            return PRECISIONS["fp32"]
        frozen = frozen_base and base_dtype in (None, torch.bfloat16)
        return PRECISIONS["bf16-frozen" if frozen else "bf16-mixed"]
    if name in PRECISIONS:
        return PRECISIONS[name]
    hint = (" 'bf16' alone is ambiguous: use bf16-mixed (autocast) or bf16-true (pure bf16 weights)."
            if name == "bf16" else "")
    raise ValueError(f"precision must be {AUTO} or one of {', '.join(PRECISIONS)}, got {name!r}.{hint}")


def check_weights_dtype(model: torch.nn.Module, name: str | Precision) -> None:
    """A precision word describes the weights too: refuse a model whose base was loaded in another dtype."""
    p = precision(name)
    frozen = [t.dtype for t in model.parameters() if not t.requires_grad] or [t.dtype for t in model.parameters()]
    if frozen and frozen[0] != p.weights:
        raise ValueError(f"precision {p.name!r} works on a base loaded in {p.weights}, but this model's weights are "
                         f"{frozen[0]}; load it with load_model(..., dtype={p.name!r}) or pick the matching precision.")


def resolve_device(spec: str | torch.device | None = "auto") -> torch.device:
    """The torch.device a spec names, checked against what this machine has."""
    if isinstance(spec, torch.device):
        return spec
    spec = (spec or "auto").strip().lower()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec == "cuda":
        spec = f"cuda:{local_rank}"
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise ValueError(f"Unknown device {spec!r}; use auto, cpu, cuda, cuda:N or mps.") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"Device {spec!r} was asked for, but torch sees no CUDA GPU here; use --device cpu or "
                             "auto.")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"Device {spec!r} does not exist: torch sees {torch.cuda.device_count()} CUDA GPU(s).")
    elif device.type == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise ValueError("Device 'mps' was asked for, but this torch build or machine has no Apple MPS; "
                             "use --device cpu.")
    elif device.type != "cpu":
        raise ValueError(f"Unsupported device {spec!r}; use auto, cpu, cuda, cuda:N or mps.")
    return device


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """The RNG state that a run on `device` depends on: the CPU generator's, plus the GPU's on CUDA."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
