#!/usr/bin/env bash
# Sensitivity of the study's LoRA baseline to its learning rate: LoRA exactly as in docs/study-cpu
# (matched rank, 256 steps of 4 x 256 tokens of WikiText-2 train, fp32, seed 42) at 3e-4 instead of the
# sweep's 1e-3, scored on WikiText-2 test as the study scores it and paired with the study's three LoRA
# seeds. Resumable.  PREPROJ_DATA_DIR=../shared/data bash docs/lora-3e-4/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=docs/lora-3e-4
P=.venv/bin/preproj
run=$OUT/lora-lr3e-4-seed42
[ -f "$run/summary.json" ] || "$P" train --method lora --data wikitext2-train --steps 256 --batch-size 4 --seq-len 256 \
  --warmup 16 --lr 3e-4 --seed 42 --precision fp32 --eval-every 64 --eval-batches 8 --save-every 32 --out "$run" --resume
[ -f "$run/eval.items.jsonl" ] || "$P" eval --adapter "$run" --precision fp32 --tasks wikitext --items --out "$run/eval.json"
study=docs/study-cpu
seeds() { echo "$study/$1-seed42/items.wikitext.jsonl,$study/$1-seed43/items.wikitext.jsonl,$study/$1-seed44/items.wikitext.jsonl"; }
# `preproj paired A B` reports B - A.
"$P" paired "$(seeds lora)" "$run/eval.items.jsonl" --out "$OUT/lora-3e-4-minus-lora-1e-3.json"
"$P" paired "$study/base-seed42/items.wikitext.jsonl" "$run/eval.items.jsonl" --out "$OUT/lora-3e-4-minus-base.json"
"$P" paired "$run/eval.items.jsonl" "$(seeds preproj+skip)" --out "$OUT/preproj+skip-minus-lora-3e-4.json"
