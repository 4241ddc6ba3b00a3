#!/usr/bin/env bash
# The replication on the second embedded model (results/gemma3-cpu): base, preproj+skip, skip and parameter-matched
# LoRA on Gemma 3 270M at the study preset's budget, each trained method at the rate its own sweep chooses on the
# held-out text, 3 seeds (the study preset's count; 2 until the plan's second amendment), plus preproj+skip and skip
# at 3e-4 (the rate first declared, one seed), with the analysis declared in results/gemma3-cpu/analysis_plan.json
# before the runs (amended twice, each time before the runs it changed; the plan says why). Gemma's terms apply
# (README). Finished runs are committed as they arrive; run it again in a later session to go on (every run and
# sweep point resumes).
#   PREPROJ_DATA_DIR=../shared/data nohup bash scripts/gemma3.sh > gemma3.log 2>&1 &
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
out=${OUT:-results/gemma3-cpu}
while_committing "$out" gemma3 \
    ${PREPROJ:-.venv/bin/preproj} compare --preset study --model gemma3-270m \
    --methods base,preproj+skip,skip,lora,preproj+skip@3e-4,skip@3e-4 --seeded-methods preproj+skip,skip,lora \
    --lr-sweep 1e-5,3e-5,1e-4,3e-4 --seeds 3 --out "$out"
