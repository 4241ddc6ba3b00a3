"""`preproj pretrain --task mnist|moving-mnist|moving-mnist-direction`: the vision side's models (preproj.vision)
trained from scratch with the modules built in, through the same loop as text (precision, devices, processes,
checkpoints, resume). A token is a patch (a tubelet for clips).

- mnist: the image classifier on MNIST's train split (valid for the held-out loss).
- moving-mnist: next-frame prediction on Moving MNIST clips (preproj.images.ClipSet): the first --context frames
  given, the per-pixel loss on the frames that follow.
- moving-mnist-direction: which way the digit of a one-digit clip moves, from the whole clip (order matters).

A plain baseline matched by parameters or FLOPs widens the MLP as text's does (the counts differ from text's only by
terms that do not depend on the MLP width). Validate scores every valid and test example; each test example's loss
(and accuracy, for the classifiers) goes to items.TASK.jsonl, and the same examples with their given tokens shuffled
and the RoPE positions kept in place (the position-shuffle probe: one fixed permutation per example, the same for
every run) to items.TASK_shuffled.jsonl.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from ..core.adapter import load_adapter
from ..data import resolve_data_dir
from ..images import ClipSet, mnist
from ..methods.registry import ADAPTER_SUBDIR
from ..runtime import distributed as ddist
from ..runtime.files import write_json, write_jsonl
from ..runtime.precision import compute_context, resolve_device
from ..runtime.precision import precision as as_precision
from ..vision import ClipShape, ClipTransformer, ImageClassifier, VisionShape
from .args import TrainArgs
from .loop import train
from .scratch import PretrainArgs, Shape, matched_plain, shared_fields, train_flops_per_token

logger = logging.getLogger(__name__)

CLIPS = {"train": 20_000, "valid": 1_000, "test": 1_000}
"""Moving MNIST clips per split (each drawn from that split's digits only)."""
SHUFFLE_SEED = 20151  # the probe's permutations: fixed, so that every run is scored on the same shuffled inputs
DEFAULT_PATCH = {"mnist": 4, "moving-mnist": 8, "moving-mnist-direction": 8}
ATTENTION_ITEMS = 256  # test items the attention probe averages over


@dataclass(frozen=True)
class Split:
    """One split as the loop indexes it: inputs and labels (tensors, or ClipSet views) of equal length."""

    inputs: object
    labels: object

    def __len__(self) -> int:
        return len(self.labels)

    def head(self, n: int) -> Split:
        if isinstance(self.inputs, torch.Tensor):
            return Split(self.inputs[:n], self.labels[:n])
        first = self.inputs.clips.first(n)  # one set under both views: a batch's clips are made once
        return Split(first.view(self.inputs.part), first.view(self.labels.part))


def vision_shape(args: PretrainArgs) -> VisionShape | ClipShape:
    """The task's shape; a matched plain model gets the MLP width that text's rule solves for."""
    patch = args.patch_size or DEFAULT_PATCH[args.task]
    common = dict(patch_size=patch, layers=args.layers, d_model=args.d_model, heads=args.heads,
                  intermediate=args.intermediate_size, position=args.position)
    if args.task == "mnist":
        shape = VisionShape(image_size=28, channels=1, **common)
    else:
        objective = "next-frame" if args.task == "moving-mnist" else "direction"
        shape = ClipShape(objective=objective, frames=args.frames, context=args.context, tubelet=args.tubelet,
                          **common)
    if not args.match:
        return shape
    text = _text_shape(shape)
    return replace(shape, intermediate=matched_plain(text, args.match, args.match_to, shape.tokens).intermediate)


def _text_shape(shape) -> Shape:
    return Shape(shape.layers, shape.d_model, shape.heads, shape.heads, shape.config().intermediate_size, vocab=0)


def train_flops_per_example(shape, method: str) -> int:
    """Training FLOPs of one example: the blocks as text counts them over every token, the patch (tubelet)
    embedding's forward and weight gradient over the given tokens (the pixels need no gradient), and the head."""
    tokens, given = shape.tokens, shape.given_tokens
    blocks = train_flops_per_token(_text_shape(shape), method, tokens) * tokens
    if isinstance(shape, ClipShape):
        pixels = shape.tubelet * shape.patch_size ** 2 * shape.channels
        head = pixels * (tokens - given) if shape.objective == "next-frame" else shape.classes
    else:
        pixels, head = shape.patch_size ** 2 * shape.channels, shape.classes
    return blocks + 2 * 2 * pixels * shape.d_model * given + 3 * 2 * shape.d_model * head


def pretrain_images(args: PretrainArgs, progress: bool = True) -> tuple[dict, nn.Module]:
    """Setup, fit, validate; returns (summary.json's contents, the trained model)."""
    device = resolve_device(args.device)
    args = replace(args, precision=as_precision(args.precision, device).name)
    r = ddist.setup(device)
    out, data_dir = Path(args.out), resolve_data_dir(args.data_dir)

    # --- setup: data, shape, model ---
    shape = vision_shape(args)
    model_type = ImageClassifier if isinstance(shape, VisionShape) else ClipTransformer
    splits = {name: _split(args.task, name, shape, data_dir) for name in ("train", "valid")}
    held = splits["valid"].head(args.eval_batches * args.batch_size * r.world_size)
    data = ({"ids": splits["train"].inputs, "labels": splits["train"].labels, "held_ids": held.inputs,
             "held_labels": held.labels},
            f"{args.task}: {len(splits['train']):,} train examples; the first {len(held):,} of valid for the held-out "
            f"loss, all {len(splits['valid']):,} and test scored at the end")
    torch.manual_seed(args.seed)
    model = model_type(shape).to(as_precision(args.precision).weights)
    tokens = shape.tokens
    counts = {"params": sum(p.numel() for p in model.parameters()),
              "train_flops_per_token": train_flops_per_example(shape, args.method) // tokens}
    if r.is_main:
        logger.info("%s: %s, %s parameters before the method, %s training FLOPs per token", args.method, shape,
                    f"{counts['params']:,}", f"{counts['train_flops_per_token']:,}")

    # --- fit: the text loop, every weight trains; a token is a patch ---
    per_step = args.batch_size * tokens * args.grad_accum * r.world_size
    total = round(args.epochs * len(splits["train"]) * tokens) if args.epochs is not None else args.tokens
    steps = max(1, total // per_step)
    targs = TrainArgs(**{**shared_fields(args, TrainArgs), "model": str(out), "data": args.task, "steps": steps,
                          "seq_len": tokens, "warmup": min(args.warmup, steps - 1), "train_base": True})
    summary, model = train(targs, model=model, progress=progress, data=data)
    if r.world_size > 1 and args.strategy == "fsdp":  # sharded: every process scores the saved model, whole
        ddist.barrier()
        model = load_adapter(model_type.from_pretrained(out).to(device), out / ADAPTER_SUBDIR)
    counts["params"] = sum(p.numel() for p in model.parameters())

    # --- validate: every valid and test example, and the position-shuffle probe on test ---
    test = _split(args.task, "test", shape, data_dir)
    task = args.task.replace("-", "_")
    scores, items = {}, {}
    for name, split, shuffled in (("validation", splits["valid"], False), ("test", test, False),
                                  ("test_shuffled", test, True)):
        loss, correct = score(model, split, args.batch_size, args.precision, device, shuffled)
        scores[name] = {"loss": float(loss.double().mean()), "examples": len(split)}
        if correct is not None:
            scores[name]["accuracy"] = float(correct.double().mean())
        if name != "validation":
            key = task if name == "test" else f"{task}_shuffled"
            items[key] = [{"task": key, "index": i, "loss": float(loss[i]),
                           **({"acc": float(correct[i])} if correct is not None else {})} for i in range(len(loss))]
    attention = attention_by_depth(model, test.head(ATTENTION_ITEMS), args.batch_size, device)
    summary.update({"pretrain": asdict(args), "shape": asdict(shape), **counts, "data": data[1], "scores": scores,
                    "attention": attention,
                    "loss": {k: v["loss"] for k, v in scores.items()},
                    **({"accuracy": {k: v["accuracy"] for k, v in scores.items()}} if correct is not None else {})})
    if r.is_main:
        for key, records in items.items():
            write_jsonl(out / f"items.{key}.jsonl", records)
        write_json(out / "summary.json", summary)
        metric = "accuracy" if correct is not None else "loss"
        logger.info("%s: valid %.4f, test %.4f, test with the given tokens shuffled (positions kept) %.4f", metric,
                    *(scores[k][metric] for k in ("validation", "test", "test_shuffled")))
    ddist.barrier()
    return summary, model


def _split(task: str, split: str, shape, data_dir) -> Split:
    if task == "mnist":
        images, labels = mnist(split, data_dir)
        return Split(torch.from_numpy(images).unsqueeze(1), torch.from_numpy(labels).long())
    if shape.objective == "next-frame":
        clips = ClipSet(split, data_dir, CLIPS[split], frames=shape.frames, context=shape.context)
        return Split(clips.view("context"), clips.view("future"))
    # one digit: with two, "the first digit" would be a label the clip cannot show
    clips = ClipSet(split, data_dir, CLIPS[split], frames=shape.frames, digits=1)
    return Split(clips.view("clip"), clips.view("direction"))


@torch.no_grad()
def score(model: nn.Module, split: Split, batch_size: int, precision: str, device: torch.device,
          shuffled: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(loss, correct) per example (correct None for next-frame, whose loss is the mean over its predicted pixels);
    `shuffled`: each example's given tokens permuted by its own fixed permutation, the RoPE positions kept in place."""
    was = model.training
    model.eval()
    given = model.shape.given_tokens
    losses, correct = [], []
    for start in range(0, len(split), batch_size):
        index = list(range(start, min(start + batch_size, len(split))))
        x, y = split.inputs[index].to(device), split.labels[index].to(device)
        order = torch.stack([_permutation(i, given) for i in index]).to(device) if shuffled else None
        with compute_context(precision, device):
            logits = model(x, order=order, keep_positions=True).float()
        if y.ndim == 1:  # classes
            losses.append(F.cross_entropy(logits, y, reduction="none").cpu())
            correct.append((logits.argmax(-1) == y).cpu())
        else:  # frames: per-pixel binary cross-entropy against value / 255, averaged per clip
            target = (y / 255.0).reshape(logits.shape)
            loss = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
            losses.append(loss.flatten(1).mean(1).cpu())
    model.train(was)
    return torch.cat(losses), torch.cat(correct) if correct else None


def _permutation(index: int, tokens: int) -> torch.Tensor:
    return torch.randperm(tokens, generator=torch.Generator().manual_seed(SHUFFLE_SEED + index))


@torch.no_grad()
def attention_by_depth(model: nn.Module, split: Split, batch_size: int, device: torch.device) -> dict:
    """Where each layer attends, in float32 eager attention over `split`'s items: the mean distance between a query
    and the tokens it attends to (in patches; over (time, row, column) for clips), with the distance attention spread
    evenly would give, and the attention each token position receives (mean over heads, queries and items)."""
    was, implementation = model.training, model.encoder.config._attn_implementation
    model.eval()
    model.encoder.set_attn_implementation("eager")
    layers = model.encoder.transformer.layers
    seen: list[torch.Tensor] = []
    hooks = [getattr(layer.attention, "base_layer", layer.attention).register_forward_hook(
        lambda module, args, out: seen.append(out[1].float().mean(dim=1).sum(dim=0))) for layer in layers]  # (T, T)
    try:
        received = None
        for start in range(0, len(split), batch_size):
            index = list(range(start, min(start + batch_size, len(split))))
            model(split.inputs[index].to(device))
            batch = torch.stack(seen)  # (layers, queries, keys), summed over the batch
            seen.clear()
            received = batch if received is None else received + batch
    finally:
        for hook in hooks:
            hook.remove()
        model.encoder.set_attn_implementation(implementation)
        model.train(was)
    weights = received.cpu() / len(split)  # (layers, T, T), mean over items
    positions = model.positions.cpu().float()
    distance = torch.cdist(positions, positions)  # (T, T)
    return {"distance": [float((w * distance).sum(dim=1).mean()) for w in weights],
            "uniform_distance": float(distance.mean()),
            "received": [[round(float(x), 6) for x in w.mean(dim=0)] for w in weights]}
