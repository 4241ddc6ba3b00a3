"""LAMBADA (OpenAI's version): predict the last word of a passage; accuracy of the greedy continuation."""

from __future__ import annotations

import math

import numpy as np

from ..base import PAPER_MAX_TOKENS, HarnessCopy, Metric, Task, accuracy_metric, first, mean_stderr
from . import reader
from .reader import harness_file


def harness(score, docs: list[dict], items: list | None = None) -> dict:
    """lambada_openai: the passage up to its last word, then " word"; acc is greedy decoding hitting every token."""
    pairs = [score.encode_pair(" ".join(d["text"].split(" ")[:-1]), " " + d["text"].split(" ")[-1]) for d in docs]
    results = score(pairs, desc="lambada")
    lls, hits = [r[0] for r in results], [float(r[1]) for r in results]
    if items is not None:
        items += [{"index": i, "ll": ll, "acc": hit, "tokens": len(p[1])}
                  for i, (ll, hit, p) in enumerate(zip(lls, hits, pairs, strict=True))]
    ppl = math.exp(-np.mean(lls))
    return {"acc": float(np.mean(hits)), "perplexity": ppl, "n": len(docs), "acc_stderr": mean_stderr(hits),
            "perplexity_stderr": ppl * mean_stderr(lls)}


def paper(score, docs: list[dict], items: list | None = None) -> dict:
    """docs/method.md: the frozen probe: the target word tokenized alone; items longer than 512 tokens are skipped."""
    pairs = []
    for d in docs:
        words = d["text"].split(" ")
        # the target alone, without the BOS a tokenizer may add: it follows the context (docs/method.md)
        pairs.append((score.encode_special(" ".join(words[:-1])), score.encode(" " + words[-1])))
    kept = [i for i, p in enumerate(pairs) if len(p[0]) + len(p[1]) <= PAPER_MAX_TOKENS]
    results = score([pairs[i] for i in kept], desc="lambada (paper)")
    hits = [float(r[1]) for r in results]
    if items is not None:
        items += [{"index": i, "ll": r[0], "acc": hit, "tokens": len(pairs[i][1])}
                  for i, r, hit in zip(kept, results, hits, strict=True)]
    return {"acc": float(np.mean(hits)), "n": len(kept), "skipped_over_512_tokens": len(pairs) - len(kept),
            "acc_stderr": mean_stderr(hits)}


def run(score, protocol: str, limit: int | None, data_dir, items: list | None = None,
        notes: list | None = None) -> dict:
    docs = first(reader.items(data_dir), limit)
    return harness(score, docs, items) if protocol == "harness" else paper(score, docs, items)


ACC: Metric = accuracy_metric("acc", "LAMBADA acc")
TASK = Task("lambada", "LAMBADA (OpenAI): last-word accuracy", run, {"harness": (ACC,), "paper": (ACC,)},
            harness=HarnessCopy(harness_file))
