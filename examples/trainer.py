"""Train pre-projection + content skip with transformers.Trainer, through PEFT, and save the adapter.

    PREPROJ_DATA_DIR=../shared/data python examples/trainer.py --steps 20 --out runs/trainer

(the embedded SmolLM2 on WikiText-2 train; --data-dir instead of PREPROJ_DATA_DIR works too).

The model is an ordinary PeftModel: Trainer trains only the adapter, and `save_pretrained` writes it alone
(adapter_config.json + adapter_model.safetensors), which `preproj.load_adapter`, `preproj eval --adapter`
and `PeftModel.from_pretrained` all read.
"""

from __future__ import annotations

import argparse

import torch
from peft import get_peft_model
from transformers import Trainer, TrainingArguments

from preproj.data import DataNotFound, resolve_data_dir, training_corpus
from preproj.peft import PreProjPeftConfig
from preproj.training.windows import tokenize_examples


class Windows(torch.utils.data.Dataset):
    """Packed token windows as the dicts Trainer hands to the model (the model shifts labels itself)."""

    def __init__(self, ids: torch.Tensor):
        self.ids = ids  # (N, seq_len)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def train(model, tokenizer, texts: list[str], out: str, *, steps: int = 20, seq_len: int = 256, batch_size: int = 4,
          lr: float = 3e-4, config: PreProjPeftConfig | None = None) -> Trainer:
    """Wrap `model` with a preproj adapter, train it with Trainer for `steps` steps, save the adapter to `out`."""
    model = get_peft_model(model, config or PreProjPeftConfig())
    model.print_trainable_parameters()
    ids, _ = tokenize_examples(texts, tokenizer, seq_len, max_examples=steps * batch_size)
    args = TrainingArguments(
        output_dir=out, max_steps=steps, per_device_train_batch_size=batch_size, learning_rate=lr,
        lr_scheduler_type="cosine", warmup_steps=min(10, steps // 5), logging_steps=max(1, steps // 10),
        save_strategy="no", report_to=[], bf16=torch.cuda.is_available(), seed=42,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Windows(ids))
    trainer.train()
    # PeftModel.save_pretrained writes the adapter's two files (and a model card); Trainer.save_model would add
    # training_args.bin, a pickle, which a shared adapter should not carry.
    model.save_pretrained(out)
    return trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="Embedded name, hub id or local directory.")
    parser.add_argument("--steps", type=int, default=20, help="Optimizer steps.")
    parser.add_argument("--out", default="runs/trainer", help="Where the adapter is written.")
    parser.add_argument("--data-dir", default=None,
                        help="Directory laid out as ../shared/data; default $PREPROJ_DATA_DIR.")
    a = parser.parse_args()

    from preproj import load_model

    try:  # the data first: a missing directory is found before the model loads
        texts, _, description = training_corpus("wikitext2-train", resolve_data_dir(a.data_dir))
    except DataNotFound as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    model, tokenizer = load_model(a.model)
    print(f"training on {description}")
    trainer = train(model, tokenizer, texts, a.out, steps=a.steps)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} over {a.steps} steps; adapter in {a.out}")


if __name__ == "__main__":
    main()
