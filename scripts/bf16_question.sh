#!/usr/bin/env bash
# The bf16 question (docs/method.md: what the paper leaves open), paired and seeded: preproj+skip at the paper's lr 1e-5 in pure bf16
# (bf16-true) against the same with fp32 master weights (bf16-frozen), three seeds each, scored by the
# paper's own perplexity (`--protocol paper`: the author's rows of raw WikiText-2 valid, in the format of the
# tokenized training text), paired over rows and seeds. Not the harness's detokenized test text: there the
# study found that what this training learns is mostly the training text's format, which that text hides
# (results/wikitext-shift). Nothing is selected on the valid rows; the rate is the paper's. Resumable: finished
# steps are skipped and --resume continues an interrupted run from its checkpoint (or starts it afresh).
#   PREPROJ_DATA_DIR=../shared/data bash scripts/bf16_question.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-results/bf16-question}"
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
      --protocol paper --items --out "$run/eval.json"
  done
done
# The base, evaluated the same way, says whether each precision learned anything the paper's metric sees.
[ -f "$OUT/base/eval.items.jsonl" ] || "$P" eval --precision bf16-true --tasks wikitext --protocol paper --items \
  --out "$OUT/base/eval.json"
files() { local p=$1; echo "$OUT/$p-seed42/eval.items.jsonl,$OUT/$p-seed43/eval.items.jsonl,$OUT/$p-seed44/eval.items.jsonl"; }
for precision in bf16-true bf16-frozen; do
  "$P" paired "$OUT/base/eval.items.jsonl" "$(files $precision)" --protocol paper --out "$OUT/paired-$precision-vs-base.json"
done
"$P" paired "$(files bf16-true)" "$(files bf16-frozen)" --protocol paper --out "$OUT/paired.json"
