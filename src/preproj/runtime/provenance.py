"""Where a result came from: the code (version, git commit, whether the code differed from it), the libraries, the
machine (CPU model and the instruction sets that pick its kernels, or the GPU), the threads and the command.

Every run file records it (train_config.json for the process that started a run, summary.json for the one that
finished it, evaluation and comparison results), as lm-evaluation-harness records its git_hash and environment:
a run resumed or repeated on another machine stays comparable because its record says what made it.
"""

from __future__ import annotations

import functools
import platform
import shlex
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

LIBRARIES = ("torch", "transformers", "peft", "lm_eval", "numpy", "scipy")
# The instruction sets that decide which CPU kernels run, hence how results round (and how fast they come).
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def provenance() -> dict:
    """The record of this process: code, libraries, machine, threads, command and when."""
    return {**_static(), "threads": torch.get_num_threads(), "command": shlex.join(sys.argv),
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def describe(record: dict | None) -> str:
    """One line for a report: 'preproj 0.2.0 (git 1a2b3c4, clean), torch 2.13.0, on Intel(R) Xeon(R) ... (amx_bf16,
    avx512_bf16), 2 threads'."""
    if not record:
        return "not recorded (made before runs recorded their provenance)"
    code = record.get("git_commit")
    code = f" (git {code[:7]}{', modified' if record.get('git_dirty') else ', clean'})" if code else ""
    machine = record.get("gpu") or record.get("cpu") or "unknown machine"
    flags = record.get("isa") or []
    libraries = record.get("libraries", {})
    return (f"preproj {record.get('preproj', '?')}{code}, torch {libraries.get('torch', '?')}, transformers "
            f"{libraries.get('transformers', '?')}, on {machine}" + (f" ({', '.join(flags)})" if flags else "")
            + f", {record.get('threads', '?')} threads")


@functools.cache
def _static() -> dict:
    record = {"preproj": _version("preproj"), **_git(), "libraries": {name: _version(name) for name in LIBRARIES},
              "python": platform.python_version(), "platform": platform.platform(), "cpu": _cpu_model(),
              "isa": [flag for flag in ISA_FLAGS if flag in _cpu_flags()],
              "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    if torch.cuda.is_available():
        record["gpu"] = torch.cuda.get_device_name()
        record["cuda"] = torch.version.cuda
    return record


def preproj_version() -> str:
    """preproj's installed version, or where it runs from a source tree on PYTHONPATH without being installed (as
    benchmarks/gpu_check.sh runs it on a machine that cannot pip install) a word that says so."""
    return _version("preproj") or "unknown (not installed)"


def _version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _git() -> dict:
    """The commit of the checkout preproj runs from, and whether its code (src/, pyproject.toml) differs from that
    commit; results and other files being written do not count. Nothing when preproj is not run from a checkout."""
    root = Path(__file__).resolve().parents[3]
    if not (root / ".git").exists():
        return {}
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        changed = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "src", "pyproject.toml"],
                                 capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"git_commit": commit, "git_dirty": bool(changed)}


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def _cpu_model() -> str:
    for line in _cpuinfo():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def _cpu_flags() -> set[str]:
    for line in _cpuinfo():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()
