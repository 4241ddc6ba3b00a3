#!/usr/bin/env bash
# The bf16-frozen check (issue 52, part 3; declared in results/bf16-frozen-check/plan.json before the runs): preproj+skip
# trained once with bf16-mixed and once with bf16-frozen on the study preset's budget, both adapters scored in fp32 on
# the float32 base, paired over items, both eager (--no-compile: only the precision differs). Resumable: finished
# steps and scored tasks are skipped (each task is its own evaluation), an interrupted run continues.
#   PREPROJ_DATA_DIR=../shared/data bash scripts/bf16_frozen_check.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-results/bf16-frozen-check}"
P=${PREPROJ:-.venv/bin/preproj}
TASKS="lambada hellaswag arc_easy wikitext wikitext_file"
for precision in bf16-mixed bf16-frozen; do
  run="$OUT/$precision-seed42"
  [ -f "$run/summary.json" ] || "$P" train --method preproj+skip --precision "$precision" --data wikitext2-train \
    --packing pack --seq-len 256 --batch-size 4 --steps 256 --lr 3e-4 --warmup 16 --seed 42 --eval-every 64 \
    --eval-batches 8 --save-every 32 --no-compile --out "$run" --resume
  for task in $TASKS; do
    [ -f "$run/eval.$task.items.jsonl" ] || "$P" eval --adapter "$run" --precision fp32 --no-compile \
      --tasks "$task" --max-length 2048 --items --out "$run/eval.$task.json"
  done
  (cd "$run" && cat $(for task in $TASKS; do echo "eval.$task.items.jsonl"; done) > eval.items.jsonl)
done
"$P" paired "$OUT/bf16-mixed-seed42/eval.items.jsonl" "$OUT/bf16-frozen-seed42/eval.items.jsonl" \
  --out "$OUT/paired.json"
# the declared decision: every task's interval inside its margin (decision.json)
"${PYTHON:-.venv/bin/python}" scripts/equivalence.py "$OUT/plan.json" "$OUT/paired.json"
