"""Run lm-evaluation-harness itself on a model that carries an adapter (optional extra: lm-eval).

The adapter sits inside the model's own modules, so the harness's HFLM evaluates it unchanged.
"""

from __future__ import annotations

import json
import shutil
from importlib import resources
from pathlib import Path

from torch import nn

from .tasks import TASK_TABLE


def harness_lm(model: nn.Module, tokenizer, batch_size: int = 8, max_length: int | None = None):
    try:
        from lm_eval.models.huggingface import HFLM
    except ImportError:
        raise ImportError("`preproj harness` needs lm-evaluation-harness: pip install 'preproj[harness]' "
                          "(lm-eval).") from None
    kwargs = {"max_length": max_length} if max_length else {}
    return HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, **kwargs)


def run_harness(model: nn.Module, tokenizer, tasks: list[str], *, limit: int | None = None, batch_size: int = 8,
                include_path: str | None = None, num_fewshot: int | None = None, max_length: int | None = None) -> dict:
    """lm_eval.simple_evaluate on `model` (adapted or not); returns the harness's results dict."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    lm = harness_lm(model, tokenizer, batch_size=batch_size, max_length=max_length)
    manager = TaskManager(include_path=include_path) if include_path else TaskManager()
    return lm_eval.simple_evaluate(model=lm, tasks=tasks, limit=limit, num_fewshot=num_fewshot, task_manager=manager,
                                   bootstrap_iters=0, log_samples=False)


def harness_tasks() -> list[str]:
    """The tasks with a local copy for the harness: those whose declaration has one (and a harness.yaml in their
    folder), in the task table's order."""
    return [name for name, t in TASK_TABLE.items() if t.harness]


def harness_yaml(task: str) -> str:
    """The task's lm-evaluation-harness config (its declaration's, else evaluation/tasks/<task>/harness.yaml), {path}
    still in it."""
    config = TASK_TABLE[task].harness.config
    if config is not None:
        return config
    return resources.files(f"{__package__}.tasks.{task}").joinpath("harness.yaml").read_text(encoding="utf-8")


def write_local_tasks(root: Path, data: Path, limits: dict[str, int] | None = None) -> list[str]:
    """Local copies of every task that declares one (lambada_openai, wikitext, hellaswag and arc_easy) for the
    harness, reading `data` (laid out as ../shared/data) instead of the Hub: the stock configs with
    `dataset_path: json`, and the stock helper modules copied from the installed lm_eval. `limits`: task -> the items
    kept in a data file written here (WikiText's pages). Returns the task names (preproj_<task>) to run with
    include_path=root."""
    import lm_eval

    stock = Path(lm_eval.__file__).parent / "tasks"
    names = harness_tasks()
    for name in names:
        copy, folder = TASK_TABLE[name].harness, root / name
        folder.mkdir(parents=True, exist_ok=True)
        for helper in copy.helpers:
            shutil.copy(stock / helper, folder)
        path = copy.data_file(folder, data, (limits or {}).get(name))
        (folder / f"preproj_{name}.yaml").write_text(harness_yaml(name).replace("{path}", json.dumps(str(path))))
    return [f"preproj_{name}" for name in names]
