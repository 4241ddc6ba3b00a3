"""`preproj eval` time over lm-evaluation-harness HFLM time, same model, tasks, items and dtype, one run.

    python benchmarks/eval_vs_harness.py [--model smollm2-135m] [--out benchmarks/results/eval_vs_harness.json]

Both score the same local data (preproj.harness.write_local_tasks); the order alternates so neither
always runs on a warmer machine. The ratio is what counts: these machines are noisy.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from preproj import load_model
from preproj.adapter import write_json
from preproj.data import resolve_data_dir
from preproj.evaluation import evaluate
from preproj.harness import run_harness, write_local_tasks

LIMITS = {"lambada": 200, "hellaswag": 50, "arc_easy": 100, "wikitext": 3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--harness-batch-size", type=int, default=16)
    parser.add_argument("--out", default="benchmarks/results/eval_vs_harness.json")
    args = parser.parse_args()

    data = resolve_data_dir(args.data_dir)
    if data is None:
        raise SystemExit("Set --data-dir or PREPROJ_DATA_DIR to ../shared/data.")
    model, tokenizer = load_model(args.model)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        write_local_tasks(Path(tmp), data, wikitext_docs=LIMITS["wikitext"])
        for k, (task, limit) in enumerate(LIMITS.items()):
            def ours(task=task, limit=limit):
                return evaluate(model, tokenizer, [task], limit=limit, data_dir=data, progress=False)["tasks"][task]

            def harness(task=task, limit=limit):
                return run_harness(model, tokenizer, [f"preproj_{task}"], limit=limit, batch_size=args.harness_batch_size,
                                   include_path=tmp)["results"][f"preproj_{task}"]

            timed = {}
            for name, fn in ((("ours", ours), ("harness", harness)) if k % 2 == 0 else (("harness", harness), ("ours", ours))):
                start = time.perf_counter()
                result = fn()
                timed[name] = (time.perf_counter() - start, result)
            rows.append({"task": task, "limit": limit, "preproj_s": timed["ours"][0], "harness_s": timed["harness"][0],
                         "ratio": timed["ours"][0] / timed["harness"][0]})
            print(f"{task:<10} n={limit:<4} preproj {rows[-1]['preproj_s']:7.1f}s  harness {rows[-1]['harness_s']:7.1f}s  "
                  f"ratio {rows[-1]['ratio']:.2f}", flush=True)
    total = sum(r["preproj_s"] for r in rows) / sum(r["harness_s"] for r in rows)
    print(f"summary: preproj eval / harness HFLM (batch {args.harness_batch_size}) time = {total:.2f} over all four tasks")
    write_json(args.out, {"model": args.model, "harness_batch_size": args.harness_batch_size, "rows": rows,
                          "total_ratio": total})


if __name__ == "__main__":
    main()
