#!/usr/bin/env bash
# The CPU study (results/study-cpu): `preproj compare --preset study`, resumed wherever it stopped, its finished runs
# committed as they arrive. Run it again in a later session to go on.
#   PREPROJ_DATA_DIR=../shared/data nohup bash scripts/study.sh > study.log 2>&1 &
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-results/study-cpu}
commit() { git add -A "$out" && git commit -q -m "study: finished runs so far (autocommit while it runs)" -- "$out" >/dev/null 2>&1 || true; }
( while sleep "${COMMIT_EVERY:-600}"; do commit; done ) &
watcher=$!
trap 'kill $watcher 2>/dev/null' EXIT
.venv/bin/preproj compare --preset study --out "$out"
status=$?
commit
exit $status
