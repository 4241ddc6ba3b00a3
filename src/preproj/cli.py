"""The `preproj` command line: one subcommand per job.

One small function per command, then the parser that names them all, read in that order; the module is longer than
the others because the command table is kept in one place rather than spread over files."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import shlex
import signal
import sys
import time
import traceback
from pathlib import Path

from .runtime.files import write_json
from .runtime.validation import BOUNDS


class UsageError(Exception):
    """A command line that does not parse; the message is one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        # One line that names the problem, instead of argparse's usage block followed by the error.
        raise UsageError(f"{self.prog}: error: {message} (see {self.prog} --help)")


def _typed(name: str, kind):
    """An argparse type that converts with `kind` and checks the value against validation.BOUNDS."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
        bound = BOUNDS.get(name)
        if bound is not None and not bound.holds(value):
            raise argparse.ArgumentTypeError(f"must be {bound.describe()}, got {text}")
        return value

    return parse if kind in (int, float) else kind


def _add_dataclass_args(parser: argparse.ArgumentParser, cls, choices: dict | None = None) -> None:
    """One --flag per dataclass field; the help text is the field's docstring (litgpt-style), followed by the
    field's choices where a table holds them (choices: field -> a function listing them, as the table is now)."""
    docs = _field_docs(cls)
    sections = {}  # an argument group's flags under its own heading in --help, as the dataclass groups them
    for f in _own_fields_first(cls):
        group = _declared_by(cls, f)
        if group is cls:
            target = parser
        elif group not in sections:
            target = sections[group] = parser.add_argument_group(group.__doc__.splitlines()[0].rstrip("."))
        else:
            target = sections[group]
        flag = "--" + f.name.replace("_", "-")
        listed = f" One of: {', '.join(choices[f.name]())}." if choices and f.name in choices else ""
        help_text = f"{docs.get(f.name, '')}{listed} (default: {f.default})".replace("%", "%%")
        if f.type in (bool, "bool"):
            action = argparse.BooleanOptionalAction if f.default else "store_true"  # a default of True needs --no-X
            target.add_argument(flag, action=action, default=f.default, help=help_text)
            continue
        if str(f.type) == "bool | None":  # --X, --no-X, or neither: the default decides
            target.add_argument(flag, action=argparse.BooleanOptionalAction, default=None,
                                help=help_text.replace("(default: None)", "(default: auto)"))
            continue
        kind = {"int | None": int, "str | None": str, "float | None": float}.get(str(f.type), type(f.default))
        target.add_argument(flag, type=_typed(f.name, kind), default=f.default, help=help_text)


def _declared_by(cls, f: dataclasses.Field) -> type:
    """The argument group that declares a field (a group's field that the command redeclares stays the group's)."""
    return [k for k in cls.__mro__ if f.name in getattr(k, "__annotations__", {})][-1]


def _own_fields_first(cls) -> list[dataclasses.Field]:
    """The fields in --help's order: the command's own, then each argument group's (dataclasses put a base's first)."""
    return sorted(dataclasses.fields(cls), key=lambda f: cls.__mro__.index(_declared_by(cls, f)))


def _args(ns: argparse.Namespace, cls):
    return cls(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(cls)})


def _field_docs(cls) -> dict[str, str]:
    import ast
    import inspect
    import textwrap

    docs = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):  # a subclass's help wins
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for node, nxt in zip(body, body[1:]):
            if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
                docs[node.target.id] = str(nxt.value.value)
    return docs


def _inspect(ns: argparse.Namespace) -> int:
    from .experiments.inspection import InspectArgs, check_inspect_args, format_report, inspect_model
    from .runtime.loading import load_model
    from .runtime.precision import resolve_device
    from .vision import load_vision_run

    args = _args(ns, InspectArgs)
    check_inspect_args(args)  # a typo in --mode is found before the model loads
    start = time.monotonic()
    print(f"loading {args.model} ...", file=sys.stderr)
    vision = load_vision_run(args.model)
    if vision is not None:
        model, tokenizer = vision.to(resolve_device(args.device)).eval(), None
    else:
        model, tokenizer = load_model(args.model, dtype=args.precision, device=args.device,
                                      trust_remote_code=args.trust_remote_code)
        print(f"measuring (K/V cache at {args.context} tokens, greedy samples) ...", file=sys.stderr)
    report = inspect_model(model, tokenizer, args)
    print(format_report(report))
    if ns.out:
        write_json(ns.out, report)
        print(f"\nwrote {ns.out}")
    kv = report["kv_cache"]
    print(f"\nsummary: {report['added']['total'] / 1e6:.1f}M parameters added "
          f"({report['added']['percent_of_total']:.1f}%)" + (f", K/V cache ratio {kv['ratio']:.3f}" if kv else "")
          + f", {time.monotonic() - start:.0f}s")
    return 0


def _load(model_name: str, adapter: str | None, precision: str = "fp32", device: str = "auto",
          trust_remote_code: bool = False):
    from .evaluation.runner import load_scored
    from .runtime import distributed as ddist
    from .runtime.precision import resolve_device

    ddist.main_prints(ddist.setup(resolve_device(device)))
    return load_scored(model_name, adapter, precision, device, trust_remote_code)


def _eval(ns: argparse.Namespace) -> int:
    from .evaluation.runner import EvalArgs, evaluate, format_results, items_path
    from .runtime import distributed as ddist
    from .runtime.precision import resolve_device

    args = _args(ns, EvalArgs)
    start = time.monotonic()
    ddist.main_prints(ddist.setup(resolve_device(args.device)))
    results = evaluate(args)
    items_out = items_path(args)
    print(format_results(results))
    if args.out:
        print(f"wrote {args.out}" + (f" and {items_out}" if items_out else ""))
    headline = ", ".join(
        f"{task} {key} {m[key]:.4g}" for task, m in results["tasks"].items()
        for key in ("acc_norm" if "acc_norm" in m else "acc", "word_perplexity", "perplexity") if key in m
    )
    print(f"summary: {headline} ({time.monotonic() - start:.0f}s)")
    return 0


def _harness(ns: argparse.Namespace) -> int:
    from .evaluation.harness import run_harness

    start = time.monotonic()
    model, tokenizer = _load(ns.model, ns.adapter, trust_remote_code=ns.trust_remote_code)
    results = run_harness(model, tokenizer, ns.tasks.split(","), limit=ns.limit, batch_size=ns.batch_size,
                          include_path=ns.include_path, num_fewshot=ns.num_fewshot)
    from lm_eval.utils import make_table

    print(make_table(results))
    if ns.out:
        write_json(ns.out, {"model": ns.model, "adapter": ns.adapter, "results": results["results"]})
        print(f"wrote {ns.out}")
    print(f"summary: {len(results['results'])} harness task(s) in {time.monotonic() - start:.0f}s")
    return 0


def _export(ns: argparse.Namespace) -> int:
    from .core.adapter import load_adapter
    from .standalone import export
    from .vision import load_vision_run

    start = time.monotonic()
    vision = load_vision_run(ns.model)
    adapter = ns.adapter
    if adapter is None:
        if not (Path(ns.model) / "adapter").is_dir():
            if vision is not None:
                raise ValueError(f"{ns.model} is a plain vision run (method base): it carries no preproj modules, so "
                                 f"there is nothing to export; preproj.vision's {type(vision).__name__}"
                                 ".from_pretrained loads it.")
            raise ValueError("--adapter is required: the directory written by `preproj train` (for a `preproj "
                             "pretrain` run, give its directory as --model and the adapter inside it is found).")
        adapter = str(Path(ns.model) / "adapter")
    if vision is not None:
        model, tokenizer = load_adapter(vision, adapter), None
    else:
        model, tokenizer = _load(ns.model, adapter, device="cpu")
    run_dir = adapter if (Path(adapter) / "train_config.json").is_file() else ns.model
    out = export(model, ns.out, tokenizer, dtype=ns.dtype, run_dir=run_dir)
    size = sum(f.stat().st_size for f in out.iterdir()) / 2**20
    use = ("" if vision is not None else f", or score it with `preproj eval --model {out} --trust-remote-code`")
    print(f"summary: wrote {out} ({size:.0f} MiB, {ns.dtype}) in {time.monotonic() - start:.0f}s; load it with "
          f"{'AutoModel' if vision is not None else 'AutoModelForCausalLM'}.from_pretrained({str(out)!r}, "
          f"trust_remote_code=True){use}")
    return 0


def _train(ns: argparse.Namespace) -> int:
    from .runtime import distributed as ddist
    from .runtime.precision import resolve_device
    from .training import TrainArgs, train

    args = _args(ns, TrainArgs)
    if args.nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {args.nproc}.")
    if args.nproc > 1:
        return _torchrun(args.nproc, ns.argv)
    ddist.main_prints(ddist.setup(resolve_device(args.device)))
    summary, _ = train(args)
    loss = f"held-out loss {summary['initial_heldout_loss']:.4f} -> {summary['final_heldout_loss']:.4f}"
    audit = (f", bf16 erased {100 * summary['bf16_erased_update_fraction']:.1f}% of updates"
             if "bf16_erased_update_fraction" in summary else "")
    print(f"summary: {args.method}, {summary['trainable_params'] / 1e6:.2f}M trainable, {summary['steps']} steps, "
          f"{summary['tokens_seen']:,} tokens at {summary['tokens_per_second']:.0f} tok/s, {loss}{audit}, "
          f"{_training_time(summary)}; adapter in {args.out}")
    return 0


def _training_time(summary: dict) -> str:
    # A resumed run's process saw only its own part; the log carries the whole (None for logs from before it did).
    if summary.get("train_seconds") is not None:
        spent = f"{summary['train_seconds']:.0f}s of training"
    else:
        spent = f"{summary['wall_seconds']:.0f}s in this process"
    if summary.get("compiled") and "first_step_seconds" in summary:  # the compile is in the first step: say so
        spent += (f" (compiled: first step {summary['first_step_seconds']:.1f}s, then "
                  f"{summary['median_step_seconds']:.2f}s per step)")
    return spent


def _pretrain(ns: argparse.Namespace) -> int:
    from .runtime import distributed as ddist
    from .runtime.precision import resolve_device
    from .training import PretrainArgs, pretrain

    args = _args(ns, PretrainArgs)
    if args.nproc > 1:
        return _torchrun(args.nproc, ns.argv)
    ddist.main_prints(ddist.setup(resolve_device(args.device)))
    summary, _ = pretrain(args)
    for prompt, text in summary.get("samples", {}).items():
        print(f"  {prompt!r} -> {text!r}")
    if args.task == "text":
        scores = ", ".join(f"{k} perplexity {v:.2f}" for k, v in summary["perplexity"].items())
    else:
        metric = "accuracy" if "accuracy" in summary else "loss"
        scores = ", ".join(f"{k.replace('_', ' ')} {metric} {v:.4f}" for k, v in summary[metric].items())
    unit = "tokens" if args.task == "text" else "patches"
    print(f"summary: {args.method} from scratch, {summary['params'] / 1e6:.2f}M parameters, {summary['steps']} steps, "
          f"{summary['tokens_seen']:,} {unit} at {summary['tokens_per_second']:.0f} {unit}/s, {scores}, "
          f"{_training_time(summary)}; model in {args.out}" + (f", adapter in {args.out}/adapter"
                                                                    if args.method != "base" else ""))
    return 0


def _scaling(ns: argparse.Namespace) -> int:
    from .experiments.scaling import ScalingArgs, run_scaling

    args = _args(ns, ScalingArgs)
    results = run_scaling(args)
    print((Path(args.out) / "report.md").read_text())
    what = "report rewritten" if args.report_only else f"in {results['wall_seconds'] / 60:.1f} min"
    print(f"summary: {len(results['sizes'])} size(s), {len(results['comparisons'])} comparison(s), {what}; "
          f"report.md, results.json and plots in {args.out}")
    return 0


def _paired(ns: argparse.Namespace) -> int:
    from .analysis.pairing import correct, describe_entry, item_files, paired_between

    a, b = item_files(ns.a), item_files(ns.b)
    found = paired_between(a, b, ns.protocol, seed_paired=ns.seed_paired)
    if not found:
        raise ValueError(f"{ns.a} and {ns.b} share no task scored on the same items under the {ns.protocol} protocol.")
    entries = [{"method": "B", "reference": "A", **p.to_dict(), "raw_verdict": p.verdict} for p in found]
    correct(entries, {"families": [{"name": "these metrics", "correction": "holm", "members": "all"}]}, found)
    print(f"{ns.b} against {ns.a}: B - A, 95% interval over items"
          + (" and seeds" if any(max(p.seeds) > 1 for p in found) else "")
          + f" ({found[0].test}), p-value Holm-adjusted over the {len(found)} metrics, verdict for B")
    for p, entry in zip(found, entries):
        print(f"  {p.metric:<26} A {p.a:.4f}  B {p.b:.4f}  {describe_entry(entry)}  (seeds {p.seeds[0]}/{p.seeds[1]}, "
              f"{p.items} items)")
    if ns.out:
        write_json(ns.out, {"a": ns.a, "b": ns.b, "protocol": ns.protocol, "paired": entries})
    better = sum(e["verdict"] == "better" for e in entries)
    worse = sum(e["verdict"] == "worse" for e in entries)
    print(f"summary: B better on {better}, worse on {worse}, no detectable difference on {len(found) - better - worse} "
          f"of {len(found)} metrics (Holm-adjusted)")
    return 0


def _torchrun(nproc: int, argv: list[str]) -> int:
    """`preproj train --nproc N ...` is `torchrun --standalone --nproc-per-node N -m preproj train ...`."""
    import subprocess

    rest, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            rest.append(a)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "preproj",
           *rest]
    print("launching: " + " ".join(cmd), file=sys.stderr)
    return subprocess.call(cmd)


class _StdoutHandler(logging.StreamHandler):
    """Library messages to the terminal as plain lines, on whatever sys.stdout is when they are written (under
    torchrun, every process but rank 0 has it silenced)."""

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value):
        pass


def _show_library_messages(ns: argparse.Namespace) -> None:
    """The library logs (module loggers under 'preproj'); the command line shows them: progress lines at INFO,
    only warnings with --quiet, everything with --verbose."""
    root = logging.getLogger("preproj")
    root.handlers = [h for h in root.handlers if not isinstance(h, _StdoutHandler)] + [_StdoutHandler()]
    root.setLevel(logging.WARNING if ns.quiet else logging.DEBUG if ns.verbose else logging.INFO)
    root.propagate = False


# How a stopped run continues: train and pretrain with --resume, compare and scaling resume every run by themselves.
RESUMES_WITH_FLAG = ("train", "pretrain")


def resume_command(command: str, argv: list[str]) -> str:
    """The command line that continues a run stopped by a signal."""
    flag = ["--resume"] if command in RESUMES_WITH_FLAG and "--resume" not in argv else []
    return shlex.join(["preproj", *argv, *flag])


def _version() -> str:
    from .runtime.provenance import preproj_version

    return preproj_version()


def _report_summary(report: str) -> str:
    """The part of compare's report.md a terminal wants: its first table (the methods) and the paper's claims."""
    sections = report.split("\n## ")
    head = sections[0].split("\n\n")
    table = next((block for block in head if block.startswith("| method")), "")
    claims = next((s for s in sections[1:] if s.startswith("The paper's claims")), "")
    claims_table = "\n".join(line for line in claims.splitlines() if line.startswith("|"))
    return "\n\n".join(part for part in (head[0], table, claims_table and "The paper's claims:\n" + claims_table)
                       if part)


def _compare(ns: argparse.Namespace) -> int:
    from .experiments.compare import CompareArgs, run_compare
    from .runtime import distributed as ddist
    from .runtime.precision import resolve_device

    args = _args(ns, CompareArgs)
    r = ddist.setup(resolve_device(args.device))
    ddist.main_prints(r)
    report = run_compare(args)
    if not r.is_main:
        return 0
    print(_report_summary((Path(args.out) / "report.md").read_text()))
    n, seconds = len(report["methods"]), report["wall_seconds"]
    took = f", which took {seconds / 60:.1f} min" if seconds is not None else ""
    if report["pending"]:
        done = f"interim report: {n} methods with finished runs, {len(report['pending'])} run(s) to come"
    elif args.report_only or not report["new_runs"]:
        done = f"{n} methods compared, every run already finished; report rewritten from them{took}"
    else:
        done = f"{n} methods compared in {seconds / 60:.1f} min"
    print(f"summary: {done}; the full report (paired differences, learning rates, what agrees) is "
          f"{Path(args.out) / 'report.md'}; results.json and the plots are beside it")
    return 0


def _study(ns: argparse.Namespace) -> int:
    from .experiments.study import run_study
    from .runtime import distributed as ddist
    from .runtime.precision import resolve_device

    r = ddist.setup(resolve_device(ns.device or "auto"))
    ddist.main_prints(r)
    report = run_study(ns.file, report_only=ns.action == "report", device=ns.device, data_dir=ns.data_dir,
                       compile=ns.compile)
    if not r.is_main:
        return 0
    out = Path(report["out"])
    if "methods" not in report:  # a scaling study: variants from scratch
        print((out / "report.md").read_text())
        print(f"summary: study {ns.file}: {len(report['sizes'])} size(s), {len(report['comparisons'])} comparison(s); "
              f"the report is {out / 'report.md'}, results.json and the plots are beside it")
        return 0
    print(_report_summary((out / "report.md").read_text()))
    for problem in report["older_than_plan"]:
        print(f"warning: not made under this study file as committed: {problem}", file=sys.stderr)
    left = f"{len(report['pending'])} run(s) to come" if report["pending"] else "every run finished"
    print(f"summary: study {ns.file}: {len(report['methods'])} arms, {left}; the report is {out / 'report.md'}, "
          "results.json and the plots are beside it")
    return 0


def _study_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("run", "report"),
                   help="run: train and score what the study still lacks, then report (resumes wherever it stopped); "
                        "report: write the report from the runs finished so far, running nothing.")
    p.add_argument("file", help="The study file (TOML; docs/guide/studies.md).")
    p.add_argument("--device", default=None, help="auto (CUDA when present, else CPU), cpu, cuda, cuda:N or mps.")
    p.add_argument("--data-dir", default=None, help="Directory laid out as ../shared/data; default $PREPROJ_DATA_DIR.")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile each decoder block (default: the study file's, else where faster).")


def _export_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m",
                   help="Embedded name, hub id or local directory of the base (or a `preproj pretrain` directory).")
    p.add_argument("--adapter", default=None,
                   help="The adapter directory written by `preproj train` "
                        "(default: MODEL/adapter, as pretrain writes).")
    p.add_argument("--out", required=True, help="The new model directory to write (must not exist or be empty).")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="Dtype of every exported weight. (default: float32)")


def _paired_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", help="A: items files of `preproj eval --items`, comma-separated, one per seed; or DIR:METHOD "
                             "(every seed of METHOD in a preproj compare directory).")
    p.add_argument("b", help="B: the same forms; B is compared against A.")
    p.add_argument("--protocol", default="harness", choices=("harness", "paper"),
                   help="The protocol both were evaluated under (it picks the metrics). (default: harness)")
    p.add_argument("--seed-paired", action="store_true",
                   help="A and B list the same seeds in the same order (seed i the same data order): compare seed by "
                        "seed. (default: each side's seeds on their own)")
    p.add_argument("--out", default=None, help="Also write the comparisons as JSON to this path.")


def _harness_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", help="Embedded name, hub id or local directory.")
    p.add_argument("--adapter", default=None, help="Directory of a saved adapter to load onto the model.")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="Run the modeling code a model directory carries (a `preproj export` directory).")
    p.add_argument("--tasks", required=True, help="Comma-separated lm-eval task names.")
    p.add_argument("--limit", type=_typed("limit", int), default=None, help="First N items of each task.")
    p.add_argument("--num-fewshot", type=_typed("num_fewshot", int), default=None,
                   help="Few-shot examples (task default if omitted).")
    p.add_argument("--batch-size", type=_typed("batch_size", int), default=8, help="lm-eval batch size.")
    p.add_argument("--include-path", default=None, help="Directory of extra lm-eval task YAMLs.")
    p.add_argument("--out", default=None, help="Write the harness results as JSON to this path.")


def build_parser() -> argparse.ArgumentParser:
    from .evaluation.runner import EvalArgs
    from .experiments.compare import CompareArgs
    from .experiments.inspection import InspectArgs
    from .experiments.scaling import ScalingArgs
    from .methods.registry import trained_methods
    from .training import PretrainArgs, TrainArgs
    from .training.scratch import TASKS, pretrain_methods

    def inspect_flags(p):
        _add_dataclass_args(p, InspectArgs)
        p.add_argument("--out", default=None, help="Also write the report as JSON to this path.")

    # name, help, the flags (an arguments dataclass or a function that adds them), the function that runs it
    commands = (
        ("inspect", "Where the modules sit, parameters added, K/V cache cost, greedy samples.", inspect_flags,
         _inspect),
        ("eval", "LAMBADA, WikiText, HellaSwag, ARC-Easy: harness-exact or paper protocol.", EvalArgs, _eval),
        ("train", "Frozen-probe training of one method (base frozen, only new parameters learn).", TrainArgs, _train),
        ("pretrain", "Train a Llama-architecture model from scratch with the modules built in.", PretrainArgs,
         _pretrain),
        ("scaling", "From scratch: sizes x variants (matched plain baselines) x seeds; paired report.", ScalingArgs,
         _scaling),
        ("compare", "Train and evaluate every method under one budget; report, table and plots.", CompareArgs,
         _compare),
        ("study", "Run, resume or report a study file: arms, seeds, tasks and its analysis plan.", _study_flags,
         _study),
        ("export", "Write an adapted model as a transformers directory that loads without preproj.", _export_flags,
         _export),
        ("paired", "Compare two sets of per-item results after the fact: paired differences.", _paired_flags,
         _paired),
        ("harness", "Run any lm-evaluation-harness task on a (possibly adapted) model (needs lm-eval).",
         _harness_flags, _harness),
    )
    # fields whose values a table holds: --help lists them as the table is now (registered methods included)
    choices = {TrainArgs: {"method": trained_methods},
               PretrainArgs: {"method": pretrain_methods, "task": lambda: TASKS}}
    parser = _Parser(prog="preproj", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"preproj {_version()}")
    talk = argparse.ArgumentParser(add_help=False)  # every command takes --quiet and --verbose
    loudness = talk.add_mutually_exclusive_group()
    loudness.add_argument("--quiet", action="store_true", help="Print warnings, errors and the summary only.")
    loudness.add_argument("--verbose", action="store_true", help="Print debugging messages too.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text, flags, run in commands:
        p = sub.add_parser(name, help=help_text, parents=[talk])
        if dataclasses.is_dataclass(flags):
            _add_dataclass_args(p, flags, choices.get(flags))
        else:
            flags(p)
        p.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; bad input and expected failures print one line and return 2, never a traceback."""
    from .core.adapter import AdapterError
    from .data import DataNotFound
    from .experiments.study import StudyFileError
    from .runtime.files import RunInUse, WriteFailed
    from .runtime.loading import ModelLoadError
    from .training import CheckpointError, TrainingDiverged, TrainingInterrupted

    own_errors = (ModelLoadError, AdapterError, DataNotFound, TrainingDiverged, CheckpointError, RunInUse, WriteFailed,
                  StudyFileError)
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        ns = build_parser().parse_args(argv)
    except UsageError as e:
        print(e, file=sys.stderr)
        return 2
    ns.argv = argv
    _show_library_messages(ns)
    try:
        return ns.run(ns)
    except TrainingInterrupted as e:
        how = "the same command and --resume" if ns.command in RESUMES_WITH_FLAG else "the same command"
        print(f"preproj {ns.command}: {e} Continue with {how}: {resume_command(ns.command, argv)}", file=sys.stderr)
        return 128 + e.signal
    except KeyboardInterrupt:  # a second Ctrl-C (or one outside a training loop): at once, in one line
        print(f"preproj {ns.command}: stopped at once by Ctrl-C; the last good checkpoint is kept (checkpoints and "
              f"results are written under a temporary name and renamed). Continue with: "
              f"{resume_command(ns.command, argv)}", file=sys.stderr)
        return 128 + signal.SIGINT
    except (*own_errors, ValueError) as e:
        print(f"preproj {ns.command}: error: {e}", file=sys.stderr)
        # a plain ValueError may be a bug's as well as bad input: --verbose shows where it came from
        if ns.verbose and not isinstance(e, own_errors):
            traceback.print_exc()
        return 2


if __name__ == "__main__":
    sys.exit(main())
