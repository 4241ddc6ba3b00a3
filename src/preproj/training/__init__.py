"""Training: the frozen probe (`preproj train`) and from scratch (`preproj pretrain`).

args (TrainArgs), schedule (learning rate, data order, optimizer), strategy (one process, DDP, FSDP2),
checkpointer, signals (a clean stop), audit (the bf16 question), loop (setup, fit, validate, finish),
scratch (models trained from random initialisation) and probes (what those are measured by once trained).
"""

from .args import RESUME_MAY_CHANGE, TrainArgs
from .checkpointer import CheckpointError
from .loop import TrainingDiverged, train
from .schedule import lr_at, make_optimizer
from .scratch import PretrainArgs, pretrain
from .signals import TrainingInterrupted

__all__ = ["TrainArgs", "RESUME_MAY_CHANGE", "train", "TrainingDiverged", "TrainingInterrupted", "CheckpointError",
           "lr_at", "make_optimizer", "PretrainArgs", "pretrain"]
