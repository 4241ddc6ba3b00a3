"""preproj: position-agnostic pre-projection and content skip for pretrained transformer attention."""

from importlib.metadata import version as _version

__version__ = _version("preproj")

from .core.adapter import AdapterError, load_adapter, save_adapter  # noqa: E402
from .core.attach import attach, detach, skip_norms, trainable_parameters  # noqa: E402
from .core.config import PreProjConfig  # noqa: E402
from .core.families import supported_model_types  # noqa: E402
from .evaluation.runner import evaluate  # noqa: E402
from .runtime.loading import load_model  # noqa: E402
from .standalone import ExportError, export  # noqa: E402

__all__ = [
    "PreProjConfig",
    "attach",
    "detach",
    "save_adapter",
    "load_adapter",
    "skip_norms",
    "load_model",
    "evaluate",
    "export",
    "trainable_parameters",
    "supported_model_types",
    "AdapterError",
    "ExportError",
]
