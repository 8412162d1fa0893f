"""The benchmark harness (``benchmarks/_timing.py``): lockstep timing in worker processes."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _timing  # noqa: E402


def test_lockstep_medians_times_every_process():
    results = _timing.lockstep_medians({"numpy": ("mlp_step:build", ("numpy",))}, repeats=3, warmup=1, processes=2)
    found = results["numpy"]
    assert len(found["process_seconds"]) == 2 and all(seconds > 0 for seconds in found["process_seconds"])
    assert min(found["process_seconds"]) <= found["seconds"] <= max(found["process_seconds"])
    assert found["spread"] == pytest.approx(max(found["process_seconds"]) / min(found["process_seconds"]) - 1)
    assert len(found["first"]) == 3 and found["first"][0] > 0  # three losses


def test_a_failing_worker_reports_its_traceback():
    with pytest.raises(RuntimeError, match=r"(?s)'nonsense'.*KeyError"):
        _timing.lockstep_medians({"nonsense": ("mlp_step:build", ("nonsense",))}, repeats=1, processes=1)


def test_spread_note_names_the_widest_spread_and_warns_past_the_limit():
    quiet = {"numpy": {"spread": 0.03}, "torch": {"spread": 0.05}}
    busy = {"numpy": {"spread": 0.03}, "tinytrain": {"spread": 0.29}}
    assert _timing.spread_note(quiet) == "processes of one implementation differ by up to 5.0% (torch)"
    assert _timing.spread_note(busy).startswith("processes of one implementation differ by up to 29.0% (tinytrain): ")
    assert "uncertain" in _timing.spread_note(busy) and "uncertain" not in _timing.spread_note(quiet)
