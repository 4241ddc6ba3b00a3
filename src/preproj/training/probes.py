"""What a model trained from scratch is measured by once it is trained: the loss over every full window of a text,
the attention each layer puts on a window's first token (the "attention sink") against the level of attention
spread evenly, and greedy samples."""

from __future__ import annotations

import torch
from torch import nn

from ..runtime.precision import compute_context
from .windows import tokenize_examples

SAMPLE_PROMPTS = ("The", "In 1990 ,", "He said that")


@torch.no_grad()
def lm_loss(model: nn.Module, tokenizer, lines: list[str], seq_len: int, batch_size: int, precision: str,
            device: torch.device) -> dict:
    """Mean loss per predicted token over every full window of the text (packed as in training)."""
    ids, _ = tokenize_examples(lines, tokenizer, seq_len)
    was = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(ids), batch_size):
        x = ids[i : i + batch_size].to(device)
        with compute_context(precision, device):
            loss = model(input_ids=x, labels=x).loss
        n = x.shape[0] * (seq_len - 1)
        total, count = total + float(loss) * n, count + n
    model.train(was)
    return {"loss": total / count, "tokens": count}


@torch.no_grad()
def first_token_attention(model: nn.Module, tokenizer, lines: list[str], seq_len: int, batch_size: int,
                          device: torch.device, windows: int = 32) -> list[float]:
    """Per layer, the attention probability that queries put on the first token of their window (the "attention
    sink"), averaged over heads, every query but the first (which can attend nowhere else) and the first `windows`
    full windows of the held-out text. Eager attention, which hands back its probabilities, for this pass only."""
    ids, _ = tokenize_examples(lines, tokenizer, seq_len)
    ids = ids[:windows]
    implementation, was = model.config._attn_implementation, model.training
    model.set_attn_implementation("eager")
    model.eval()
    try:
        total = None
        for i in range(0, len(ids), batch_size):
            attentions = model(input_ids=ids[i : i + batch_size].to(device), output_attentions=True).attentions
            batch = torch.stack([a[:, :, 1:, 0].float().sum() for a in attentions])
            total = batch if total is None else total + batch
    finally:
        model.set_attn_implementation(implementation)
        model.train(was)
    heads = model.config.num_attention_heads
    return [float(x) / (len(ids) * heads * (seq_len - 1)) for x in total] if total is not None else []


def uniform_first_token_attention(seq_len: int) -> float:
    """The first-token attention of a model that attends evenly: query q (0-based) sees q + 1 tokens, and the probe
    averages queries 1..seq_len-1, so (H_seq_len - 1) / (seq_len - 1). The line a sink is measured against."""
    return sum(1 / (q + 1) for q in range(1, seq_len)) / (seq_len - 1)


@torch.no_grad()
def greedy_samples(model: nn.Module, tokenizer, new_tokens: int) -> dict[str, str]:
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    samples = {}
    for prompt in SAMPLE_PROMPTS:
        ids = torch.tensor([tokenizer.encode(prompt)], device=device)
        room = model.config.max_position_embeddings - ids.shape[1]  # positions beyond the context were never trained
        out = model.generate(ids, max_new_tokens=max(0, min(new_tokens, room)), do_sample=False,
                             pad_token_id=tokenizer.eos_token_id)
        samples[prompt] = tokenizer.decode(out[0, ids.shape[1]:])
    model.train(was)
    return samples
