"""preproj: position-agnostic pre-projection and content skip for pretrained transformer attention."""

__version__ = "0.1.0"

from .adapter import AdapterError, load_adapter, save_adapter  # noqa: E402
from .attach import attach, detach, skip_norms, trainable_parameters  # noqa: E402
from .config import PreProjConfig  # noqa: E402
from .evaluation import evaluate  # noqa: E402
from .families import supported_model_types  # noqa: E402
from .loading import load_model  # noqa: E402

__all__ = [
    "PreProjConfig",
    "attach",
    "detach",
    "save_adapter",
    "load_adapter",
    "skip_norms",
    "load_model",
    "evaluate",
    "trainable_parameters",
    "supported_model_types",
    "AdapterError",
]
