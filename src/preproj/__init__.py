"""preproj: position-agnostic pre-projection and content skip for pretrained transformer attention."""

from .runtime.provenance import preproj_version as _preproj_version

__version__ = _preproj_version()

from .analysis.stats import benjamini_hochberg, holm, paired_difference  # noqa: E402
from .core.adapter import AdapterError, load_adapter, save_adapter  # noqa: E402
from .core.attach import attach, detach, skip_norms, trainable_parameters  # noqa: E402
from .core.config import PreProjConfig  # noqa: E402
from .core.families import supported_model_types  # noqa: E402
from .data import DataNotFound  # noqa: E402
from .evaluation.runner import EvalArgs, evaluate  # noqa: E402
from .evaluation.tasks import HarnessCopy, Metric, Task, register_task  # noqa: E402
from .methods.registry import Method, register_method  # noqa: E402
from .runtime.files import RunInUse, WriteFailed  # noqa: E402
from .runtime.loading import ModelLoadError, load_model  # noqa: E402
from .standalone import ExportError, export  # noqa: E402
from .training import (  # noqa: E402
    CheckpointError,
    PretrainArgs,
    TrainArgs,
    TrainingDiverged,
    TrainingInterrupted,
    pretrain,
    train,
)

# What docs/api.md documents, in its order (tests/test_docs.py holds them equal).
__all__ = [
    "PreProjConfig",
    "attach",
    "detach",
    "skip_norms",
    "trainable_parameters",
    "save_adapter",
    "load_adapter",
    "load_model",
    "EvalArgs",
    "evaluate",
    "export",
    "supported_model_types",
    "TrainArgs",
    "train",
    "PretrainArgs",
    "pretrain",
    "Task",
    "Metric",
    "HarnessCopy",
    "register_task",
    "Method",
    "register_method",
    "paired_difference",
    "holm",
    "benjamini_hochberg",
    "AdapterError",
    "ExportError",
    "ModelLoadError",
    "DataNotFound",
    "CheckpointError",
    "TrainingDiverged",
    "TrainingInterrupted",
    "RunInUse",
    "WriteFailed",
]
