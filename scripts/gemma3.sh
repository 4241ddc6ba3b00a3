#!/usr/bin/env bash
# The replication on the second embedded model (results/gemma3-cpu): base, preproj+skip, skip and parameter-matched
# LoRA on Gemma 3 270M at the study preset's budget, every method at the common rate 3e-4, 2 seeds, with the analysis
# declared in results/gemma3-cpu/analysis_plan.json before the runs. Gemma's terms apply (README). Finished runs are
# committed as they arrive; run it again in a later session to go on (every run resumes).
#   PREPROJ_DATA_DIR=../shared/data nohup bash scripts/gemma3.sh > gemma3.log 2>&1 &
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
out=${OUT:-results/gemma3-cpu}
while_committing "$out" gemma3 \
    ${PREPROJ:-.venv/bin/preproj} compare --preset study --model gemma3-270m --methods base,preproj+skip,skip,lora \
    --lr-sweep none --seeds 2 --out "$out"
