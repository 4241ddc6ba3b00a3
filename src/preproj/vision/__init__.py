"""The vision side: transformers with the modules built in, trained from scratch on images (image.py: 2-D RoPE) and
video clips (video.py: tubelets, 3-D RoPE); `preproj pretrain --task mnist|moving-mnist|moving-mnist-direction`
trains them (training/scratch_vision.py)."""

from .image import ImageClassifier, VisionShape
from .video import ClipShape, ClipTransformer

__all__ = ["ClipShape", "ClipTransformer", "ImageClassifier", "VisionShape"]
