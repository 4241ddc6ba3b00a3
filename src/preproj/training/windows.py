"""Training text as windows of token ids: packed into one stream cut into windows, or one example per line."""

from __future__ import annotations

import logging

from ..data import resolve_data_dir, training_corpus
from ..runtime import distributed as ddist

logger = logging.getLogger(__name__)


def leading_special_tokens(tokenizer) -> list[int]:
    """The special tokens the tokenizer puts before every text it encodes (a BOS for Gemma and Llama, none for
    SmolLM2 or GPT-2)."""
    plain = tokenizer.encode("x", add_special_tokens=False)
    marked = tokenizer.encode("x")
    return marked[: marked.index(plain[0])] if plain and plain[0] in marked else []


def encode_as_text(tokenizer, text: str, add_special_tokens: bool = False) -> list[int]:
    """Token ids of `text` read as plain text: a special token's spelling inside it is encoded as the characters it
    is, never as the control token. WikiText-2's tokenized train writes rare words as `<unk>`, which Gemma's tokenizer
    would otherwise turn into its UNK token, one the model never learned to predict: those few positions would take
    a large share of the loss and its gradient, teaching the modules a token no evaluation text contains."""
    return tokenizer.encode(text, add_special_tokens=add_special_tokens, split_special_tokens=True)


def tokenize_examples(texts: list[str], tokenizer, seq_len: int, packing: str = "pack",
                      max_examples: int | None = None, what: str = "text"):
    """(input_ids, labels), each (N, seq_len) long tensors; label -100 is ignored by the loss. Text is encoded as
    plain text (encode_as_text). `what` names the text in errors ("held-out text").

    max_examples stops tokenising once that many examples exist (a held-out set needs only a few).

    packing 'pack': one token stream cut into seq_len windows (no padding; fastest on a CPU). A tokenizer that
    puts its BOS before every text (Gemma, Llama) gets it at the start of every window and nowhere else, as the
    model saw text in pretraining and sees it in evaluation: Gemma 3 270M's loss on WikiText is about a nat higher
    on windows that lack it, and modules trained there learn to undo that instead of the task.
    packing 'lines': one example per line, truncated or padded to seq_len with eos, pads masked (docs/method.md: the
    frozen probe).
    """
    import torch

    if packing == "pack":
        lead = leading_special_tokens(tokenizer)
        body = seq_len - len(lead)
        stream = []
        for text in texts:
            stream += encode_as_text(tokenizer, text.strip() + "\n")
            if max_examples is not None and len(stream) >= max_examples * body:
                break
        n = len(stream) // body if max_examples is None else min(max_examples, len(stream) // body)
        if n == 0:
            raise ValueError(f"Only {len(stream)} tokens of {what} in {len(texts)} lines: fewer than one window of "
                             f"{seq_len}; give more text or a smaller --seq-len.")
        ids = torch.tensor(stream[: n * body]).view(n, body)
        ids = torch.cat([torch.tensor(lead, dtype=torch.long).expand(n, len(lead)), ids], dim=1)
        return ids, ids.clone()
    if packing != "lines":
        raise ValueError(f"packing must be 'pack' or 'lines', got {packing!r}.")
    texts = texts if max_examples is None else texts[:max_examples]
    pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    ids = torch.full((len(texts), seq_len), pad, dtype=torch.long)
    labels = torch.full((len(texts), seq_len), -100, dtype=torch.long)
    for i, text in enumerate(texts):
        tokens = encode_as_text(tokenizer, text.strip(), add_special_tokens=True)[:seq_len]
        ids[i, : len(tokens)] = torch.tensor(tokens)
        labels[i, : len(tokens)] = torch.tensor(tokens)
    return ids, labels


def read_text_data(args, tokenizer, world_size: int) -> tuple[dict, str]:
    """Training and held-out examples as (ids, labels) tensors, and one line saying what was kept and held out."""
    train_lines, held_lines, description = training_corpus(args.data, resolve_data_dir(args.data_dir), lines=args.lines)
    if ddist.ranks().is_main:
        logger.info("data: %s", description)  # what was kept, dropped and held out, before any step
    ids, labels = tokenize_examples(train_lines, tokenizer, args.seq_len, args.packing, what="training text")
    held_ids, held_labels = tokenize_examples(held_lines, tokenizer, args.seq_len, args.packing,
                                              max_examples=args.eval_batches * args.batch_size * world_size,
                                              what="held-out text (for a file of your own, its last 5% of lines)")
    return {"ids": ids, "labels": labels, "held_ids": held_ids, "held_labels": held_labels}, description
