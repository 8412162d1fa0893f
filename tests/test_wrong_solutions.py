"""Plausible wrong solutions that once earned full marks now fail the graded check that states their rule.

A second, independent student's solutions (written from the lessons alone) showed
where a graded check let wrong code through. Each test here runs that check on the
reference code (it passes) and on the reference with the one wrong function or
method swapped in (it must fail, saying what it expected and what it got).
The checks are called directly with a ``student`` namespace, as the grader's
fixture would pass them, so each test takes well under a second.
"""
from __future__ import annotations

import importlib.util
import math
import types
from pathlib import Path

import numpy as np
import pytest

import tinytrain.training as training
from tinytrain.autograd import no_grad

ROOT = Path(__file__).resolve().parents[1]


def _graded(name: str) -> types.ModuleType:
    """``tests/graded/test_<name>.py`` as a module (not collected a second time: a private name)."""
    spec = importlib.util.spec_from_file_location(f"_graded_{name}", ROOT / "tests" / "graded" / f"test_{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _student(module: types.ModuleType, **replaced: object) -> types.SimpleNamespace:
    """The package's code of ``module`` as the ``student`` fixture, with ``replaced`` names swapped in."""
    return types.SimpleNamespace(**{**vars(module), **replaced})


def _fails(check, student, *expected: str) -> None:
    with pytest.raises(AssertionError) as failure:
        check(student)
    for text in expected:
        assert text in str(failure.value), str(failure.value)


# -- Module 09 ----------------------------------------------------------------------------------

def clip_grad_norm_writing_float64_back(parameters, max_norm=1.0, error_if_nonfinite=False):
    """Casts every gradient to float64 once and reuses the copies to scale: right values, float64 gradients."""
    grads = [p.grad for p in parameters if p.grad is not None]
    wide = [grad.data.astype(np.float64) for grad in grads]
    norm = math.sqrt(sum(float((w * w).sum()) for w in wide))
    if not math.isfinite(norm):
        if error_if_nonfinite:
            raise FloatingPointError(f"the global gradient norm is {norm}")
        return norm
    if norm > max_norm:
        for grad, w in zip(grads, wide):
            grad.data = w * (max_norm / (norm + 1e-6))
    return norm


def test_clipping_keeps_the_gradients_dtype() -> None:
    graded = _graded("09_training")
    graded.test_clip_grad_norm(_student(training))
    _fails(graded.test_clip_grad_norm, _student(training, clip_grad_norm=clip_grad_norm_writing_float64_back),
           "expected dtype float32, got float64")


class AccuracyForLabelsOnly(training.Trainer):
    """evaluate() whose accuracy knows integer labels only: one-hot targets give nan."""

    def evaluate(self, dataloader):
        loss_sum, hits, samples, classifier = 0.0, 0, 0, True
        with no_grad():
            for inputs, targets in dataloader:
                outputs = self.model(inputs)
                loss, is_mean = self._reduce(self.loss_fn(outputs, targets))
                loss_sum += loss.item() * (len(inputs) if is_mean else 1)
                samples += len(inputs)
                classifier = classifier and outputs.ndim == 2 and outputs.shape[1] > 1 and targets.ndim == 1
                if classifier:
                    hits += (outputs.argmax(axis=1) == targets).sum().item()
        if samples == 0:
            raise ValueError("evaluate: the data loader yielded no batches")
        return loss_sum / samples, hits / samples if classifier else math.nan


def test_evaluate_counts_hits_of_one_hot_targets() -> None:
    graded = _graded("09_training")
    graded.test_evaluate_edge_cases(_student(training))
    _fails(graded.test_evaluate_edge_cases, _student(training, Trainer=AccuracyForLabelsOnly),
           "evaluate's accuracy with one-hot targets", "got nan")
