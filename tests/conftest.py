"""Shared fixtures: the device parametrisation and the hypothesis profiles.

Every tensor/op test takes the ``device`` fixture and so runs once per backend
(Chainer-style): ``"cpu"`` (NumPy), ``"strict"`` (a stand-in device whose arrays,
like CuPy's, refuse implicit conversion to NumPy and refuse mixing with other
devices, so a host/device leak fails in CI) and ``"cuda"`` (skipped unless CuPy
imports and sees a GPU). Tests read values only through ``Tensor.numpy()``.

Hypothesis profiles: ``ci`` (default; small and deadline-free so the suite stays
fast on two cores), ``dev`` (smaller still) and ``thorough`` (for a bug hunt).
Select one with ``HYPOTHESIS_PROFILE=thorough pytest``.
"""
from __future__ import annotations

import os

import pytest
from hypothesis import settings


def _cuda_available() -> bool:
    try:
        import cupy
    except Exception:  # ImportError, or a broken CUDA install raising at import
        return False
    try:
        return bool(cupy.is_available())
    except Exception:
        return False


settings.register_profile("ci", deadline=None, max_examples=25, print_blob=True)
settings.register_profile("dev", deadline=None, max_examples=10)
settings.register_profile("thorough", deadline=None, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("strict", id="strict"),
    pytest.param(
        "cuda",
        id="cuda",
        marks=pytest.mark.skipif(not _cuda_available(), reason="needs CuPy and a CUDA GPU"),
    ),
]

# The name a tensor reports in ``t.device`` for each fixture value.
CANONICAL_DEVICE = {"cpu": "cpu", "strict": "strict:0", "cuda": "cuda:0"}


# Session scope: the fixture is a plain string, and a function-scoped fixture would
# trip hypothesis' health check in @given tests.
@pytest.fixture(scope="session", params=DEVICES)
def device(request) -> str:
    """The device every tensor in the test is created on."""
    return request.param


@pytest.fixture(scope="session")
def canonical_device(device) -> str:
    """``t.device`` of a tensor created with ``device=device``."""
    return CANONICAL_DEVICE[device]


@pytest.fixture(scope="session")
def other_device(device) -> str:
    """A device different from ``device`` (for device-mixing tests)."""
    return "strict" if device == "cpu" else "cpu"


# The suite's longest files, each minutes on its own: the two parts of the course test (9 and 11 minutes on
# 2 cores). First in the queue, two workers start one each and the other files fill in around them; collected in
# their usual place, a worker might reach them last or both in a row, and the suite would take their sum longer.
LONGEST_FIRST = ("test_course_second_part.py", "test_course.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # a stable sort: the rest keep their order
