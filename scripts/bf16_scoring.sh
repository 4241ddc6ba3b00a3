#!/usr/bin/env bash
# bf16 scoring against fp32 on the full local sets (issue 52, part 4; declared in results/bf16-scoring/plan.json):
# the embedded base scored with --precision bf16-mixed, paired item by item with the study's fp32 base run.
# Resumable: a stopped evaluation continues at the batch it was in.
#   PREPROJ_DATA_DIR=../shared/data bash scripts/bf16_scoring.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-results/bf16-scoring}"
P=${PREPROJ:-.venv/bin/preproj}
[ -f "$OUT/base-bf16.items.jsonl" ] || "$P" eval --precision bf16-mixed \
  --tasks lambada,hellaswag,arc_easy,wikitext,wikitext_file --max-length 2048 --items --out "$OUT/base-bf16.json"
"$P" paired results/study-cpu:base "$OUT/base-bf16.items.jsonl" --out "$OUT/paired.json"
