"""Numbers that must not move: short runs' results recorded before a restructuring, checked after it.

Each pin is a fingerprint of a whole output (every adapter tensor, every metric) at a tolerance far below any real
change and above the rounding differences between CPU kernels (AVX2 against avx512), so it holds on any CI machine.
To re-record after a change that is meant to move numbers: `python tests/test_pinned.py` prints the new values."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import transformers
from conftest import TINY_CONFIGS, CharTokenizer, data_dir, tiny_model
from safetensors.torch import load_file

TRAINED = ["preproj", "skip", "preproj+skip", "lora", "preproj+lora"]
SCRATCH = ["base", "preproj+skip"]
CORPUS = [f"line {i}: the quick brown fox jumps over the lazy dog and keeps running far away {i * 7}"
          for i in range(200)]

# Recorded on 2026-12-02 from main at 3a9827c, before the move into layered packages.
PINNED_TRAINING = {'lora': {'count': 43008,
          'final_heldout_loss': 4.308762550354004,
          'initial_heldout_loss': 4.58341383934021,
          'sum': 11.64881512505599,
          'sum_of_squares': 147.46006191054164},
 'preproj': {'count': 30720,
             'final_heldout_loss': 4.41534161567688,
             'initial_heldout_loss': 4.583354711532593,
             'sum': -3.0141908381883695,
             'sum_of_squares': 22.49388098649994},
 'preproj+lora': {'count': 116736,
                  'final_heldout_loss': 4.300004005432129,
                  'initial_heldout_loss': 4.583354711532593,
                  'sum': -10.009940819068106,
                  'sum_of_squares': 305.7691169771462},
 'preproj+skip': {'count': 43008,
                  'final_heldout_loss': 4.026380777359009,
                  'initial_heldout_loss': 4.583200454711914,
                  'sum': 11.218462816334068,
                  'sum_of_squares': 16.6412262008242},
 'skip': {'count': 12288,
          'final_heldout_loss': 4.038037300109863,
          'initial_heldout_loss': 4.58282208442688,
          'sum': 8.39654463030638,
          'sum_of_squares': 5.128373453824292}}
PINNED_PRETRAINING = {'base': {'count': 119872,
          'final_heldout_loss': 4.493396282196045,
          'sum': 303.0024327290571,
          'sum_of_squares': 379.0917517453257},
 'preproj+skip': {'count': 148544,
                  'final_heldout_loss': 4.246887683868408,
                  'sum': 308.50236490576026,
                  'sum_of_squares': 378.0410732365133}}
PINNED_EVALUATION = {'harness': {'arc_easy': {'acc': 0.6666666666666666,
                          'acc_norm': 0.6666666666666666,
                          'acc_norm_stderr': 0.33333333333333337,
                          'acc_stderr': 0.33333333333333337,
                          'n': 3},
             'hellaswag': {'acc': 0.0,
                           'acc_norm': 0.6666666666666666,
                           'acc_norm_stderr': 0.33333333333333337,
                           'acc_stderr': 0.0,
                           'n': 3},
             'lambada': {'acc': 0.3333333333333333,
                         'acc_stderr': 0.33333333333333337,
                         'n': 3,
                         'perplexity': 38.13096235621528,
                         'perplexity_stderr': 55.895765473923746},
             'wikitext': {'bits_per_byte': 6.301695194777876,
                          'bits_per_byte_stderr': 0.033600460884113406,
                          'byte_perplexity': 78.88588046398696,
                          'byte_perplexity_stderr': 1.8372572620792995,
                          'n': 3,
                          'tokens': 40555,
                          'word_perplexity': 5507694369.708324,
                          'word_perplexity_stderr': 1535547768.0669723},
             'wikitext_file': {'bits_per_byte': 6.597122781838976,
                               'bits_per_byte_stderr': 0.0077866206779498084,
                               'byte_perplexity': 96.81259079684443,
                               'byte_perplexity_stderr': 0.5225240955428094,
                               'n': 3,
                               'tokens': 42371,
                               'word_perplexity': 15762781708.249485,
                               'word_perplexity_stderr': 2252854773.7400556}},
 'paper': {'arc_easy': {'acc': 0.6666666666666666,
                        'acc_stderr': 0.33333333333333337,
                        'n': 3},
           'hellaswag': {'acc': 0.3333333333333333,
                         'acc_stderr': 0.33333333333333337,
                         'n': 3},
           'lambada': {'acc': 0.3333333333333333,
                       'acc_stderr': 0.33333333333333337,
                       'n': 3,
                       'skipped_over_512_tokens': 0},
           'wikitext': {'n': 153,
                        'perplexity': 97.44742456695174,
                        'perplexity_stderr': 0.1279017723802262}}}


def tensors_fingerprint(directory: Path) -> dict:
    """Count, sum and sum of squares over every tensor of every safetensors file under `directory` (checkpoints
    left out): any change to initialisation, data order, loss or update moves them."""
    total, squares, count = 0.0, 0.0, 0
    for path in sorted(directory.rglob("*.safetensors")):
        if "checkpoint" in path.parts:
            continue
        for _name, tensor in sorted(load_file(path).items()):
            values = tensor.double()
            total, squares, count = (total + values.sum().item(), squares + values.square().sum().item(),
                                     count + values.numel())
    return {"count": count, "sum": total, "sum_of_squares": squares}


def training_fingerprint(method: str, tmp_path: Path) -> dict:
    from preproj.training import TrainArgs, train

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS))
    args = TrainArgs(model="tiny", out=str(tmp_path / method), data=str(corpus), method=method, steps=6, batch_size=2,
                     grad_accum=2, seq_len=32, lr=1e-2, warmup=2, eval_every=3, eval_batches=2, save_every=100,
                     precision="fp32", device="cpu")
    summary, _ = train(args, tiny_model("llama"), CharTokenizer(), progress=False)
    return {"initial_heldout_loss": summary["initial_heldout_loss"],
            "final_heldout_loss": summary["final_heldout_loss"],
            **tensors_fingerprint(tmp_path / method)}


def pretraining_fingerprint(method: str, tmp_path: Path) -> dict:
    from preproj.training.scratch import PretrainArgs, pretrain

    text = tmp_path / "text.txt"
    text.write_text("\n".join(CORPUS))
    args = PretrainArgs(out=str(tmp_path / method), data=str(text), tokenizer="train:300", method=method, layers=2,
                        d_model=64, heads=4, tokens=64 * 8 * 6, seq_len=64, batch_size=8, lr=3e-3, warmup=2,
                        eval_every=3, save_every=100, device="cpu", precision="fp32", sample_tokens=4)
    summary, _ = pretrain(args, progress=False)
    return {"final_heldout_loss": summary["final_heldout_loss"], **tensors_fingerprint(tmp_path / method)}


def evaluation_fingerprint(model, tokenizer, protocol: str, tasks: list[str], max_length: int) -> dict:
    from preproj import evaluate

    report = evaluate(model, tokenizer, tasks, protocol=protocol, limit=3, data_dir=data_dir(), max_length=max_length,
                      progress=False)
    return report["tasks"]


# The embedded model scores the short tasks; WikiText's long documents (minutes for it on a CPU core) go through a
# tiny model with one token per character, which exercises the same windows, rows and metrics.
EVALUATED = {"harness": (["lambada", "hellaswag", "arc_easy"], ["wikitext", "wikitext_file"]),
             "paper": (["lambada", "hellaswag", "arc_easy"], ["wikitext"])}


def long_context_tiny_model():
    config = TINY_CONFIGS["llama"]()
    config.max_position_embeddings = 512  # the paper's WikiText rows are up to 512 tokens
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def evaluations(embedded) -> dict:
    model, tokenizer = embedded
    pins = {}
    for protocol, (short, long) in EVALUATED.items():
        pins[protocol] = evaluation_fingerprint(model, tokenizer, protocol, short, 512)
        pins[protocol] |= evaluation_fingerprint(long_context_tiny_model(), CharTokenizer(), protocol, long, 512)
    return pins


def same(measured, pinned, rel: float = 1e-4) -> bool:
    if isinstance(pinned, dict):
        return measured.keys() == pinned.keys() and all(same(measured[k], pinned[k], rel) for k in pinned)
    if isinstance(pinned, float):
        return math.isclose(measured, pinned, rel_tol=rel, abs_tol=1e-7)
    return measured == pinned


@pytest.mark.parametrize("method", TRAINED)
def test_a_short_training_run_is_what_it_was(method, tmp_path):
    assert same(training_fingerprint(method, tmp_path), PINNED_TRAINING[method])


@pytest.mark.parametrize("method", SCRATCH)
def test_a_short_pretraining_run_is_what_it_was(method, tmp_path):
    assert same(pretraining_fingerprint(method, tmp_path), PINNED_PRETRAINING[method])


def test_a_short_evaluation_is_what_it_was(smollm2):
    assert same(evaluations(smollm2), PINNED_EVALUATION)


if __name__ == "__main__":  # re-record: prints the three tables to paste above
    import pprint
    import sys
    import tempfile

    sys.path.insert(0, str(Path(__file__).parent))
    from preproj import load_model

    with tempfile.TemporaryDirectory() as tmp:
        for name, fingerprint, methods in (("TRAINING", training_fingerprint, TRAINED),
                                          ("PRETRAINING", pretraining_fingerprint, SCRATCH)):
            (Path(tmp) / name).mkdir()
            print(f"PINNED_{name} =", pprint.pformat({m: fingerprint(m, Path(tmp) / name) for m in methods}))
    print("PINNED_EVALUATION =", pprint.pformat(evaluations(load_model("smollm2-135m"))))
