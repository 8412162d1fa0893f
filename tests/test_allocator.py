"""tinytrain keeps freed array memory in the C heap (glibc), so steady training steps do not page-fault."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tinytrain.runtime import allocator

glibc_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt thresholds are glibc's")

# Five 2 MiB arrays from the heap, freed together, ten times over. After a 3 MiB block
# has been mapped and unmapped, glibc's default trim threshold is 6 MiB, so the default
# allocator hands the 10 MiB back at every free and faults it in again at the next cycle.
FAULTS_PER_CYCLE = """
import resource, sys
import numpy as np
if sys.argv[1] != "plain":
    import tinytrain
if sys.argv[1] == "import-then-return":
    tinytrain.runtime.allocator.return_freed_memory()
def cycle():
    blocks = [np.ones(2**18) for _ in range(5)]
    del blocks
np.ones(3 * 2**17)
cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    cycle()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
"""


def faults_per_cycle(import_tinytrain: bool, then_return: bool = False, **environment: str) -> float:
    mode = "import-then-return" if then_return else "import" if import_tinytrain else "plain"
    completed = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FAULTS_PER_CYCLE), mode],
        capture_output=True, text=True, check=True, env={**os.environ, **environment},
    )
    return float(completed.stdout)


@glibc_only
def test_importing_tinytrain_stops_the_heap_from_being_trimmed():
    assert faults_per_cycle(import_tinytrain=False) > 1000, "the pattern should fault without tinytrain"
    assert faults_per_cycle(import_tinytrain=True) < 10


@glibc_only
def test_environment_variable_leaves_the_defaults():
    assert faults_per_cycle(import_tinytrain=True, **{allocator.DISABLE_VARIABLE: "0"}) > 1000


@glibc_only
def test_return_freed_memory_puts_the_defaults_back():
    assert faults_per_cycle(import_tinytrain=True, then_return=True) > 1000


@glibc_only
def test_keep_freed_memory_reports_what_it_did(monkeypatch):
    assert allocator.keep_freed_memory() is True and allocator.in_effect()
    try:
        assert allocator.return_freed_memory() is True and not allocator.in_effect()
        monkeypatch.setenv(allocator.DISABLE_VARIABLE, "0")
        assert allocator.keep_freed_memory() is False and not allocator.in_effect()
    finally:
        monkeypatch.delenv(allocator.DISABLE_VARIABLE)
        assert allocator.keep_freed_memory() is True and allocator.in_effect()


def test_other_platforms_are_left_alone(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert allocator.keep_freed_memory() is False and allocator.return_freed_memory() is False
