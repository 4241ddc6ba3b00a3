"""One batched log-likelihood routine that every task scores through.

It runs the decoder once per batch and applies the LM head only at the positions that are scored, in chunks, so no
(B, T, vocab) tensor of logits is ever built. The choices of a multiple-choice item share their context, so they are
packed into one row: the context once, then each choice attending to the context and to itself only, at the
positions it would have on its own (a 4D mask and position ids). Packing is checked against unpacked scoring on the
first item it applies to in each call and is turned off for a model where the two disagree. With a journal, every
scored batch is kept on disk as it finishes, so a stopped evaluation resumes at the batch it was in, with the same
numbers to the last bit (a batch is scored the same way whether or not others were).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from ..core.loss import body_and_head
from ..runtime import distributed as ddist
from ..runtime.files import Journal
from ..runtime.loading import model_max_length
from ..runtime.precision import precision as as_precision

HEAD_CHUNK = 2048  # positions per LM-head chunk
PACK_CHECK_NATS = 1e-2  # per scored token: far above rounding, far below what a mask or position error does


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
                 precision: str = "fp32", progress: bool = True, pack: bool = True,
                 journal: str | Path | None = None, journal_key: str = ""):
        """`journal`: a file that keeps every scored batch, for scoring the same items again after a stop;
        `journal_key` names what the scores depend on beyond the items (the weights, the evaluation's settings)."""
        self.model, self.tokenizer = model, tokenizer
        self.journal, self.journal_key = (Path(journal) if journal else None), journal_key
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
        """Token ids without special tokens (a continuation on its own)."""
        return self.tokenizer.encode(text, add_special_tokens=False)

    def harness_encode(self, text: str) -> list[int]:
        """Token ids as the harness's HFLM.tok_encode gives them: the tokenizer's own special tokens (Gemma's BOS;
        none for SmolLM2), unless the text already starts with the prefix token's text."""
        bos = self.tokenizer.decode(self.prefix_token_id)
        return self.tokenizer.encode(text, add_special_tokens=False) if bos and text.startswith(bos) \
            else self.tokenizer.encode(text)

    def encode_special(self, text: str) -> list[int]:
        """Token ids as the tokenizer gives them by default (a BOS where it adds one): the paper's `tokenizer(text)`."""
        return self.tokenizer.encode(text)

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """The harness's split: trailing spaces of the context move to the continuation; the pair is
        tokenised whole and the continuation is what follows the context's own tokens."""
        if not context:
            ids = self.encode(continuation)
            return ([self.prefix_token_id], ids) if ids[:1] != [self.prefix_token_id] else (ids[:1], ids[1:])
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
        whole, ctx = self.harness_encode(context + continuation), self.harness_encode(context)
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

    def choices(self, groups: list[tuple[list[int], list[list[int]]]],
                desc: str = "scoring") -> list[tuple[float, bool]]:
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
            raise ValueError(f"A continuation of {len(cont)} tokens cannot be scored with max_length "
                             f"{self.max_length}.")
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
        """Whether this model scores a packed group as it scores its pairs (it must honour 4D masks and position
        ids)."""
        try:
            packed = self._score_batch([self._packed_row(0, ctx, conts)], len(conts))
        except (TypeError, ValueError, RuntimeError):  # a forward that takes no 4D mask or position ids
            return False
        plain = self._score_batch([self._plain_row(i, ctx, c) for i, c in enumerate(conts)], len(conts))
        return all(abs(a[0] - b[0]) <= PACK_CHECK_NATS * len(c) and a[1] == b[1]
                   for a, b, c in zip(packed, plain, conts, strict=True))

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
        journal = self._open_journal(mine)
        scored = []
        bar = tqdm(total=sum(len(t.targets) for b in mine for t in b), desc=desc,
                   disable=not (self.progress and r.is_main), leave=False)
        for k, batch in enumerate(mine):
            indices = [i for row in batch for i, _, _ in row.targets]
            if journal and k in journal.done:
                part = [(i, (logprob, greedy)) for i, logprob, greedy in journal.done[k]]
            else:
                local = {i: j for j, i in enumerate(indices)}
                batch = [_Row(row.ids, row.positions, [(local[i], c, t) for i, c, t in row.targets]) for row in batch]
                part = list(zip(indices, self._score_batch(batch, len(indices)), strict=True))
                if journal:
                    journal.record(k, [[i, logprob, greedy] for i, (logprob, greedy) in part])
            scored += part
            bar.update(len(indices))
        bar.close()
        results: list[tuple[float, bool] | None] = [None] * n_results
        for part in ddist.gather_objects(scored):
            for i, value in part:
                results[i] = value
        return results

    def journal_path(self) -> Path | None:
        """This process's journal: one file per process, each scoring its own share of the batches."""
        r = ddist.ranks()
        if self.journal is None or r.world_size == 1:
            return self.journal
        return self.journal.with_name(f"{self.journal.name}.rank{r.rank}")

    def _open_journal(self, batches: list[list[_Row]]) -> Journal | None:
        """The journal of this very call: its batches, row by row, under this key, precision and process count."""
        if self.journal is None:
            return None
        rows = [[(row.ids, row.positions, row.targets) for row in batch] for batch in batches]
        call = json.dumps([self.journal_key, self.precision.name, ddist.ranks().world_size, rows])
        return Journal(self.journal_path(), hashlib.sha256(call.encode()).hexdigest())

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
                scored = self.body(input_ids=ids, use_cache=False, **extra).last_hidden_state[rows_t, cols_t]  # (N, d)
            else:
                scored = self.model(input_ids=ids, use_cache=False, **extra).logits[rows_t, cols_t]  # (N, V)
            logprob, greedy = [], []
            for s in range(0, len(targets), HEAD_CHUNK):  # chunks bound the (N, V) logits in memory
                chunk = scored[s : s + HEAD_CHUNK]
                logits = (self.head(chunk) if self.fast else chunk).float()  # (n, V)
                t = target_t[s : s + HEAD_CHUNK]
                logprob.append(torch.log_softmax(logits, dim=-1).gather(1, t[:, None])[:, 0])
                greedy.append(logits.argmax(-1) == t)
        sums = torch.zeros(n_results, dtype=torch.float64, device=device).index_add_(
            0, owner_t, torch.cat(logprob).double())
        misses = torch.zeros(n_results, dtype=torch.long, device=device).index_add_(
            0, owner_t, (~torch.cat(greedy)).long())
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
