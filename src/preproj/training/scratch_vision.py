"""`preproj pretrain --task mnist`: the vision classifier (preproj.vision) trained from scratch with the modules built
in, through the same loop as text (precision, devices, processes, checkpoints, resume).

Setup reads MNIST's train split (valid for the held-out loss) and builds the shape; a plain baseline matched by
parameters or FLOPs widens the MLP as text's does (the counts differ from text's only by terms that do not depend on
the MLP width). Validate scores every valid and test image; each test image's loss and accuracy go to
items.mnist.jsonl, and the same images with their patches shuffled and the RoPE positions kept in place (the
position-shuffle probe: one fixed permutation per image, the same for every run) to items.mnist_shuffled.jsonl.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, replace
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from ..core.adapter import load_adapter
from ..data import resolve_data_dir
from ..images import mnist
from ..methods.registry import ADAPTER_SUBDIR
from ..runtime import distributed as ddist
from ..runtime.files import write_json, write_jsonl
from ..runtime.precision import compute_context, resolve_device
from ..runtime.precision import precision as as_precision
from ..vision import ImageClassifier, VisionShape
from .args import TrainArgs
from .loop import train
from .scratch import PretrainArgs, Shape, matched_plain, shared_fields, train_flops_per_token

logger = logging.getLogger(__name__)

SHUFFLE_SEED = 20151  # the probe's permutations: fixed, so that every run is scored on the same shuffled images


def vision_shape(args: PretrainArgs) -> VisionShape:
    """The shape; a matched plain model gets the MLP width that text's rule solves for (in the counts, the vision
    model differs from a text model without a vocabulary by the patch embedding and the head, the same for both)."""
    shape = VisionShape(image_size=28, patch_size=args.patch_size, channels=1, layers=args.layers,
                        d_model=args.d_model, heads=args.heads, intermediate=args.intermediate_size)
    if not args.match:
        return shape
    text = _text_shape(shape)
    return replace(shape, intermediate=matched_plain(text, args.match, args.match_to, shape.grid ** 2).intermediate)


def _text_shape(shape: VisionShape) -> Shape:
    return Shape(shape.layers, shape.d_model, shape.heads, shape.heads, shape.config().intermediate_size, vocab=0)


def pretrain_images(args: PretrainArgs, progress: bool = True) -> tuple[dict, nn.Module]:
    """Setup, fit, validate; returns (summary.json's contents, the trained model)."""
    device = resolve_device(args.device)
    args = replace(args, precision=as_precision(args.precision, device).name)
    r = ddist.setup(device)
    out, data_dir = Path(args.out), resolve_data_dir(args.data_dir)

    # --- setup: images, shape, model ---
    shape = vision_shape(args)
    patches = shape.grid ** 2
    train_images, train_labels = _as_tensors(*mnist("train", data_dir))
    valid_images, valid_labels = _as_tensors(*mnist("valid", data_dir))
    held = args.eval_batches * args.batch_size * r.world_size
    data = ({"ids": train_images, "labels": train_labels, "held_ids": valid_images[:held],
             "held_labels": valid_labels[:held]},
            f"MNIST: {len(train_images):,} train images; the first {min(held, len(valid_images)):,} of valid for the "
            f"held-out loss, all {len(valid_images):,} scored at the end; test scored at the end")
    torch.manual_seed(args.seed)
    model = ImageClassifier(shape).to(as_precision(args.precision).weights)
    counts = {"params": sum(p.numel() for p in model.parameters()),
              "train_flops_per_token": _flops_per_patch(shape, args.method, patches)}
    if r.is_main:
        logger.info("%s: %s, %s parameters before the method, %s training FLOPs per patch", args.method, shape,
                    f"{counts['params']:,}", f"{counts['train_flops_per_token']:,}")

    # --- fit: the text loop, every weight trains; a token is a patch ---
    per_step = args.batch_size * patches * args.grad_accum * r.world_size
    total = round(args.epochs * len(train_images) * patches) if args.epochs is not None else args.tokens
    steps = max(1, total // per_step)
    targs = TrainArgs(**{**shared_fields(args, TrainArgs), "model": str(out), "data": args.task, "steps": steps,
                          "seq_len": patches, "warmup": min(args.warmup, steps - 1), "train_base": True})
    summary, model = train(targs, model=model, progress=progress, data=data)
    if r.world_size > 1 and args.strategy == "fsdp":  # sharded: every process scores the saved model, whole
        ddist.barrier()
        model = load_adapter(ImageClassifier.from_pretrained(out).to(device), out / ADAPTER_SUBDIR)
    counts["params"] = sum(p.numel() for p in model.parameters())

    # --- validate: every valid and test image, and the position-shuffle probe on test ---
    test_images, test_labels = _as_tensors(*mnist("test", data_dir))
    scores, items = {}, {}
    for name, images, labels, shuffled in (("validation", valid_images, valid_labels, False),
                                           ("test", test_images, test_labels, False),
                                           ("test_shuffled", test_images, test_labels, True)):
        loss, correct = score_images(model, images, labels, args.batch_size, args.precision, device, shuffled)
        scores[name] = {"loss": float(loss.double().mean()), "accuracy": float(correct.double().mean()),
                        "images": len(labels)}
        if name != "validation":
            task = "mnist" if name == "test" else "mnist_shuffled"
            items[task] = [{"task": task, "index": i, "label": int(y), "loss": float(l_), "acc": float(c)}
                           for i, (y, l_, c) in enumerate(zip(labels, loss, correct, strict=True))]
    summary.update({"pretrain": asdict(args), "shape": asdict(shape), **counts, "data": data[1], "scores": scores,
                    "loss": {k: v["loss"] for k, v in scores.items()},
                    "accuracy": {k: v["accuracy"] for k, v in scores.items()}})
    if r.is_main:
        for task, records in items.items():
            write_jsonl(out / f"items.{task}.jsonl", records)
        write_json(out / "summary.json", summary)
        logger.info("accuracy: valid %.4f, test %.4f, test with patches shuffled (positions kept) %.4f",
                    *(scores[k]["accuracy"] for k in ("validation", "test", "test_shuffled")))
    ddist.barrier()
    return summary, model


def _as_tensors(images, labels) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 (N, 1, 28, 28) images (the model reads value / 255) and int64 labels."""
    return torch.from_numpy(images).unsqueeze(1), torch.from_numpy(labels).long()


def _flops_per_patch(shape: VisionShape, method: str, patches: int) -> int:
    """Training FLOPs per patch: the blocks as text counts them, plus the patch embedding (forward and its weight's
    gradient: the pixels need none) and the head's share."""
    blocks = train_flops_per_token(_text_shape(shape), method, patches)
    embed = 2 * 2 * shape.patch_size ** 2 * shape.channels * shape.d_model
    return blocks + embed + 3 * 2 * shape.d_model * shape.classes // patches


@torch.no_grad()
def score_images(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, batch_size: int, precision: str,
                 device: torch.device, shuffled: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, correct) per image; `shuffled`: each image's patches permuted by its own fixed permutation, the RoPE
    positions kept in place."""
    was = model.training
    model.eval()
    patches = model.shape.grid ** 2
    losses, correct = [], []
    for start in range(0, len(images), batch_size):
        x, y = images[start:start + batch_size].to(device), labels[start:start + batch_size].to(device)
        with compute_context(precision, device):
            order = torch.stack([_permutation(start + i, patches) for i in range(len(x))]).to(device) if shuffled \
                else None
            logits = model(x, order=order, keep_positions=True)
        losses.append(F.cross_entropy(logits.float(), y, reduction="none").cpu())
        correct.append((logits.argmax(-1) == y).cpu())
    model.train(was)
    return torch.cat(losses), torch.cat(correct)


def _permutation(index: int, patches: int) -> torch.Tensor:
    return torch.randperm(patches, generator=torch.Generator().manual_seed(SHUFFLE_SEED + index))
