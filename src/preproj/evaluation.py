"""`preproj eval`: LAMBADA, WikiText, HellaSwag and ARC-Easy under two named protocols.

protocol "harness" (default): the metric definitions of lm-evaluation-harness 0.4.x (lambada_openai,
wikitext, hellaswag, arc_easy), including its tokenisation of (context, continuation) pairs and its
rolling windows for perplexity. protocol "paper": the definitions of PAPER.md §2.

All scoring goes through one batched log-likelihood routine. It runs the decoder once per batch and
applies the LM head only at the positions that are scored, in chunks, so no (B, T, vocab) tensor of
logits is ever built. The choices of a multiple-choice item share their context, so they are packed
into one row: the context once, then each choice attending to the context and to itself only, at the
positions it would have on its own (a 4D mask and position ids). Packing is checked against unpacked
scoring on the first item it applies to in each call and is turned off for a model where the two disagree.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from . import data as datasets
from . import distributed as ddist
from .files import write_json, write_jsonl
from .loss import body_and_head
from .precision import check_weights_dtype
from .precision import precision as as_precision
from .validation import check_value, check_within_context

TASKS = ("lambada", "wikitext", "hellaswag", "arc_easy")
# wikitext_file: the same WikiText-2 test documents as the file has them (spaced punctuation, ' @-@ '), the format of
# the tokenized training text; the harness (and `wikitext`) scores them detokenized.
EXTRA_TASKS = ("hellaswag_full", "wikitext_file")
PROTOCOLS = ("harness", "paper")
PAPER_LIMIT = 500  # PAPER.md §2: the first 500 items of each task
PAPER_MAX_TOKENS = 512
PAPER_WIKITEXT_ROWS, PAPER_MIN_CHARS, PAPER_MIN_TOKENS = 300, 50, 10  # the author's perplexity rule, PAPER.md §2
HEAD_CHUNK = 2048  # positions per LM-head chunk
PACK_CHECK_NATS = 1e-2  # per scored token: far above rounding, far below what a mask or position error does


@dataclass
class EvalArgs:
    """Arguments of `preproj eval`."""

    model: str = "smollm2-135m"
    """Embedded name, Hugging Face hub id or local directory."""
    adapter: str | None = None
    """Directory of a saved adapter to load onto the model (None: the base model)."""
    tasks: str = ",".join(TASKS)
    """Comma-separated tasks: lambada, wikitext, hellaswag, arc_easy (hellaswag_full: llama.cpp's 10,042 items)."""
    protocol: str = "harness"
    """'harness' (lm-evaluation-harness 0.4.x definitions) or 'paper' (PAPER.md §2)."""
    limit: int | None = None
    """Take the first N items of each task (the paper protocol defaults to 500)."""
    data_dir: str | None = None
    """Directory laid out as ../shared/data; default $PREPROJ_DATA_DIR, else the Hugging Face Hub."""
    max_length: int | None = None
    """Longest window scored at once (harness: the model's context length; rolling WikiText windows use it)."""
    batch_tokens: int = 1024
    """Token budget of one forward batch (padded length x rows); small batches stay in cache on CPUs."""
    merge_lora: bool = True
    """Merge a LoRA adapter into the base weights before scoring (the same model up to rounding, at the base's cost;
    an unmerged rank-r LoRA adds two matmuls per projection). preproj's own modules never merge."""
    precision: str = "fp32"
    """fp32, bf16-mixed (bf16 autocast; faster on CPUs with avx512_bf16 and on GPUs, not bit-comparable with the
    harness), bf16-true (bf16 weights) or bf16-frozen (bf16 base, fp32 adapter)."""
    device: str = "auto"
    """auto (CUDA when present, else CPU), cpu, cuda, cuda:N or mps. Under torchrun the items are split across
    processes and gathered: the JSON is the one a single process writes."""
    out: str | None = None
    """Write the results as JSON to this path."""
    items: bool = False
    """Also write one record per item (log-likelihoods, correctness, token and byte counts) to OUT's name with
    .items.jsonl, so that any two runs on the same items can be compared pairwise later."""


# --- scoring -------------------------------------------------------------------------------------

@dataclass
class _Row:
    """One row of a forward batch: its input ids, and the results it scores as (result index, the columns whose
    logits predict the targets, target ids). A packed row also has its position ids."""

    ids: list[int]
    positions: list[int] | None
    targets: list[tuple[int, list[int], list[int]]]


class LogLikelihood:
    """Batched log P(continuation | context) for token-id pairs, as the harness's HFLM computes it."""

    def __init__(self, model: nn.Module, tokenizer, *, max_length: int | None = None, batch_tokens: int = 1024,
                 precision: str = "fp32", progress: bool = True, pack: bool = True):
        self.model, self.tokenizer = model, tokenizer
        self.max_length = max_length or model_max_length(model, tokenizer)
        self.batch_tokens, self.progress = batch_tokens, progress
        self.precision = as_precision(precision)
        # Families whose logits are head(body(x)) get the head only where scored; anything else falls
        # back to the model's own logits (slower, but never wrong).
        parts = body_and_head(model)
        self.fast = parts is not None
        self.body, self.head = parts or (None, None)
        self.prefix_token_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        self.pack = pack
        self.pack_checked: bool | None = None  # whether packed and unpacked scores agree on this model; None: not yet

    def encode(self, text: str) -> list[int]:
        """Token ids without special tokens, as the harness's HFLM encodes for causal models."""
        return self.tokenizer.encode(text, add_special_tokens=False)

    def encode_special(self, text: str) -> list[int]:
        """Token ids as the tokenizer gives them by default (a BOS where it adds one): the paper's `tokenizer(text)`."""
        return self.tokenizer.encode(text)

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """The harness's split: trailing spaces of the context move to the continuation; the pair is
        tokenised whole and the continuation is what follows the context's own tokens."""
        if not context:
            return [self.prefix_token_id], self.encode(continuation)
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
        whole, ctx = self.encode(context + continuation), self.encode(context)
        return ctx, whole[len(ctx):]

    def rolling_windows(self, tokens: list[int]) -> list[tuple[list[int], list[int]]]:
        """The harness's disjoint rolling windows (context_len=1): every token is predicted exactly once,
        each window conditioned on the max_length tokens before it, the first on the prefix token."""
        windows, done, n = [], 0, len(tokens)
        while done < n:
            end = min(n, done + self.max_length)
            # context: the tokens before this window that still fit, or the prefix token at the start
            context = tokens[max(0, end - self.max_length - 1) : done] if done else [self.prefix_token_id]
            windows.append((context, tokens[done:end]))
            done = end
        return windows

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def __call__(self, pairs: list[tuple[list[int], list[int]]], desc: str = "scoring") -> list[tuple[float, bool]]:
        """(sum of log-probs, all tokens greedy) for each (context ids, continuation ids) pair."""
        return self._score([self._plain_row(i, ctx, cont) for i, (ctx, cont) in enumerate(pairs)], len(pairs), desc)

    def choices(self, groups: list[tuple[list[int], list[list[int]]]], desc: str = "scoring") -> list[tuple[float, bool]]:
        """(sum of log-probs, all tokens greedy) for every choice of every (context ids, [choice ids, ...]) group,
        flattened in order: the same numbers as __call__ on the (context, choice) pairs, with each context run
        once. Groups that would be truncated are scored as pairs."""
        pairs = [(ctx, cont) for ctx, conts in groups for cont in conts]
        rows, start = [], 0
        for ctx, conts in groups:
            fits = all(len(ctx) + len(c) <= self.max_length + 1 for c in conts)  # no left truncation
            packable = self.pack and fits and len(conts) > 1
            if packable and self.pack_checked is None:  # checked on the first group it would apply to
                self.pack_checked = self._packing_agrees(ctx, conts)
            if packable and self.pack_checked:
                rows.append(self._packed_row(start, ctx, conts))
            else:
                rows += [self._plain_row(start + j, ctx, c) for j, c in enumerate(conts)]
            start += len(conts)
        return self._score(rows, len(pairs), desc)

    def _plain_row(self, index: int, ctx: list[int], cont: list[int]) -> _Row:
        if not 0 < len(cont) <= self.max_length:
            raise ValueError(f"A continuation of {len(cont)} tokens cannot be scored with max_length {self.max_length}.")
        inp = (ctx + cont)[-(self.max_length + 1):][:-1]  # left-truncated, as the harness
        first = len(inp) - len(cont)  # position whose logits predict cont[0]
        return _Row(inp, None, [(index, list(range(first, len(inp))), cont)])

    @staticmethod
    def _packed_row(index: int, ctx: list[int], conts: list[list[int]]) -> _Row:
        """ctx + each choice but its last token; choice i is predicted from the context's last position, then
        from its own tokens, which sit at the positions they would have after the context alone."""
        ids, positions, targets = list(ctx), list(range(len(ctx))), []
        for i, cont in enumerate(conts):
            start = len(ids)
            ids += cont[:-1]
            positions += range(len(ctx), len(ctx) + len(cont) - 1)
            targets.append((index + i, [len(ctx) - 1] + list(range(start, start + len(cont) - 1)), cont))
        return _Row(ids, positions, targets)

    def _packing_agrees(self, ctx: list[int], conts: list[list[int]]) -> bool:
        """Whether this model scores a packed group as it scores its pairs (it must honour 4D masks and position ids)."""
        try:
            packed = self._score_batch([self._packed_row(0, ctx, conts)], len(conts))
        except (TypeError, ValueError, RuntimeError):  # a forward that takes no 4D mask or position ids
            return False
        plain = self._score_batch([self._plain_row(i, ctx, c) for i, c in enumerate(conts)], len(conts))
        return all(abs(a[0] - b[0]) <= PACK_CHECK_NATS * len(c) and a[1] == b[1] for a, b, c in zip(packed, plain, conts, strict=True))

    @torch.no_grad()
    def _score(self, rows: list[_Row], n_results: int, desc: str) -> list[tuple[float, bool]]:
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i].ids))  # longest first, as the harness
        batches, start = [], 0
        while start < len(order):
            count = max(1, self.batch_tokens // len(rows[order[start]].ids))
            batches.append([rows[i] for i in order[start : start + count]])
            start += count
        # Several processes: batch k goes to process k mod N. Every item is scored in the very batch one
        # process would put it in, so the gathered results are that process's, bit for bit.
        r = ddist.ranks()
        mine = batches[r.rank :: r.world_size]
        scored = []
        bar = tqdm(total=sum(len(t.targets) for b in mine for t in b), desc=desc, disable=not (self.progress and r.is_main),
                   leave=False)
        for batch in mine:
            indices = [i for row in batch for i, _, _ in row.targets]
            local = {i: k for k, i in enumerate(indices)}
            batch = [_Row(row.ids, row.positions, [(local[i], c, t) for i, c, t in row.targets]) for row in batch]
            scored += zip(indices, self._score_batch(batch, len(indices)), strict=True)
            bar.update(len(indices))
        bar.close()
        results: list[tuple[float, bool] | None] = [None] * n_results
        for part in ddist.gather_objects(scored):
            for i, value in part:
                results[i] = value
        return results

    @torch.no_grad()
    def _score_batch(self, batch: list[_Row], n_results: int) -> list[tuple[float, bool]]:
        """Scores of results 0..n_results-1, which the rows' targets name."""
        device = self.device
        width = max(len(row.ids) for row in batch)
        padded = [row.ids + [0] * (width - len(row.ids)) for row in batch]  # right-padded: causal, so no mask
        owner, rows, cols, targets = [], [], [], []
        for b, row in enumerate(batch):
            for index, columns, cont in row.targets:
                owner += [index] * len(cont)
                rows += [b] * len(cont)
                cols += columns
                targets += cont
        ids = torch.tensor(padded, device=device)  # (B, T)
        extra = self._packing_inputs(batch, width, device) if any(row.positions for row in batch) else {}
        rows_t, cols_t = torch.tensor(rows, device=device), torch.tensor(cols, device=device)
        owner_t, target_t = torch.tensor(owner, device=device), torch.tensor(targets, device=device)
        with self.precision.compute_context(device):
            if self.fast:
                scored = self.body(input_ids=ids, **extra).last_hidden_state[rows_t, cols_t]  # (N, d)
            else:
                scored = self.model(input_ids=ids, **extra).logits[rows_t, cols_t]  # (N, V)
            logprob, greedy = [], []
            for s in range(0, len(targets), HEAD_CHUNK):  # chunks bound the (N, V) logits in memory
                chunk = scored[s : s + HEAD_CHUNK]
                logits = (self.head(chunk) if self.fast else chunk).float()  # (n, V)
                t = target_t[s : s + HEAD_CHUNK]
                logprob.append(torch.log_softmax(logits, dim=-1).gather(1, t[:, None])[:, 0])
                greedy.append(logits.argmax(-1) == t)
        sums = torch.zeros(n_results, dtype=torch.float64, device=device).index_add_(0, owner_t, torch.cat(logprob).double())
        misses = torch.zeros(n_results, dtype=torch.long, device=device).index_add_(0, owner_t, (~torch.cat(greedy)).long())
        return list(zip(sums.tolist(), (misses == 0).tolist(), strict=True))

    def _packing_inputs(self, batch: list[_Row], width: int, device: torch.device) -> dict:
        """position_ids (B, T) and the 4D mask (B, 1, T, T) of a batch with packed rows: causal, and a choice's
        tokens see the shared context and their own choice only. Padding sees itself and what precedes it."""
        positions = torch.zeros(len(batch), width, dtype=torch.long)
        allowed = torch.ones(width, width, dtype=torch.bool).tril().repeat(len(batch), 1, 1)  # (B, T, T)
        for b, row in enumerate(batch):
            if not row.positions:  # a plain row: causal, its padding continuing its positions
                positions[b] = torch.arange(width)
                continue
            n = len(row.ids)
            positions[b, :n] = torch.tensor(row.positions)
            positions[b, n:] = max(row.positions) + 1
            segment = torch.zeros(width, dtype=torch.long)  # 0: shared context (and padding)
            for k, (_, columns, _) in enumerate(row.targets):
                segment[columns[1:]] = k + 1
            allowed[b] &= (segment[:, None] == segment[None, :]) | (segment[None, :] == 0)
        mask = allowed[:, None]
        if getattr(self.model.config, "_attn_implementation", "eager") != "sdpa":  # eager adds the mask to the scores
            mask = torch.zeros(mask.shape).masked_fill_(~mask, torch.finfo(torch.float32).min)
        return {"position_ids": positions.to(device), "attention_mask": mask.to(device)}


def model_max_length(model: nn.Module, tokenizer, default: int = 2048) -> int:
    """The harness's resolution: config n_positions / max_position_embeddings / n_ctx, then the tokenizer."""
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(model.config, attr, None)
        if value is not None:
            return int(value)
    value = getattr(tokenizer, "model_max_length", None)
    return int(value) if value is not None and value < 10**12 else default


# --- statistics ----------------------------------------------------------------------------------

def mean_stderr(values) -> float:
    """Standard error of a mean (sample std, ddof=1), the harness's mean_stderr."""
    values = np.asarray(values, dtype=np.float64)
    return float(values.std(ddof=1) / math.sqrt(len(values))) if len(values) > 1 else float("nan")


def ratio_stderr(numerators, denominators) -> float:
    """Delta-method standard error of sum(num) / sum(den) over documents (a ratio estimator)."""
    x, w = np.asarray(numerators, dtype=np.float64), np.asarray(denominators, dtype=np.float64)
    n = len(x)
    if n < 2:
        return float("nan")
    r = x.sum() / w.sum()
    return float(math.sqrt(((x - r * w) ** 2).sum() / (n * (n - 1))) / w.mean())


# --- tasks ---------------------------------------------------------------------------------------

def _multiple_choice(score: LogLikelihood, docs: list[dict], context_of, choices_of, desc: str, mean_per_token: bool,
                     items: list | None = None):
    pairs, spans, groups = [], [], []
    for doc in docs:
        ctx, choices = context_of(doc), choices_of(doc)
        spans.append((len(pairs), len(choices)))
        mine = [score.encode_pair(ctx, " " + c) if not mean_per_token else _paper_pair(score, ctx, " " + c) for c in choices]
        pairs += mine
        if all(c == mine[0][0] for c, _ in mine):  # one context for every choice: scored once
            groups.append((mine[0][0], [cont for _, cont in mine]))
        else:
            groups += [(c, [cont]) for c, cont in mine]
    results = score.choices(groups, desc=desc)
    acc, acc_norm = [], []
    for index, (doc, (start, k)) in enumerate(zip(docs, spans, strict=True)):
        lls = np.array([results[start + j][0] for j in range(k)])
        tokens = [len(pairs[start + j][1]) for j in range(k)]
        record = {"index": index, "gold": int(doc["gold"]), "lls": lls.tolist(), "tokens": tokens}
        if mean_per_token:  # PAPER.md §2: mean log-prob per continuation token
            acc.append(float(np.argmax(lls / np.array(tokens, dtype=np.float64)) == doc["gold"]))
        else:  # harness: acc on the sum, acc_norm on the sum over the choice's length in characters
            lens = np.array([float(len(c)) for c in choices_of(doc)])
            acc.append(float(np.argmax(lls) == doc["gold"]))
            acc_norm.append(float(np.argmax(lls / lens) == doc["gold"]))
            record.update(chars=lens.astype(int).tolist(), acc_norm=acc_norm[-1])
        if items is not None:
            items.append({**record, "acc": acc[-1]})
    out = {"acc": float(np.mean(acc)), "n": len(docs), "acc_stderr": mean_stderr(acc)}
    if acc_norm:
        out.update(acc_norm=float(np.mean(acc_norm)), acc_norm_stderr=mean_stderr(acc_norm))
    return out


def _paper_pair(score: LogLikelihood, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """The paper's split: tokenise context + continuation, score what follows the context's tokens."""
    ctx = score.encode_special(context)
    return ctx, score.encode_special(context + continuation)[len(ctx):]


def lambada_harness(score: LogLikelihood, docs: list[dict], items: list | None = None) -> dict:
    pairs = [score.encode_pair(" ".join(d["text"].split(" ")[:-1]), " " + d["text"].split(" ")[-1]) for d in docs]
    results = score(pairs, desc="lambada")
    lls, hits = [r[0] for r in results], [float(r[1]) for r in results]
    if items is not None:
        items += [{"index": i, "ll": ll, "acc": hit, "tokens": len(p[1])} for i, (ll, hit, p) in enumerate(zip(lls, hits, pairs, strict=True))]
    ppl = math.exp(-np.mean(lls))
    return {"acc": float(np.mean(hits)), "perplexity": ppl, "n": len(docs), "acc_stderr": mean_stderr(hits),
            "perplexity_stderr": ppl * mean_stderr(lls)}


def lambada_paper(score: LogLikelihood, docs: list[dict], items: list | None = None) -> dict:
    pairs = []
    for d in docs:
        words = d["text"].split(" ")
        # the target alone, without the BOS a tokenizer may add: it follows the context (PAPER.md §2)
        pairs.append((score.encode_special(" ".join(words[:-1])), score.encode(" " + words[-1])))
    kept = [i for i, p in enumerate(pairs) if len(p[0]) + len(p[1]) <= PAPER_MAX_TOKENS]
    results = score([pairs[i] for i in kept], desc="lambada (paper)")
    hits = [float(r[1]) for r in results]
    if items is not None:
        items += [{"index": i, "ll": r[0], "acc": hit, "tokens": len(pairs[i][1])} for i, r, hit in zip(kept, results, hits, strict=True)]
    return {"acc": float(np.mean(hits)), "n": len(kept), "skipped_over_512_tokens": len(pairs) - len(kept),
            "acc_stderr": mean_stderr(hits)}


def wikitext_harness(score: LogLikelihood, docs: list[dict], items: list | None = None, *,
                     detokenize: bool = True) -> dict:
    """The harness's wikitext task; detokenize=False scores each page as the file has it (spaced punctuation)."""
    windows, owner = [], []
    for i, doc in enumerate(docs):
        text = datasets.wikitext_detokenize(doc["page"]) if detokenize else doc["page"]
        for w in score.rolling_windows(score.encode(text)):
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
            "word_perplexity_stderr": math.exp(per_word) * se_word, "byte_perplexity_stderr": math.exp(per_byte) * se_byte,
            "bits_per_byte_stderr": se_byte / math.log(2), "tokens": int(sum(len(w[1]) for w in windows))}


def paper_wikitext_rows(rows: list[str], encode) -> list[tuple[str, list[int]]]:
    """(row, its token ids) for each row the author's rule scores (PAPER.md §2): of the first 300 rows,
    blank ones included, those whose stripped text has >= 50 characters and which tokenise, truncated to
    512 tokens, to >= 10 tokens. Each row keeps its trailing newline."""
    picked = []
    for row in rows[:PAPER_WIKITEXT_ROWS]:
        if len(row.strip()) >= PAPER_MIN_CHARS:
            ids = encode(row)[:PAPER_MAX_TOKENS]
            if len(ids) >= PAPER_MIN_TOKENS:
                picked.append((row, ids))
    return picked


def wikitext_paper(score: LogLikelihood, rows: list[str], items: list | None = None) -> dict:
    """PAPER.md §2: perplexity = exp(mean over the scored rows of each row's mean token loss), the loss
    of model(ids, labels=ids): every token after the first is predicted."""
    pairs = [(ids[:1], ids[1:]) for _, ids in paper_wikitext_rows(rows, score.encode_special)]
    results = score(pairs, desc="wikitext (paper)")
    line_loss = [-ll / len(cont) for (ll, _), (_, cont) in zip(results, pairs, strict=True)]
    if items is not None:
        items += [{"index": i, "ll": ll, "tokens": len(cont)} for i, ((ll, _), (_, cont)) in enumerate(zip(results, pairs, strict=True))]
    ppl = math.exp(np.mean(line_loss))
    return {"perplexity": ppl, "n": len(pairs), "perplexity_stderr": ppl * mean_stderr(line_loss)}


def run_task(score: LogLikelihood, task: str, protocol: str, limit: int | None, data_dir: Path | None,
             items: list | None = None, notes: list | None = None) -> dict:
    """The task's metrics; with `items`, also one record per item (appended) for paired comparisons, and with
    `notes`, what the reader should know about the data used (appended)."""
    if protocol == "paper" and limit is None:
        limit = PAPER_LIMIT
    take = (lambda items: items[:limit]) if limit is not None else (lambda items: items)
    if task == "lambada":
        docs = take(datasets.lambada(data_dir))
        return lambada_harness(score, docs, items) if protocol == "harness" else lambada_paper(score, docs, items)
    if task == "wikitext_file":
        if protocol != "harness":
            raise ValueError("wikitext_file is the harness protocol's WikiText in the file's own format; the paper "
                             "protocol scores its own WikiText rows (task wikitext).")
        return wikitext_harness(score, take(datasets.wikitext_documents(data_dir)), items, detokenize=False)
    if task == "wikitext":
        if protocol == "harness":
            return wikitext_harness(score, take(datasets.wikitext_documents(data_dir)), items)
        return wikitext_paper(score, datasets.wikitext_rows("valid", data_dir), items)
    if task in ("hellaswag", "hellaswag_full"):
        if task == "hellaswag" and protocol == "paper":  # the author's first N, in the validation set's order
            docs, source = datasets.hellaswag_in_order(data_dir)
            if notes is not None:
                notes.append(source)
        else:
            docs = datasets.hellaswag(data_dir, full=task == "hellaswag_full")
        docs = take(docs)
        if protocol == "harness":
            return _multiple_choice(score, docs, lambda d: d["query"], lambda d: d["choices"], task, False, items)
        return _multiple_choice(score, docs, lambda d: d["raw_ctx"], lambda d: d["raw_endings"], task + " (paper)", True,
                                items)
    if task == "arc_easy":
        if protocol == "harness":
            docs = take(datasets.arc_easy(data_dir, "test"))
            return _multiple_choice(score, docs, lambda d: f"Question: {d['question']}\nAnswer:", lambda d: d["choices"],
                                    "arc_easy", False, items)
        docs = take(datasets.arc_easy(data_dir, "validation"))
        return _multiple_choice(score, docs, lambda d: d["question"], lambda d: d["choices"], "arc_easy (paper)", True,
                                items)
    raise ValueError(f"Unknown task {task!r}; choose from {', '.join(TASKS + EXTRA_TASKS)}.")


def read_items(path: str | Path) -> dict[str, list[dict]]:
    """{task: [record, ...]} from a file that `evaluate(..., items_out=...)` wrote."""
    by_task: dict[str, list[dict]] = {}
    for line in Path(path).read_text().splitlines():
        record = json.loads(line)
        by_task.setdefault(record.pop("task"), []).append(record)
    return by_task


def parse_tasks(tasks: str | list[str]) -> list[str]:
    names = [t.strip() for t in (tasks.split(",") if isinstance(tasks, str) else tasks) if t.strip()]
    unknown = [t for t in names if t not in TASKS + EXTRA_TASKS]
    if unknown or not names:
        raise ValueError(f"Unknown task(s) {unknown}; choose from {', '.join(TASKS + EXTRA_TASKS)}.")
    return names


def evaluate(model: nn.Module, tokenizer, tasks: str | list[str] = TASKS, *, protocol: str = "harness",
             limit: int | None = None, data_dir: str | Path | None = None, max_length: int | None = None,
             batch_tokens: int = 1024, precision: str = "fp32", progress: bool = True,
             model_name: str | None = None, adapter: str | None = None, out: str | Path | None = None,
             items_out: str | Path | None = None) -> dict:
    """Evaluate `model` (adapted or not) and return the results dict that `preproj eval` writes.

    With `out`, the JSON is rewritten (atomically) after every task, so a long run that is stopped
    keeps what it finished. With `items_out`, a JSON Lines file gets one record per item of every task
    (its log-likelihoods, correctness, token and byte counts), for paired comparisons later."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}.")
    names = parse_tasks(tasks)
    for name, value in (("limit", limit), ("max_length", max_length), ("batch_tokens", batch_tokens)):
        check_value(name, value)
    check_within_context("max_length", max_length, model_max_length(model, tokenizer))
    check_weights_dtype(model, precision)
    data_dir = datasets.resolve_data_dir(data_dir)
    score = LogLikelihood(model, tokenizer, max_length=max_length, batch_tokens=batch_tokens, precision=precision,
                          progress=progress)
    report = {
        "model": model_name or getattr(model.config, "_name_or_path", None),
        "adapter": adapter,
        "protocol": protocol,
        "tasks": {},
        "limit": limit if protocol == "harness" or limit is not None else PAPER_LIMIT,
        "max_length": score.max_length,
        "precision": precision,
        "seconds": {},
        "notes": [],
    }
    was_training = model.training
    model.eval()
    records = []
    if items_out:
        report["items_file"] = str(items_out)
    try:
        for task in names:
            start = time.monotonic()
            items = []
            report["tasks"][task] = run_task(score, task, protocol, limit, data_dir, items, report["notes"])
            records += [{"task": task, **item} for item in items]
            report["seconds"][task] = round(time.monotonic() - start, 2)
            if task == "hellaswag_full":
                report["notes"].append(datasets.HELLASWAG_FULL_NOTE)
            if ddist.ranks().is_main:
                if items_out:
                    write_jsonl(items_out, records)
                if out:
                    write_json(out, report)
    finally:
        model.train(was_training)
    return report


def format_results(r: dict) -> str:
    lines = [f"{r['model']}" + (f" + adapter {r['adapter']}" if r["adapter"] else "") + f"  (protocol {r['protocol']})",
             f"{'task':<15} {'metric':<17} {'value':>10} {'± stderr':>10} {'n':>6}"]
    for task, m in r["tasks"].items():
        for key, value in m.items():
            if key in ("n", "tokens", "skipped_over_512_tokens") or key.endswith("_stderr"):
                continue
            se = m.get(key + "_stderr")
            lines.append(f"{task:<15} {key:<17} {value:>10.4f} {('' if se is None else f'{se:.4f}'):>10} {m['n']:>6}")
    lines += [f"note: {n}" for n in r["notes"]]
    return "\n".join(lines)
