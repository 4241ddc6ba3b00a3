"""Run lm-evaluation-harness itself on a model that carries an adapter (optional extra: lm-eval).

The adapter sits inside the model's own modules, so the harness's HFLM evaluates it unchanged.
"""

from __future__ import annotations

import json
import shutil
from importlib import resources
from pathlib import Path

from torch import nn

from ..data import WIKITEXT_TEST
from .tasks.arc_easy import reader as arc_easy
from .tasks.hellaswag import reader as hellaswag
from .tasks.lambada import reader as lambada
from .tasks.wikitext.reader import split_articles


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


# The tasks with a local copy for the harness, in the order they are written; each folder under tasks/ holds its
# config as harness.yaml, with {path} where the data file's path goes.
HARNESS_TASKS = ("lambada", "wikitext", "hellaswag", "arc_easy")


def harness_yaml(task: str) -> str:
    """The task's lm-evaluation-harness config (evaluation/tasks/<task>/harness.yaml), {path} still in it."""
    return resources.files(f"{__package__}.tasks.{task}").joinpath("harness.yaml").read_text(encoding="utf-8")


def write_local_tasks(root: Path, data: Path, wikitext_docs: int | None = None) -> list[str]:
    """Local copies of lambada_openai, wikitext, hellaswag and arc_easy for the harness, reading `data` (laid out as
    ../shared/data) instead of the Hub: the stock configs with `dataset_path: json`, and the stock helper modules
    copied from the installed lm_eval. Returns the task names (preproj_<task>) to run with include_path=root."""
    import lm_eval

    tasks = Path(lm_eval.__file__).parent / "tasks"
    for task in HARNESS_TASKS:
        (root / task).mkdir(parents=True, exist_ok=True)
    shutil.copy(tasks / "wikitext" / "preprocess_wikitext.py", root / "wikitext")
    shutil.copy(tasks / "hellaswag" / "utils.py", root / "hellaswag")
    files = {
        "lambada": data / lambada.TEST.file,
        "hellaswag": data / hellaswag.VALIDATION.file,
        "wikitext": root / "wikitext" / "pages.jsonl",
        "arc_easy": root / "arc_easy" / "arc_easy_test.jsonl",
    }
    with open(files["wikitext"], "w") as f:
        for page in split_articles((data / WIKITEXT_TEST.file).read_text())[:wikitext_docs]:
            f.write(json.dumps({"page": page}) + "\n")
    with open(data / arc_easy.TEST.file) as src, open(files["arc_easy"], "w") as dst:
        for line in src:  # AI2's JSONL -> allenai/ai2_arc's columns
            r = json.loads(line)
            choices = r["question"]["choices"]
            dst.write(json.dumps({"id": r["id"], "question": r["question"]["stem"], "answerKey": r["answerKey"],
                                  "choices": {"text": [c["text"] for c in choices],
                                              "label": [c["label"] for c in choices]}}) + "\n")
    for task in HARNESS_TASKS:
        (root / task / f"preproj_{task}.yaml").write_text(harness_yaml(task).replace("{path}",
                                                                                      json.dumps(str(files[task]))))
    return [f"preproj_{task}" for task in HARNESS_TASKS]
