# Sourced by the study scripts (study.sh, gemma3.sh, variants.sh): a long study commits its finished runs while it
# runs, so a session that ends part-way loses at most COMMIT_EVERY seconds of results, and the next session resumes.

# The studies run with torch's AVX2 kernels, which every machine of this project has: a run resumed or repeated on
# another machine then gives the same bits (AVX-512 kernels round otherwise from the first step), as a resume and
# compare --fill-missing need. The study's first runs were trained with them.
export ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-avx2}

# commit_runs DIR LABEL [REPORT...]: what DIR holds now, as one commit (nothing new: no commit). Where DIR holds a
# result newer than its report.md (a run's result.json or summary.json, a task's eval.TASK.json), REPORT first
# rewrites the study's report from the runs finished so far (its failure is printed and the results go in all the
# same). Newer than the report, not uncommitted: another study's autocommit may have committed it already. In this
# repository the other studies' results go in too, with the tables of README and docs/results written from them
# (scripts/results_tables.py) in the same commit, so that main never holds results its pages do not show, however a
# session ends. A page with edits of its own not yet committed is left for whoever is editing it; while the tables
# cannot be written, nothing is committed.
commit_runs() {
    local paths=("$1") label=$2 page
    shift 2
    local newer=()
    [ -f "${paths[0]}/report.md" ] && newer=(-newer "${paths[0]}/report.md")
    if [ $# -gt 0 ] && [ -n "$(find "${paths[0]}" "${newer[@]}" -regextype posix-extended \
            -regex '.*/(result|summary|eval\.[^/]*)\.json' -print -quit 2>/dev/null)" ]; then
        "$@" >/dev/null 2>&1 || echo "commit_runs: the interim report ($*) failed; committing the runs without it" >&2
    fi
    if [ -f scripts/results_tables.py ]; then
        [ -d results ] && paths+=(results)
        for page in README.md docs/results/*.md; do
            git ls-files --error-unmatch -- "$page" >/dev/null 2>&1 && git diff --quiet HEAD -- "$page" &&
                paths+=("$page")
        done
        if ! PYTHONPATH=src ${PYTHON:-.venv/bin/python} scripts/results_tables.py >/dev/null 2>&1; then
            echo "commit_runs: scripts/results_tables.py failed, so nothing is committed this time" >&2
            return 0
        fi
    fi
    git add -A -- "${paths[@]}" >/dev/null 2>&1 &&
        git commit -q -m "$label: finished runs so far (autocommit while it runs)" -- "${paths[@]}" >/dev/null 2>&1 || true
}

# while_committing DIR LABEL COMMAND...: runs COMMAND, committing DIR every COMMIT_EVERY seconds and when it
# ends, with the interim report of COMMAND --report-only --quiet (preproj compare and scaling) while it runs;
# returns COMMAND's status.
while_committing() {
    local out=$1 label=$2 status
    shift 2
    ( while sleep "${COMMIT_EVERY:-600}"; do commit_runs "$out" "$label" "$@" --report-only --quiet; done ) &
    watcher=$!
    trap 'kill $watcher 2>/dev/null' EXIT
    "$@"
    status=$?
    kill $watcher 2>/dev/null
    commit_runs "$out" "$label"
    return $status
}
