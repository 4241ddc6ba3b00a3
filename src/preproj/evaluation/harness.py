"""Run lm-evaluation-harness itself on a model that carries an adapter (optional extra: lm-eval).

The adapter sits inside the model's own modules, so the harness's HFLM evaluates it unchanged.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from torch import nn

from ..data import LOCAL_FILES, split_articles


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


YAMLS = {
    "lambada": """task: preproj_lambada
dataset_path: json
dataset_kwargs: {{data_files: {{test: {path}}}}}
output_type: loglikelihood
test_split: test
doc_to_text: "{{{{text.split(' ')[:-1]|join(' ')}}}}"
doc_to_target: "{{{{' '+text.split(' ')[-1]}}}}"
metric_list:
  - {{metric: perplexity, aggregation: perplexity, higher_is_better: false}}
  - {{metric: acc, aggregation: mean, higher_is_better: true}}
""",
    "wikitext": """task: preproj_wikitext
dataset_path: json
dataset_kwargs: {{data_files: {{test: {path}}}}}
output_type: loglikelihood_rolling
test_split: test
doc_to_text: ""
doc_to_target: !function preprocess_wikitext.wikitext_detokenizer
process_results: !function preprocess_wikitext.process_results
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
""",
    "hellaswag": """task: preproj_hellaswag
dataset_path: json
dataset_kwargs: {{data_files: {{validation: {path}}}}}
output_type: multiple_choice
validation_split: validation
process_docs: !function utils.process_docs
doc_to_text: "{{{{query}}}}"
doc_to_target: "{{{{label}}}}"
doc_to_choice: "choices"
metric_list:
  - {{metric: acc, aggregation: mean, higher_is_better: true}}
  - {{metric: acc_norm, aggregation: mean, higher_is_better: true}}
""",
    "arc_easy": """task: preproj_arc_easy
dataset_path: json
dataset_kwargs: {{data_files: {{test: {path}}}}}
output_type: multiple_choice
test_split: test
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{choices.label.index(answerKey)}}}}"
doc_to_choice: "{{{{choices.text}}}}"
metric_list:
  - {{metric: acc, aggregation: mean, higher_is_better: true}}
  - {{metric: acc_norm, aggregation: mean, higher_is_better: true}}
""",
}


def write_local_tasks(root: Path, data: Path, wikitext_docs: int | None = None) -> list[str]:
    """Local copies of lambada_openai, wikitext, hellaswag and arc_easy for the harness, reading `data` (laid out as
    ../shared/data) instead of the Hub: the stock configs with `dataset_path: json`, and the stock helper modules
    copied from the installed lm_eval. Returns the task names (preproj_<task>) to run with include_path=root."""
    import lm_eval

    tasks = Path(lm_eval.__file__).parent / "tasks"
    for task in YAMLS:
        (root / task).mkdir(parents=True, exist_ok=True)
    shutil.copy(tasks / "wikitext" / "preprocess_wikitext.py", root / "wikitext")
    shutil.copy(tasks / "hellaswag" / "utils.py", root / "hellaswag")
    files = {
        "lambada": data / LOCAL_FILES["lambada"],
        "hellaswag": data / LOCAL_FILES["hellaswag"],
        "wikitext": root / "wikitext" / "pages.jsonl",
        "arc_easy": root / "arc_easy" / "arc_easy_test.jsonl",
    }
    with open(files["wikitext"], "w") as f:
        for page in split_articles((data / LOCAL_FILES["wikitext"]).read_text())[:wikitext_docs]:
            f.write(json.dumps({"page": page}) + "\n")
    with open(data / LOCAL_FILES["arc_easy"]) as src, open(files["arc_easy"], "w") as dst:
        for line in src:  # AI2's JSONL -> allenai/ai2_arc's columns
            r = json.loads(line)
            choices = r["question"]["choices"]
            dst.write(json.dumps({"id": r["id"], "question": r["question"]["stem"], "answerKey": r["answerKey"],
                                  "choices": {"text": [c["text"] for c in choices],
                                              "label": [c["label"] for c in choices]}}) + "\n")
    for task, template in YAMLS.items():
        (root / task / f"preproj_{task}.yaml").write_text(template.format(path=json.dumps(str(files[task]))))
    return [f"preproj_{task}" for task in YAMLS]
