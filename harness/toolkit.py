"""The plug-in API: what a method outside this repository imports besides the contract (harness/method.py), kept
at one stable name; each part lives in the module of its concern (harness/optim.py, evaluation.py, split.py)."""

from __future__ import annotations

from harness.evaluation import evaluate_classifier
from harness.optim import clip_coefficient, clip_gradients, make_optimizer, make_sgd, squared_grad_norm
from harness.split import uniform_split

__all__ = ["clip_coefficient", "clip_gradients", "evaluate_classifier", "make_optimizer", "make_sgd",
           "squared_grad_norm", "uniform_split"]
