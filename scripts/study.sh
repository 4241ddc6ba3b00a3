#!/usr/bin/env bash
# The CPU study (results/study-cpu): `preproj compare --preset study`, resumed wherever it stopped, its finished runs
# committed as they arrive. Run it again in a later session to go on; extra arguments go to compare (--fill-missing).
#   PREPROJ_DATA_DIR=../shared/data nohup bash scripts/study.sh > study.log 2>&1 &
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
out=${OUT:-results/study-cpu}
while_committing "$out" study ${PREPROJ:-.venv/bin/preproj} compare --preset study --out "$out" "$@"
