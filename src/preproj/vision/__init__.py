"""The vision side: transformers with the modules built in, trained from scratch on images (image.py: 2-D RoPE) and
video clips (video.py: tubelets, 3-D RoPE); `preproj pretrain --task mnist|moving-mnist|moving-mnist-direction`
trains them (training/scratch_vision.py)."""

from pathlib import Path

from ..runtime.loading import directory_model_type
from .image import ImageClassifier, VisionShape
from .video import ClipShape, ClipTransformer

MODELS = (ImageClassifier, ClipTransformer)


def load_vision_run(directory: str | Path):
    """The vision model a `preproj pretrain` directory holds (without its method), or None for any other path."""
    model_type = directory_model_type(directory)
    found = next((m for m in MODELS if m.model_type == model_type), None)
    return None if found is None else found.from_pretrained(directory)


__all__ = ["ClipShape", "ClipTransformer", "ImageClassifier", "VisionShape", "load_vision_run"]
