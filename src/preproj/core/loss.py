"""Next-token cross-entropy without the (B, T, vocab) logits tensor.

`model(input_ids, labels=labels).loss` materialises fp32 logits for every position (SmolLM2: 49,152
per token, 200 MB per 1,024 tokens), then a log-softmax, a zero-filled gradient of the same size and
its backward. On CPU that was a fifth of a frozen-probe training step. Here the LM head and the loss
run together over chunks of rows, and the gradient with respect to the hidden states is computed in
the forward pass while each chunk's logits are still in cache (the idea of Liger's fused linear
cross-entropy, in plain torch). The loss is the one transformers computes: mean over the targets
that are not -100, logits in the compute dtype upcast to fp32.
"""

from __future__ import annotations

import torch
from torch import nn

from .families import supported_model_types

CHUNK_ROWS = 256  # positions per chunk: (256, 49152) fp32 logits are 50 MB


def body_and_head(model: nn.Module) -> tuple[nn.Module, nn.Linear] | None:
    """(the decoder body ending in its final norm, the LM head) for families whose logits are just
    head(body(x)); None for anything else, whose own forward must then be used."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT wrapper
    body, head = getattr(base, "base_model", base), base.get_output_embeddings()
    # logits = head(body(x)) exactly: a linear head without bias, and no logit soft-capping (Gemma-2)
    plain = (isinstance(head, nn.Linear) and head.bias is None
             and getattr(base.config, "final_logit_softcapping", None) is None)
    if base.config.model_type in supported_model_types() and body is not base and plain:
        return body, head
    return None


def softmax_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, scale: float, want_grad: bool):
    """(sum of CE over the rows, d(scale * that sum)/d logits in the logits' dtype or None) for one chunk of logits
    (n, V); the softmax in float32, as transformers upcasts the logits. The in-place ops keep it to one float32 copy
    of the chunk. Compiling it buys little: the loss spends its time in its two matmuls."""
    dtype = logits.dtype
    logits = logits.float()  # (n, V)
    rows = torch.arange(len(targets), device=targets.device)
    target_logits = logits[rows, targets]  # (n,)
    top = logits.amax(dim=-1, keepdim=True)  # (n, 1)
    exp = logits.sub_(top).exp_()  # (n, V), in place: one exp pass serves loss and gradient
    sum_exp = exp.sum(dim=-1)  # (n,)
    total = (top.squeeze(1) + sum_exp.log() - target_logits).sum()
    if not want_grad:
        return total, None
    probs = exp.mul_((scale / sum_exp)[:, None])  # d loss / d logits = scale * (softmax - one_hot)
    probs[rows, targets] -= scale
    return total, probs.to(dtype)  # cast as autocast would


class LinearCrossEntropy(torch.autograd.Function):
    """sum_i scale * CE(hidden_i @ weight.T, target_i), with d/d hidden computed chunk by chunk in forward."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, scale: float) -> torch.Tensor:
        # hidden (N, d), weight (V, d), targets (N,) without ignored positions
        device = hidden.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
        want_grad = ctx.needs_input_grad[0]
        if ctx.needs_input_grad[1]:
            raise ValueError("LinearCrossEntropy does not train the LM head; freeze it or use the model's own loss.")
        with torch.autocast(device, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            total = torch.zeros((), dtype=torch.float32, device=hidden.device)
            grad = torch.empty_like(h) if want_grad else None  # (N, d)
            for s in range(0, h.shape[0], CHUNK_ROWS):
                rows = slice(s, s + CHUNK_ROWS)
                loss, dlogits = softmax_cross_entropy(h[rows] @ w.T, targets[rows], scale, want_grad)  # (n, V) logits
                total += loss
                if want_grad:
                    grad[rows] = dlogits @ w
        ctx.save_for_backward(grad.to(hidden.dtype) if want_grad else None)
        return total * scale

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (grad,) = ctx.saved_tensors
        return grad * grad_output.to(grad.dtype), None, None, None


def causal_lm_loss(model: nn.Module, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """What `model(input_ids=..., labels=...).loss` returns (labels shifted inside; -100 ignored)."""
    targets = labels[:, 1:].reshape(-1)  # (B*(T-1),)
    keep = targets != -100
    n = int(keep.sum())
    if n == 0:
        raise ValueError("Every label after the first position is -100: there is nothing to compute a loss on.")
    parts = body_and_head(model)
    if parts is None or parts[1].weight.requires_grad:  # unknown family, or a head that trains
        return model(input_ids=input_ids, labels=labels, use_cache=False).loss
    body, head = parts
    # No K/V cache (here and above): a training forward never reads one, and filling it costs copies and, compiled,
    # a recompile per layer and step, as each layer's cache slot is guarded on.
    hidden = body(input_ids=input_ids, use_cache=False).last_hidden_state[:, :-1]  # (B, T-1, d)
    hidden = hidden.reshape(-1, hidden.shape[-1])[keep]  # (n, d)
    return LinearCrossEntropy.apply(hidden, head.weight, targets[keep], 1.0 / n)
