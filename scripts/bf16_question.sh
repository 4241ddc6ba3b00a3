#!/usr/bin/env bash
# The bf16 question (PAPER.md §5), paired and seeded: preproj+skip at the paper's lr 1e-5 in pure bf16
# (bf16-true) against the same with fp32 master weights (bf16-frozen), three seeds each, held-out loss on
# every WikiText-2 test document, paired over documents and seeds. Resumable: finished steps are skipped and
# --resume continues an interrupted run from its checkpoint (or starts it afresh when it has none).
#   PREPROJ_DATA_DIR=../shared/data bash scripts/bf16_question.sh [OUT]       # about 50 min on 2 CPU cores
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-docs/bf16-question}"
STEPS="${STEPS:-64}"
P=.venv/bin/preproj
for seed in 42 43 44; do
  for precision in bf16-true bf16-frozen; do
    run="$OUT/$precision-seed$seed"
    if [ ! -f "$run/summary.json" ]; then
      "$P" train --method preproj+skip --precision "$precision" --data wikitext2-train --steps "$STEPS" --warmup 4 \
        --lr 1e-5 --seed "$seed" --eval-every "$STEPS" --eval-batches 8 --save-every 16 --out "$run" --resume
    fi
    # One evaluation for both: the base in bf16, the adapter rounded to bf16, as the paper runs it.
    [ -f "$run/eval.items.jsonl" ] || "$P" eval --adapter "$run" --precision bf16-true --tasks wikitext \
      --max-length 2048 --items --out "$run/eval.json"
  done
done
files() { local p=$1; echo "$OUT/$p-seed42/eval.items.jsonl,$OUT/$p-seed43/eval.items.jsonl,$OUT/$p-seed44/eval.items.jsonl"; }
"$P" paired "$(files bf16-true)" "$(files bf16-frozen)" --out "$OUT/paired.json"
