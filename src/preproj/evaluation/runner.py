"""`preproj eval`: the tasks under one protocol, their metrics as JSON, one record per item for paired comparisons."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from .. import data
from ..core.adapter import describe_adapter, load_adapter
from ..core.compiling import compiled_blocks, wants_compile
from ..methods.lora import merged_lora
from ..runtime import distributed as ddist
from ..runtime.files import write_json, write_jsonl
from ..runtime.loading import load_model, model_max_length, trained_weights_digest
from ..runtime.precision import check_weights_dtype, resolve_device
from ..runtime.precision import precision as as_precision
from ..runtime.provenance import provenance
from ..runtime.validation import check_args, check_value, check_within_context
from .engine import LogLikelihood
from .tasks import PAPER_LIMIT, PROTOCOLS, TASK_TABLE, default_tasks, run_task

logger = logging.getLogger(__name__)


@dataclass
class EvalArgs:
    """Arguments of `preproj eval`."""

    model: str = "smollm2-135m"
    """Embedded name, Hugging Face hub id or local directory."""
    adapter: str | None = None
    """Directory of a saved adapter to load onto the model (None: the base model)."""
    trust_remote_code: bool = False
    """Run the modeling code a model directory carries (a `preproj export` directory, or a hub model with its own
    code); without it such a model is refused, naming the files."""
    tasks: str = ",".join(default_tasks())
    """Comma-separated tasks of the task table (evaluation/tasks/): lambada, hellaswag, arc_easy, wikitext by default;
    wikitext_file (WikiText-2 test in the training text's format) and hellaswag_full (llama.cpp's 10,042 items)."""
    protocol: str = "harness"
    """'harness' (lm-evaluation-harness 0.4.x definitions) or 'paper' (docs/method.md: the frozen probe)."""
    limit: int | None = None
    """Take the first N items of each task (the paper protocol defaults to 500)."""
    data_dir: str | None = None
    """Directory laid out as ../shared/data; default $PREPROJ_DATA_DIR, else the Hugging Face Hub."""
    max_length: int | None = None
    """Longest window scored at once (harness: the model's context length; rolling WikiText windows use it)."""
    batch_tokens: int = 1024
    """Token budget of one forward batch (padded length x rows); small batches stay in cache on CPUs."""
    merge_lora: bool = True
    """Merge a LoRA adapter into the base weights before scoring (the same model up to rounding, at the base's cost;
    an unmerged rank-r LoRA adds two matmuls per projection). preproj's own modules never merge."""
    precision: str = "fp32"
    """fp32, bf16-mixed (bf16 autocast; faster on CPUs with avx512_bf16 and on GPUs, not bit-comparable with the
    harness), bf16-true (bf16 weights) or bf16-frozen (bf16 base, fp32 adapter)."""
    compile: bool | None = None
    """torch.compile each decoder block for scoring (inductor; shapes vary by batch, so it compiles a few times).
    Default: on a GPU or in bf16 on a CPU; fp32 scoring stays eager, so its numbers stay bit-comparable."""
    device: str = "auto"
    """auto (CUDA when present, else CPU), cpu, cuda, cuda:N or mps. Under torchrun the items are split across
    processes and gathered: the JSON is the one a single process writes."""
    out: str | None = None
    """Write the results as JSON to this path."""
    items: bool = False
    """Also write one record per item (log-likelihoods, correctness, token and byte counts) to OUT's name with
    .items.jsonl, so that any two runs on the same items can be compared pairwise later."""


def parse_tasks(tasks: str | list[str]) -> list[str]:
    names = [t.strip() for t in (tasks.split(",") if isinstance(tasks, str) else tasks) if t.strip()]
    unknown = [t for t in names if t not in TASK_TABLE]
    if unknown or not names:
        raise ValueError(f"Unknown task(s) {unknown}; choose from {', '.join(TASK_TABLE)}.")
    return names


def load_scored(model: str, adapter: str | None = None, precision: str = "fp32", device: str = "auto",
                trust_remote_code: bool = False):
    """(model, tokenizer): the base in the precision's dtype on the device, with the adapter loaded onto it (a PeftModel
    for the LoRA baselines)."""
    p, device = as_precision(precision), resolve_device(device)
    ddist.setup(device)
    logger.info("loading %s%s (%s, %s) ...", model, f" + adapter {adapter}" if adapter else "", p.name, device)
    base, tokenizer = load_model(model, dtype=p.weights, device=device, trust_remote_code=trust_remote_code)
    return (load_adapter(base, adapter, dtype=p.adapter) if adapter else base), tokenizer


def items_path(args: EvalArgs) -> str | None:
    """Where `--items` writes the per-item records: OUT's name with .items.jsonl."""
    return str(Path(args.out).with_suffix("")) + ".items.jsonl" if args.items and args.out else None


def evaluate_args(args: EvalArgs, progress: bool = True) -> dict:
    """`preproj eval`: load the model (and adapter) that `args` name and score them (`evaluate(EvalArgs(...))`). With
    `args.out`, a stopped evaluation resumes at the batch it was in when it is scoring the same weights."""
    check_args(args)
    parse_tasks(args.tasks)  # a typo fails before anything loads
    if args.items and not args.out:
        raise ValueError("--items writes next to --out; give --out too.")
    model, tokenizer = load_scored(args.model, args.adapter, args.precision, args.device, args.trust_remote_code)
    journal, key = None, ""
    if args.out:
        journal = args.out + ".journal"
        key = json.dumps([args.model, args.adapter, args.merge_lora, trained_weights_digest(model)])
    return evaluate(model, tokenizer, args.tasks, protocol=args.protocol, limit=args.limit, data_dir=args.data_dir,
                    max_length=args.max_length, batch_tokens=args.batch_tokens, precision=args.precision,
                    progress=progress, model_name=args.model, adapter=args.adapter, out=args.out,
                    items_out=items_path(args), journal=journal, journal_key=key, compile=args.compile,
                    merge_lora=args.merge_lora)


def evaluate(model: nn.Module | EvalArgs, tokenizer=None, tasks: str | list[str] | None = None, *,
             protocol: str = "harness",
             limit: int | None = None, data_dir: str | Path | None = None, max_length: int | None = None,
             batch_tokens: int = 1024, precision: str = "fp32", progress: bool = True,
             model_name: str | None = None, adapter: str | None = None, out: str | Path | None = None,
             items_out: str | Path | None = None, journal: str | Path | None = None, journal_key: str = "",
             compile: bool | None = None, merge_lora: bool = True) -> dict:
    """Evaluate `model` (adapted or not) and return the results dict that `preproj eval` writes. Given an EvalArgs
    instead of a model, load what it names and score it as `preproj eval` does (evaluate_args).

    With `out`, the JSON is rewritten (atomically) after every task, so a long run that is stopped
    keeps what it finished. With `items_out`, a JSON Lines file gets one record per item of every task
    (its log-likelihoods, correctness, token and byte counts), for paired comparisons later. With `journal`, every
    scored batch is kept in that file until the evaluation returns, so one stopped part-way and called again with
    the same `journal_key` (what the scores depend on: the weights, the settings) resumes at the batch it was in.
    `compile`: torch.compile each decoder block while scoring (None: where faster, see core.compiling.wants_compile);
    the model is eager again afterwards. `merge_lora`: score a PEFT LoRA merged into its base weights, as `preproj
    eval` does (the base's cost; the same function up to rounding), and give the model back unmerged, its weights
    exactly as they were."""
    if isinstance(model, EvalArgs):
        return evaluate_args(model, progress)
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}.")
    names = parse_tasks(default_tasks() if tasks is None else tasks)
    for name, value in (("limit", limit), ("max_length", max_length), ("batch_tokens", batch_tokens)):
        check_value(name, value)
    check_within_context("max_length", max_length, model_max_length(model, tokenizer))
    check_weights_dtype(model, precision)
    data_dir = data.resolve_data_dir(data_dir)
    score = LogLikelihood(model, tokenizer, max_length=max_length, batch_tokens=batch_tokens, precision=precision,
                          progress=progress, journal=journal, journal_key=journal_key)
    report = {
        "model": model_name or getattr(model.config, "_name_or_path", None),
        "adapter": adapter or describe_adapter(model),
        "protocol": protocol,
        "tasks": {},
        "limit": limit if protocol == "harness" or limit is not None else PAPER_LIMIT,
        "max_length": score.max_length,
        "precision": precision,
        "seconds": {},
        "notes": [],
        "provenance": provenance(),
    }
    was_training = model.training
    model.eval()
    records = []
    if items_out:
        report["items_file"] = str(items_out)
    device = next(model.parameters()).device
    compiled = wants_compile(compile, device, bf16=as_precision(precision).uses_bf16)
    report["compiled"] = compiled
    try:
        with merged_lora(model) if merge_lora else contextlib.nullcontext(), compiled_blocks(model, compiled, device):
            for task in names:
                start = time.monotonic()
                items = []
                report["tasks"][task] = run_task(score, task, protocol, limit, data_dir, items, report["notes"])
                records += [{"task": task, **item} for item in items]
                report["seconds"][task] = round(time.monotonic() - start, 2)
                if ddist.ranks().is_main:
                    if items_out:
                        write_jsonl(items_out, records)
                    if out:
                        write_json(out, report)
    finally:
        model.train(was_training)
    if journal:
        score.journal_path().unlink(missing_ok=True)
    return report


def format_results(r: dict) -> str:
    lines = [f"{r['model']}" + (f" + adapter {r['adapter']}" if r["adapter"] else "") + f"  (protocol {r['protocol']})",
             f"{'task':<15} {'metric':<17} {'value':>10} {'± stderr':>10} {'n':>6}"]
    for task, m in r["tasks"].items():
        for key, value in m.items():
            if key in ("n", "tokens", "skipped_over_512_tokens") or key.endswith("_stderr"):
                continue
            se = m.get(key + "_stderr")
            lines.append(f"{task:<15} {key:<17} {value:>10.4f} {('' if se is None else f'{se:.4f}'):>10} {m['n']:>6}")
    lines += [f"note: {n}" for n in r["notes"]]
    return "\n".join(lines)
