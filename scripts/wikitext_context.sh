#!/usr/bin/env bash
# Why did the study's preproj+skip raise WikiText-2 test perplexity while its held-out loss on raw valid fell?
# It trained on 256-token sequences and is scored in 2048-token windows. This scores the base and the study's
# preproj+skip runs on every WikiText-2 test document in 256-token windows, paired over documents (and seeds),
# to set beside the study's own 2048-token comparison. Resumable: finished evaluations are skipped.
#   PREPROJ_DATA_DIR=../shared/data bash scripts/wikitext_context.sh [STUDY] [OUT]   # about 25 min per run on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."
STUDY="${1:-docs/study-cpu}"
OUT="${2:-docs/wikitext-context}"
SEEDS="${SEEDS:-42}"
P=.venv/bin/preproj
score() {  # score NAME [--adapter DIR]
  local name=$1; shift
  [ -f "$OUT/$name.items.jsonl" ] || "$P" eval "$@" --precision fp32 --tasks wikitext --max-length 256 --items \
    --out "$OUT/$name.json"
}
score base
adapters=()
for seed in $SEEDS; do
  score "preproj+skip-seed$seed" --adapter "$STUDY/preproj+skip-seed$seed"
  adapters+=("$OUT/preproj+skip-seed$seed.items.jsonl")
done
"$P" paired "$OUT/base.items.jsonl" "$(IFS=,; echo "${adapters[*]}")" --out "$OUT/paired-256.json"
