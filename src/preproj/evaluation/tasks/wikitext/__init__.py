"""WikiText-2 test: perplexity of whole documents (the harness) or of the paper's rows of the validation split. Its
variant wikitext_file (the test documents in the file's own format) is file.py."""

from __future__ import annotations

import math
import re

import numpy as np

from ..base import PAPER_MAX_TOKENS, HarnessCopy, Metric, Task, first, mean_stderr, ratio_stderr
from . import reader
from .reader import harness_file

# the author's perplexity rule (docs/method.md: the frozen probe)
PAPER_WIKITEXT_ROWS, PAPER_MIN_CHARS, PAPER_MIN_TOKENS = 300, 50, 10


def harness(score, docs: list[dict], items: list | None = None, *, detokenize: bool = True) -> dict:
    """The harness's wikitext task: rolling windows over each document, perplexity per word and per byte of the
    file's text; detokenize=False scores each page as the file has it (spaced punctuation)."""
    windows, owner = [], []
    for i, doc in enumerate(docs):
        text = reader.detokenize(doc["page"]) if detokenize else doc["page"]
        for w in score.rolling_windows(score.harness_encode(text)):
            windows.append(w)
            owner.append(i)
    results = score(windows, desc="wikitext")
    doc_ll, doc_tokens = np.zeros(len(docs)), np.zeros(len(docs), dtype=np.int64)
    for i, (ll, _), (_, cont) in zip(owner, results, windows, strict=True):
        doc_ll[i] += ll
        doc_tokens[i] += len(cont)
    words = np.array([len(re.split(r"\s+", d["page"])) for d in docs], dtype=np.float64)
    nbytes = np.array([len(d["page"].encode("utf-8")) for d in docs], dtype=np.float64)
    if items is not None:
        items += [{"index": i, "ll": float(doc_ll[i]), "tokens": int(doc_tokens[i]), "words": int(words[i]),
                   "bytes": int(nbytes[i])} for i in range(len(docs))]
    per_word, per_byte = -doc_ll.sum() / words.sum(), -doc_ll.sum() / nbytes.sum()
    se_word, se_byte = ratio_stderr(-doc_ll, words), ratio_stderr(-doc_ll, nbytes)
    return {"word_perplexity": math.exp(per_word), "byte_perplexity": math.exp(per_byte),
            "bits_per_byte": float(per_byte / math.log(2)), "n": len(docs),
            "word_perplexity_stderr": math.exp(per_word) * se_word,
            "byte_perplexity_stderr": math.exp(per_byte) * se_byte,
            "bits_per_byte_stderr": se_byte / math.log(2), "tokens": int(sum(len(w[1]) for w in windows))}


def paper_rows(rows: list[str], encode) -> list[tuple[str, list[int]]]:
    """(row, its token ids) for each row the author's rule scores (docs/method.md: the frozen probe): of the first 300
    rows, blank ones included, those whose stripped text has >= 50 characters and which tokenise, truncated to
    512 tokens, to >= 10 tokens. Each row keeps its trailing newline."""
    picked = []
    for row in rows[:PAPER_WIKITEXT_ROWS]:
        if len(row.strip()) >= PAPER_MIN_CHARS:
            ids = encode(row)[:PAPER_MAX_TOKENS]
            if len(ids) >= PAPER_MIN_TOKENS:
                picked.append((row, ids))
    return picked


def paper(score, rows: list[str], items: list | None = None) -> dict:
    """The paper's perplexity (docs/method.md: the frozen probe): exp(mean over the scored rows of each row's mean
    token loss), the loss of model(ids, labels=ids): every token after the first is predicted."""
    pairs = [(ids[:1], ids[1:]) for _, ids in paper_rows(rows, score.encode_special)]
    results = score(pairs, desc="wikitext (paper)")
    line_loss = [-ll / len(cont) for (ll, _), (_, cont) in zip(results, pairs, strict=True)]
    if items is not None:
        items += [{"index": i, "ll": ll, "tokens": len(cont)}
                  for i, ((ll, _), (_, cont)) in enumerate(zip(results, pairs, strict=True))]
    ppl = math.exp(np.mean(line_loss))
    return {"perplexity": ppl, "n": len(pairs), "perplexity_stderr": ppl * mean_stderr(line_loss)}


def run(score, protocol: str, limit: int | None, data_dir, items: list | None = None,
        notes: list | None = None) -> dict:
    if protocol == "harness":
        return harness(score, first(reader.documents(data_dir), limit), items)
    return paper(score, reader.rows("valid", data_dir), items)  # the author's own rows, whatever the limit


# Documents are scored as ratios of sums (a document's negative log-likelihood over its words or tokens).
WORD_PERPLEXITY = Metric("word_perplexity", "WikiText word PPL", False, "perplexity", lambda r: (-r["ll"], r["words"]))
HELDOUT_LOSS = Metric("heldout_loss", "WikiText loss/token", False, "ratio_of_sums", lambda r: (-r["ll"], r["tokens"]))
PAPER_PERPLEXITY = Metric("perplexity", "WikiText PPL", False, "perplexity", lambda r: (-r["ll"] / r["tokens"], 1.0))
TASK = Task("wikitext", "WikiText-2: perplexity (harness: test documents; paper: the author's validation rows)", run,
            {"harness": (WORD_PERPLEXITY, HELDOUT_LOSS), "paper": (PAPER_PERPLEXITY,)},
            harness=HarnessCopy(harness_file, ("wikitext/preprocess_wikitext.py",)))
