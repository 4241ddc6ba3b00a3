"""The compiled path: torch.compile (inductor) on each decoder block.

Regional compilation, as torchtune does it: every decoder layer is compiled on its own instead of the whole model.
The layers of a model share one forward, so inductor compiles one block and every layer reuses it, which keeps
the compile to seconds; the embedding, the loss's chunk loop and the optimizer stay in Python. An adapted block
(the wrapper around attention, its hooks, the skip routed after a Gemma norm) compiles as one graph: the tests
count its graph breaks.

Compiled code is cached by inductor on disk (TORCHINDUCTOR_CACHE_DIR), so a second run of the same model and
shapes compiles in a fraction of the first's time.

Inductor on a CPU writes C++ and needs a working compiler: where there is none, the context says so in one line
and leaves the model eager.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil

import torch
from torch import nn

from .families import decoder_layers

logger = logging.getLogger(__name__)

RECOMPILE_LIMIT = 64


def wants_compile(flag: bool | None, device: torch.device | str, *, bf16: bool) -> bool:
    """Whether a run compiles. True and False (--compile, --no-compile) say so. None, the default, compiles where
    benchmarks/run.py measured it faster: on a CUDA GPU, and on a CPU in bf16, where the matmuls are fast enough
    that the rest of the step dominates; an fp32 CPU run stays eager. PREPROJ_COMPILE=1 or 0 sets the default for
    every command of a session."""
    if flag is None and os.environ.get("PREPROJ_COMPILE", "") != "":
        word = os.environ["PREPROJ_COMPILE"].strip().lower()
        if word not in ("1", "0", "on", "off", "true", "false"):
            raise ValueError(f"PREPROJ_COMPILE must be 1 or 0, got {os.environ['PREPROJ_COMPILE']!r}.")
        flag = word in ("1", "on", "true")
    if flag is not None:
        return bool(flag)
    device = torch.device(device)
    return device.type == "cuda" or (device.type == "cpu" and bf16)


@functools.cache
def cannot_compile(device_type: str) -> str | None:
    """Why inductor cannot compile for `device_type` here (None: it can). A CPU needs a C++ compiler."""
    if device_type == "mps":
        return "torch.compile is not used on Apple MPS"
    if device_type != "cpu":
        return None
    from torch._inductor import config

    candidates = [os.environ["CXX"]] if os.environ.get("CXX") else [c for c in config.cpp.cxx if c]
    if not any(shutil.which(c) for c in candidates):
        return (f"no C++ compiler found ({', '.join(candidates) or 'g++'}; set CXX or install g++), which inductor "
                "needs on a CPU")
    return None


@contextlib.contextmanager
def compiled_blocks(model: nn.Module, enabled: bool, device: torch.device | str | None = None):
    """Context in which every decoder layer of `model` runs compiled (when `enabled` and the device can); on exit the
    layers are eager again. Yields whether they are compiled. The compile itself happens in the first forward, which
    callers time (a training run records its first step's seconds next to the typical step's)."""
    device = torch.device(device) if device is not None else next(model.parameters()).device
    why_not = cannot_compile(device.type) if enabled else None
    if why_not:
        logger.warning("compile: %s; running eager (pass --no-compile to silence this).", why_not)
    if not enabled or why_not:
        yield False
        return
    # Every model compiled in a process adds its own variants of the one block forward (its dtype, its attention,
    # its adapter: `compare` trains and scores several), and past dynamo's default limit of 8 the next variant would
    # silently run eager.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT wrapper (LoRA)
    layers = list(decoder_layers(base))
    for layer in layers:
        layer.compile()
    try:
        yield True
    finally:
        for layer in layers:
            layer._compiled_call_impl = None
