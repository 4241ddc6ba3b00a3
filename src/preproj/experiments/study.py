"""A study as a file: `preproj study run FILE` runs or resumes it, `preproj study report FILE` reports it.

One TOML file names the arms (methods, their learning rate or sweep, seeds, precision, model, budget), the tasks
and the analysis plan (docs/guide/studies.md). Its keys are compare's (CompareArgs) where compare has them, so a
study file is `preproj compare` written down: the file compiles to compare's arguments and a preset of its own, and
compare's one resume rule, one sweep and one plan function run it. What the file adds:

- `seeds` as a list, for a study that must not reuse the seeds an earlier one has seen;
- METHOD@common, both methods at the one rate the sweep finds best for the two together;
- named arms (`[arms.NAME]`): a method at a rate and in precisions of its own, so that one method in two precisions
  is two arms;
- the tasks to score (`[eval] tasks`), where compare scores every default task;
- the analysis plan in the file, written to OUT/analysis_plan.json, where compare reads it;
- `declared = true`: the file must be committed unchanged before a run starts, and every run records the file's
  SHA-256 and the commit that declared it, so that a run older than its plan can be found (runs_older_than_plan).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import subprocess
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..runtime.files import write_json
from ..runtime.provenance import provenance
from ..training import TrainArgs
from .arms import named_arm
from .compare_args import PRESETS, CompareArgs
from .scaling import ScalingArgs, scored

logger = logging.getLogger(__name__)

STUDY_KEYS = {"name": "a short name, used in messages", "about": "what the study asks, one paragraph",
              "declared": "true: the plan was committed before any run; runs refuse to start from a file that is not "
                          "committed unchanged",
              "cpu_capability": "torch's CPU kernels the runs were made with (avx2, avx512, ...): on a CPU the "
                                "study runs only with them, so that a run resumed or retrained elsewhere gives the "
                                "same bits",
              "runner": "compare (methods on a pretrained model, the default) or scaling (variants trained from "
                        "scratch: the keys are then `preproj scaling`'s)"}
TABLES = ("train", "eval", "sweep", "plan", "arms")
EVAL_KEYS = ("protocol", "tasks", "limits", "max_length", "extra_tasks")
SWEEP_KEYS = {"rates": list, "steps": int, "seeds": int, "common": list}
# compare's flags that a pass takes from the command line, not from a file, or that the file spells otherwise
NOT_IN_FILE = ("report_only", "lr_sweep", "sweep_steps", "sweep_seeds", "steps", "limit", "lr")


class StudyFileError(ValueError):
    """A study file that cannot be run as written; the message names the key and what to write instead."""


@dataclass
class Study:
    path: Path
    name: str
    about: str
    declared: bool
    cpu_capability: str | None
    args: CompareArgs | ScalingArgs
    preset: dict | None
    """compare's budget, evaluation, sweep and seeds (None for a scaling study)."""
    plan: dict | None
    sha256: str

    def record(self) -> dict:
        """What every run of the study keeps of it: the file, its hash and the commit that declared it."""
        return {"file": str(self.path), "name": self.name, "sha256": self.sha256, "declared": self.declared,
                **committed(self.path)}


def load_study(path: str | Path, **overrides) -> Study:
    """Read and check a study file; `overrides` are compare's per-pass arguments (device, data_dir, ...)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        spec = tomllib.loads(raw.decode("utf-8"))
    except OSError as e:
        raise StudyFileError(f"cannot read the study file {path}: {e.strerror or e}.") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise StudyFileError(f"{path} is not valid TOML: {e}.") from None
    plan = spec.get("plan")
    if plan is not None and not isinstance(plan, dict):
        raise StudyFileError(f"{path}: plan must be a table ([plan]), got {plan!r}.")
    runner = spec.get("runner", "compare")
    if runner == "scaling":
        return _scaling_study(path, raw, spec, overrides)
    if runner != "compare":
        raise StudyFileError(f"{path}: runner must be compare or scaling, got {runner!r}.")
    fields = {f.name: f for f in dataclasses.fields(CompareArgs)}
    _refuse_unknown(path, spec, sorted(set(STUDY_KEYS) | set(TABLES) | (set(fields) - set(NOT_IN_FILE))),
                    "a study file takes")
    preset_name = spec.get("preset", "cpu")
    if preset_name not in PRESETS:
        raise StudyFileError(f"{path}: preset must be one of {', '.join(PRESETS)}, got {preset_name!r}.")
    base = PRESETS[preset_name]
    preset = {**base, "train": {**base["train"], **_table(spec, "train", path, _train_keys())},
              "eval": {**base["eval"], **_table(spec, "eval", path, EVAL_KEYS)}}
    _check_tasks(path, preset["eval"])
    preset["arms"] = _named_arms(path, spec)
    sweep = _table(spec, "sweep", path, tuple(SWEEP_KEYS))
    for key, kind in SWEEP_KEYS.items():
        if key in sweep and not isinstance(sweep[key], kind):
            raise StudyFileError(f"{path}: sweep.{key} must be a {kind.__name__}, got {sweep[key]!r}.")
    if "rates" in sweep:
        preset["lr_sweep"] = ",".join(f"{float(lr):g}" for lr in sweep["rates"])
    preset.update({k: sweep[v] for k, v in (("sweep_steps", "steps"), ("sweep_seeds", "seeds"),
                                            ("common_rate_of", "common")) if v in sweep})
    compare = {}
    for key, value in spec.items():
        if key in fields:
            listed = key in ("methods", "seeded_methods") and isinstance(value, list)
            compare[key] = ",".join(value) if listed else value
    seeds = compare.pop("seeds", None)
    if seeds is not None:
        if not (isinstance(seeds, int) and seeds > 0
                or isinstance(seeds, list) and seeds and all(isinstance(s, int) and s >= 0 for s in seeds)
                and len(set(seeds)) == len(seeds)):
            raise StudyFileError(f"{path}: seeds must be a count (42, 43, ...) or a list of distinct seeds, got "
                                 f"{seeds!r}.")
        preset["seeds"] = seeds
    for key in ("methods", "seeded_methods", "precision", "eval_precision"):
        if key in compare:
            preset[key] = compare.pop(key)
    compare.update({k: v for k, v in overrides.items() if v is not None})
    try:
        args = CompareArgs(**compare)
    except TypeError as e:
        raise StudyFileError(f"{path}: {e}.") from None
    return _study(path, raw, spec, args, preset)


def _check_tasks(path: Path, eval_cfg: dict) -> None:
    from ..evaluation.tasks import TASK_TABLE

    for key in ("tasks", "extra_tasks"):
        names = eval_cfg.get(key, ())
        if not isinstance(names, list | tuple) or not all(isinstance(t, str) and t in TASK_TABLE for t in names):
            raise StudyFileError(f"{path}: eval.{key} must be a list of tasks from {', '.join(TASK_TABLE)}, got "
                                 f"{names!r}.")
    if "tasks" in eval_cfg and not eval_cfg["tasks"]:
        raise StudyFileError(f"{path}: eval.tasks is empty; name the tasks to score, or leave it out for every "
                             "default task.")


def _named_arms(path: Path, spec: dict) -> dict:
    """The file's [arms.NAME] tables, each checked, and each listed in methods."""
    from ..runtime.precision import AUTO, PRECISIONS

    table = spec.get("arms", {})
    if not isinstance(table, dict):
        raise StudyFileError(f"{path}: arms must be a table of tables ([arms.NAME]), got {table!r}.")
    try:
        arms = {name: named_arm(name, value) for name, value in table.items()}
    except ValueError as e:
        raise StudyFileError(f"{path}: {e}") from None
    listed = spec.get("methods", [])
    for a in arms.values():
        for p in (a.precision, a.eval_precision):
            if p is not None and p != AUTO and p not in PRECISIONS:
                raise StudyFileError(f"{path}: arms.{a.name}: precision must be {AUTO} or one of "
                                     f"{', '.join(PRECISIONS)}, got {p!r}.")
        if a.name not in listed:
            raise StudyFileError(f"{path}: arms.{a.name} is not in methods; list it there, where the arms' order "
                                 "is the runs' order.")
    return arms


def _scaling_study(path: Path, raw: bytes, spec: dict, overrides: dict) -> Study:
    """A study of variants trained from scratch: its keys are ScalingArgs' fields, its plan OUT/analysis_plan.json."""
    fields = {f.name for f in dataclasses.fields(ScalingArgs)} - {"report_only"}
    _refuse_unknown(path, spec, sorted(set(STUDY_KEYS) | {"plan"} | fields), "a scaling study takes")
    values = {k: v for k, v in spec.items() if k in fields}
    for key in ("sizes", "variants", "lrs"):
        if isinstance(values.get(key), list):
            values[key] = ",".join(str(x) for x in values[key])
    values.update({k: v for k, v in overrides.items() if v is not None and k in fields})
    try:
        args = ScalingArgs(**values)
    except TypeError as e:
        raise StudyFileError(f"{path}: {e}.") from None
    return _study(path, raw, spec, args, None)


def _study(path: Path, raw: bytes, spec: dict, args: CompareArgs | ScalingArgs, preset: dict | None) -> Study:
    return Study(path, str(spec.get("name", path.stem)), str(spec.get("about", "")), bool(spec.get("declared", False)),
                 spec.get("cpu_capability"), args, preset, spec.get("plan"), hashlib.sha256(raw).hexdigest())


def _refuse_unknown(path: Path, table: dict, allowed, what: str, where: str = "") -> None:
    """One line naming every key `table` has that `allowed` lacks, and what the file takes there instead."""
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise StudyFileError(f"{path}: unknown key(s) {where}{', '.join(unknown)}; {what} {', '.join(allowed)}"
                             + ("" if where else " (docs/guide/studies.md)") + ".")


def _train_keys() -> tuple[str, ...]:
    run_specific = {"model", "method", "out", "seed", "resume", "precision", "device", "strategy", "report_to",
                    "compile", "data_dir"}
    return tuple(f.name for f in dataclasses.fields(TrainArgs) if f.name not in run_specific)


def _table(spec: dict, name: str, path: Path, keys) -> dict:
    table = spec.get(name, {})
    if not isinstance(table, dict):
        raise StudyFileError(f"{path}: {name} must be a table ([{name}]), got {table!r}.")
    _refuse_unknown(path, table, keys, "it takes", where=f"in [{name}]: ")
    return table


def committed(path: Path) -> dict:
    """The commit that last changed `path` and its time, and whether the file differs from it now; nothing when
    `path` is not in a git checkout."""
    def git(*argv: str) -> str:
        return subprocess.run(["git", "-C", str(path.resolve().parent), *argv], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()

    try:
        line = git("log", "-1", "--format=%H %cI", "--", path.name)
        changed = bool(git("status", "--porcelain", "--", path.name))
    except (OSError, subprocess.SubprocessError):
        return {}
    if not line:
        return {"plan_commit": None, "file_modified": True}
    commit, when = line.split()
    return {"plan_commit": commit, "plan_committed_at": when, "file_modified": changed}


def check_declared(study: Study) -> None:
    """A declared study runs only from its committed file: its runs then name the plan that governs them."""
    if not study.declared:
        return
    record = committed(study.path)
    if not record.get("plan_commit") or record.get("file_modified"):
        raise StudyFileError(f"{study.path} is declared (declared = true) but is "
                             f"{'not committed' if not record.get('plan_commit') else 'modified since its commit'}: "
                             "commit it before its runs start (git add and git commit), or set declared = false for "
                             "an exploratory study.")


def check_kernels(study: Study) -> None:
    """A study that fixes torch's CPU kernels runs on a CPU only with them (the variable must be set before torch
    loads, so the runner can only check it)."""
    import torch

    from ..runtime.precision import resolve_device

    if not study.cpu_capability or resolve_device(study.args.device).type != "cpu":
        return
    found = torch.backends.cpu.get_cpu_capability()
    if found.lower() != study.cpu_capability.lower():
        raise StudyFileError(f"{study.path} runs with torch's {study.cpu_capability} CPU kernels (cpu_capability), "
                             f"and this process has {found}: run it as ATEN_CPU_CAPABILITY={study.cpu_capability} "
                             f"preproj study run {study.path}, so that its runs resume and repeat to the bit.")


def write_plan(study: Study) -> None:
    """The file's [plan] as OUT/analysis_plan.json, where compare reads its plan (with the file it came from)."""
    if study.plan is None:
        return
    plan = {**study.plan, "study_file": str(study.path), "study_sha256": study.sha256}
    path = Path(study.args.out) / "analysis_plan.json"
    if not path.is_file() or json.loads(path.read_text()) != plan:
        write_json(path, plan)


def _finished_runs(study: Study):
    """(run directory relative to OUT, its result) for every finished run: a compare run's result.json, or a scaling
    run's summary.json once scored; both hold the run's provenance."""
    out = Path(study.args.out)
    found = out.glob("*/result.json") if isinstance(study.args, CompareArgs) else out.rglob("summary.json")
    for result in sorted(found):
        run = json.loads(result.read_text())
        if result.name == "summary.json" and not scored(run):  # the run is still being scored
            continue
        yield result.parent.relative_to(out), run


def mixed_code(study: Study, current: dict) -> str | None:
    """A warning where the study's finished runs were made by other code than `current` (provenance's git_commit and
    git_dirty): the runs still to come would mix code versions, and what to run to finish on the runs' own."""
    def version(record: dict) -> tuple[str | None, bool]:
        return record.get("git_commit"), bool(record.get("git_dirty"))

    def shown(commit: str | None, dirty: bool) -> str:
        return f"{commit[:7]}{' (modified)' if dirty else ''}" if commit else "no recorded commit"

    made = Counter(version(run.get("provenance") or {}) for _, run in _finished_runs(study))
    here = version(current)
    others = {v: n for v, n in made.items() if v != here}
    if not others:
        return None
    commit = max(others, key=others.get)[0]
    recipe = (f" To finish on the runs' own version: git worktree add --detach ../study-code {commit[:7]}, then "
              f"PYTHONPATH=../study-code/src python -m preproj study run {study.path}." if commit else "")
    return (f"{sum(others.values())} finished run(s) in {study.args.out} were made by other code ("
            + ", ".join(f"{shown(*v)}: {n}" for v, n in others.items()) + f") than this process runs "
            f"({shown(*here)}), so the runs still to come would mix code versions." + recipe)


def runs_older_than_plan(study: Study) -> list[str]:
    """Runs in OUT that were not made under this file as committed: no record of it, another version of it, or a
    result recorded before the commit that declared it. Empty for a study whose every run followed its plan."""
    record = study.record()
    problems = []
    for where, run in _finished_runs(study):
        made = (run.get("provenance") or {}).get("study") or {}
        if made.get("sha256") != study.sha256:
            problems.append(f"{where}: made under " + (f"another version of {study.path} (sha256 "
                            f"{made['sha256'][:12]})" if made.get("sha256") else "no study file"))
        elif record.get("plan_committed_at") and run["provenance"]["recorded_at"] < _utc(record["plan_committed_at"]):
            problems.append(f"{where}: recorded {run['provenance']['recorded_at']}, before the plan's "
                            f"commit {record['plan_commit'][:7]} ({record['plan_committed_at']})")
    return problems


def _utc(iso: str) -> str:
    """git's committer time (with its offset) as provenance writes times: UTC, 'YYYY-MM-DDTHH:MM:SSZ'."""
    from datetime import UTC, datetime

    return datetime.fromisoformat(iso).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def run_study(path: str | Path, *, report_only: bool = False, progress: bool = True, **overrides) -> dict:
    """Run or resume the study in `path` (or only write its report), through compare."""
    from .compare import run_compare

    study = load_study(path, **overrides)
    if not report_only:
        check_declared(study)
        check_kernels(study)
        write_plan(study)
        warning = mixed_code(study, provenance())
        if warning:
            logger.warning(f"[study] {warning}")
    args = dataclasses.replace(study.args, report_only=report_only)
    if isinstance(args, ScalingArgs):
        from .scaling import run_scaling

        results = run_scaling(args, progress, study=study.record() if study.declared else None)
        return {**results, "older_than_plan": runs_older_than_plan(study) if study.declared else [], "out": args.out}
    report = run_compare(args, progress, preset=study.preset, study=study.record())
    report["older_than_plan"] = runs_older_than_plan(study) if study.declared else []
    report["out"] = args.out  # where this pass wrote (results.json's args say where the runs were made)
    return report
