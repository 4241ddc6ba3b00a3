#!/usr/bin/env bash
# The from-scratch study of the block changes (results/variants-cpu, docs/guide/variants.md): the content skip
# against gated attention, the value residual and a pre-attention MLP, each at its own swept rate, with the
# analysis declared in results/variants-cpu/analysis_plan.json before the runs. Every run resumes: run it again in
# a later session to go on. It commits nothing: whoever runs it commits results/variants-cpu when they choose
# (scripts/pack_results.py first). Torch's AVX2 kernels, which every machine of this project has, so that a run
# resumed on another machine gives the same bits.
#   PREPROJ_DATA_DIR=../shared/data nohup bash scripts/variants.sh > variants.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/.."
export ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-avx2}
${PREPROJ:-.venv/bin/preproj} scaling --out "${OUT:-results/variants-cpu}" --sizes 4x128 --seeds 3 --tokens 4000000 \
    --precision bf16-mixed --variants preproj+skip,base@params,skip,preproj,gate,value-residual,pre-mlp,preproj+skip+gate \
    --lrs 1e-3,3e-3,1e-2 --sweep-tokens 1000000
