"""Evaluation: engine (batched log-likelihoods), tasks (items, scoring and metrics under two protocols), runner
(`evaluate`, `preproj eval`) and harness (lm-evaluation-harness itself, on a preproj model)."""

from .engine import LogLikelihood
from .runner import EvalArgs, evaluate, format_results, parse_tasks
from .tasks import PROTOCOLS, TASK_TABLE, Metric, Task, default_tasks, read_items, register_task

__all__ = ["LogLikelihood", "EvalArgs", "evaluate", "format_results", "parse_tasks", "read_items", "TASK_TABLE",
           "Task", "Metric", "default_tasks", "register_task", "PROTOCOLS"]
