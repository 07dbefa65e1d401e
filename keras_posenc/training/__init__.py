"""Training aids: the position warm-up callback and auxiliary position tasks."""

from keras_posenc.training import auxiliary, callbacks
from keras_posenc.training.auxiliary import (
    OrderRecovery,
    PositionPrediction,
    PositionTask,
    RelativeDistancePrediction,
    build_pretraining_model,
    pretraining_data,
    task_losses,
)
from keras_posenc.training.callbacks import PositionWarmup, find_generators

__all__ = [
    "OrderRecovery",
    "PositionPrediction",
    "PositionTask",
    "PositionWarmup",
    "RelativeDistancePrediction",
    "auxiliary",
    "build_pretraining_model",
    "callbacks",
    "find_generators",
    "pretraining_data",
    "task_losses",
]
