#!/usr/bin/env bash
# The from-scratch study of the block changes (results/variants-cpu, docs/guide/variants.md): the content skip
# against gated attention, the value residual and a pre-attention MLP, each at its own swept rate, with the
# analysis declared in results/variants-cpu/analysis_plan.json before the runs. Finished runs are committed as
# they arrive; run it again in a later session to go on (every run resumes).
#   PREPROJ_DATA_DIR=../shared/data nohup bash scripts/variants.sh > variants.log 2>&1 &
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
out=${OUT:-results/variants-cpu}
while_committing "$out" variants \
    ${PREPROJ:-.venv/bin/preproj} scaling --out "$out" --sizes 4x128 --seeds 3 --tokens 4000000 --precision bf16-mixed \
    --variants preproj+skip,base@params,skip,preproj,gate,value-residual,pre-mlp,preproj+skip+gate \
    --lrs 1e-3,3e-3,1e-2 --sweep-tokens 1000000
