"""The profiler (``tt.profiler``): recording every Function and Module call while a profile is
active and nothing otherwise, the aggregation and its table, Chrome traces written atomically,
FLOPs against Module 15's formula, the bytes a graph keeps against tracemalloc, the memory
breakdown, MFU and the benchmark helper.

Tests take the ``device`` fixture (cpu, strict); what needs a GPU's memory pool or
synchronisation runs on a FAKE CuPy (``tinytrain.testing.fake_cupy``: not a GPU).
"""
from __future__ import annotations

import json
import os
import threading
import time
import tracemalloc
import types

import numpy as np
import pytest

import tinytrain as tt
from tinytrain import nn
from tinytrain import profiler
from tinytrain.autograd import Function
from tinytrain.nn.transformer import GPT, GPTConfig, flops_per_token
from tinytrain.testing.fake_cupy import forget_fake_gpu, register_fake_gpu


def mlp_step(device: str, profile_memory: bool = False, record_shapes: bool = False) -> profiler.profile:
    tt.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 4)).to(device)
    x = tt.randn(32, 64, device=device)
    with profiler.profile(profile_memory=profile_memory, record_shapes=record_shapes) as prof:
        with profiler.record_function("step"):
            model(x).sum().backward()
    return prof


def originals() -> dict:
    """What every Function subclass and Module class holds in its own __dict__ now."""
    from tinytrain.nn.module import Module

    held = {}
    for cls in [Function, *profiler._subclasses(Function), Module, *profiler._subclasses(Module)]:
        for name in ("forward", "backward", "__call__", "__init_subclass__"):
            if name in cls.__dict__:
                held[(cls, name)] = cls.__dict__[name]
    return held


# -- recording ------------------------------------------------------------------------------------

def test_a_step_is_recorded_nested_with_flops_and_bytes(device):
    prof = mlp_step(device, profile_memory=True, record_shapes=True)
    names = [(e.category, e.name) for e in prof.events]
    assert names == [("region", "step"), ("module", "nn.Sequential"), ("module", "nn.Linear"),
                     ("op", "LinearFunction"), ("module", "nn.ReLU"), ("op", "ReLU"), ("module", "nn.Linear"),
                     ("op", "LinearFunction"), ("op", "Sum"), ("backward", "Sum.backward"),
                     ("backward", "LinearFunction.backward"), ("backward", "ReLU.backward"),
                     ("backward", "LinearFunction.backward")]
    first = prof.events[3]
    assert first.flops == 2 * 32 * 64 * 128 and first.nbytes == 32 * 128 * 4
    assert first.shapes == [(32, 64), (128, 64), (128,)]
    assert prof.events[-1].flops == 4 * 32 * 64 * 128
    # Linear(64, 128)'s backward: the input needs no gradient, so only the weight's and the bias's are new
    assert prof.events[-1].nbytes == (128 * 64 + 128) * 4
    step = prof.events[0]
    assert sum(e.self_ns for e in prof.events) == step.duration_ns
    assert all(e.end_ns is not None and e.thread == threading.get_ident() for e in prof.events)
    assert all(e.owner is None for e in prof.events), "a closed event keeps no op (nor its saved arrays) alive"


def test_without_a_profile_nothing_is_wrapped_and_nothing_recorded():
    before = originals()
    region = profiler.record_function("idle")
    with region:
        (tt.randn(3, requires_grad=True) * 2).sum().backward()
    assert originals() == before
    prof = mlp_step("cpu")
    assert originals() == before, "the profile put every method back"
    assert prof.events and all(e.name != "idle" for e in prof.events)


def test_an_exception_inside_the_profile_restores_everything_and_closes_its_events():
    before = originals()
    tt.manual_seed(0)
    with pytest.raises(ValueError, match="MatMul of tensors with shapes"):
        with profiler.profile() as prof:
            with profiler.record_function("doomed"):
                tt.randn(2, 3) @ tt.randn(4, 5)
    assert originals() == before
    assert [e.name for e in prof.events] == ["doomed", "MatMul"]
    assert all(e.end_ns is not None for e in prof.events)
    assert profiler._active is None


def test_profiles_do_not_nest_and_are_used_once():
    with profiler.profile() as outer:
        with pytest.raises(RuntimeError, match="already recording"):
            with profiler.profile():
                pass
        (tt.randn(3, requires_grad=True) * 2).sum()
    assert [e.name for e in outer.events] == ["Mul", "Sum"], "the outer profile still records"
    with pytest.raises(RuntimeError, match="already recorded"):
        with outer:
            pass


def test_a_function_defined_while_profiling_is_recorded_and_unwrapped_afterwards():
    with profiler.profile() as prof:
        class Triple(Function):
            def forward(self, a):
                return a * 3

            def backward(self, grad):
                return (grad * 3,)

        class LoudTriple(Triple):  # calls its parent's forward: one event, not two
            def forward(self, a):
                return super().forward(a)

        x = tt.randn(4, requires_grad=True)
        LoudTriple.apply(Triple.apply(x)).sum().backward()
    assert [e.name for e in prof.events] == ["Triple", "LoudTriple", "Sum", "Sum.backward", "LoudTriple.backward",
                                             "Triple.backward"]
    assert prof.events[1].flops == 4
    assert "_profiled" not in vars(LoudTriple.forward) and "_profiled" not in vars(Triple.backward)
    assert "__init_subclass__" not in Function.__dict__


def test_a_module_that_overrides_call_is_recorded_once():
    class Doubling(nn.Module):
        def forward(self, x):
            return x * 2

        def __call__(self, x):
            return super().__call__(x)

    with profiler.profile() as prof:
        Doubling()(tt.randn(3))
    assert [e.name for e in prof.events] == ["nn.Doubling", "Mul"]


def test_threads_record_their_own_nesting():
    def work():
        (tt.randn(8) * 2).sum()

    with profiler.profile() as prof:
        with profiler.record_function("main"):
            thread = threading.Thread(target=work)
            thread.start()
            thread.join()
    main = prof.events[0]
    others = [e for e in prof.events if e.thread != main.thread]
    assert [e.name for e in others] == ["Mul", "Sum"] and others[0].parent is None
    assert main.children_ns == 0


def test_the_recorder_refuses_to_stop_an_event_when_none_is_open():
    recorder = profiler.EventRecorder()
    event = recorder.stop(recorder.start("region", "region"))
    end = event.end_ns
    with pytest.raises(RuntimeError, match=r"stop\('region'\): .*none is open"):
        recorder.stop(event)
    assert event.end_ns == end and recorder.open_events() == []


def test_record_function_as_a_decorator_and_its_name_checked():
    @profiler.record_function("helper")
    def helper():
        return tt.randn(2) + 1

    with profiler.profile() as prof:
        helper()
        helper()
    assert [e.name for e in prof.events] == ["helper", "Add", "helper", "Add"]
    assert prof.events[1].parent is prof.events[0]
    with pytest.raises(ValueError, match="non-empty name, got ''"):
        profiler.record_function("")


def test_profile_options_are_checked():
    with pytest.raises(TypeError, match="profile_memory must be True or False, got profile_memory=1"):
        profiler.profile(profile_memory=1)


def test_ops_are_recorded_whoever_calls_forward_and_backward():
    """The recording wraps the methods instead of hooking ``Function.apply`` and the engine, so a
    library whose Module 02 was written without any hook is recorded alike (the course test runs
    this module's lesson on independent students' code; here, an apply and a backward call written
    from scratch)."""
    class Square(Function):
        def forward(self, a):
            return a * a

        def backward(self, grad):
            return (grad,)

    def bare_apply(cls, x):  # a student's apply, bare: no profiler in sight
        fn = cls()
        fn.backend = x._backend
        return fn, fn.forward(x.data)

    with profiler.profile() as prof:
        fn, out = bare_apply(Square, tt.randn(5))
        type(fn).backward(fn, out)
    assert [(e.category, e.name) for e in prof.events] == [("op", "Square"), ("backward", "Square.backward")]


# -- key_averages and the table ---------------------------------------------------------------------

def test_key_averages_adds_up_per_name(device):
    prof = mlp_step(device, profile_memory=True)
    rows = {row.key: row for row in prof.key_averages()}
    assert rows["LinearFunction"].count == 2 and rows["LinearFunction.backward"].count == 2
    assert rows["LinearFunction"].flops == 2 * 32 * 64 * 128 + 2 * 32 * 128 * 4
    assert rows["step"].cpu_time_total == pytest.approx(prof.events[0].duration_ns / 1000)
    total_self = sum(row.self_cpu_time_total for row in rows.values())
    assert total_self == pytest.approx(prof.events[0].duration_ns / 1000)


def test_key_averages_adds_integer_nanoseconds_before_converting():
    # 0.1 + 0.2 microseconds, added as floats, would be 0.30000000000000004
    rows = profiler.key_averages([profiler.Event("a", "op", 1, 0, end_ns=100),
                                  profiler.Event("a", "op", 1, 100, end_ns=300)])
    assert (rows[0].cpu_time_total, rows[0].self_cpu_time_total) == (0.3, 0.3)


def test_table_sorts_limits_and_refuses_bad_arguments():
    averages = profiler.key_averages([
        profiler.Event("a", "op", 1, 0, end_ns=5_000, flops=10), profiler.Event("b", "op", 1, 5_000, end_ns=7_000,
                                                                                 flops=99),
        profiler.Event("c", "op", 1, 7_000, end_ns=8_000, nbytes=2048)])
    lines = averages.table(sort_by="flops", row_limit=2).splitlines()
    assert [line.split()[0] for line in lines[3:5]] == ["b", "a"] and lines[5].startswith("---")
    assert "62.50%" in averages.table() and "2.000 KiB" in averages.table()
    with pytest.raises(ValueError, match="sort_by='cuda_time' is not one of self_cpu_time_total"):
        averages.table(sort_by="cuda_time")
    with pytest.raises(ValueError, match="row_limit must be a whole number >= 1, got row_limit=0"):
        averages.table(row_limit=0)
    assert str(averages) == averages.table()


# -- traces ---------------------------------------------------------------------------------------

def test_the_chrome_trace_is_valid_trace_event_format(tmp_path, device):
    prof = mlp_step(device, record_shapes=True)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(path)
    document = json.loads(path.read_text())
    events = document["traceEvents"]
    assert document["displayTimeUnit"] == "ms" and len(events) == len(prof.events)
    required = {"name": str, "cat": str, "ph": str, "ts": (int, float), "dur": (int, float), "pid": int,
                "tid": int, "args": dict}
    for event in events:
        assert set(required) <= set(event), event
        assert all(isinstance(event[key], kind) for key, kind in required.items()), event
        assert event["ph"] == "X" and event["dur"] >= 0 and event["ts"] >= 0
    assert min(event["ts"] for event in events) == 0
    # complete events of one thread nest: each lies inside every earlier one it overlaps
    by_thread: dict[int, list] = {}
    for event in events:
        by_thread.setdefault(event["tid"], []).append(event)
    for group in by_thread.values():
        open_ends: list[float] = []
        for event in sorted(group, key=lambda e: (e["ts"], -e["dur"])):
            while open_ends and open_ends[-1] <= event["ts"] + 1e-6:
                open_ends.pop()
            end = event["ts"] + event["dur"]
            assert not open_ends or end <= open_ends[-1] + 1e-3, f"{event} overlaps its parent's end"
            open_ends.append(end)
    linear = next(event for event in events if event["name"] == "LinearFunction")
    assert linear["args"]["input shapes"] == [[32, 64], [128, 64], [128]]


def test_a_trace_that_cannot_be_written_leaves_no_file(tmp_path, monkeypatch):
    prof = mlp_step("cpu")
    path = tmp_path / "trace.json"
    path.write_text("the previous trace")
    monkeypatch.setattr(profiler.json, "dumps", lambda document: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        prof.export_chrome_trace(path)
    assert path.read_text() == "the previous trace" and os.listdir(tmp_path) == ["trace.json"]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        prof.export_chrome_trace(tmp_path / "missing" / "trace.json")
    with pytest.raises(RuntimeError, match="recorded no events"):
        with profiler.profile() as empty:
            pass
        empty.export_chrome_trace(tmp_path / "empty.json")
    assert not (tmp_path / "empty.json").exists()


# -- FLOPs --------------------------------------------------------------------------------------------

def test_a_gpt_steps_flops_agree_with_flops_per_token():
    config = GPTConfig(vocab_size=37, block_size=16, n_layer=2, n_head=2, n_embd=32)
    tt.manual_seed(0)
    model = GPT(config)
    idx = tt.tensor(np.random.default_rng(0).integers(0, 37, (3, 17)))
    with profiler.profile() as prof:
        _, loss = model(idx[:, :-1], targets=idx[:, 1:])
        loss.backward()
    tokens = 3 * 16
    products = sum(e.flops for e in prof.events if e.name.split(".")[0] in profiler._PRODUCTS)
    matrices = sum(p.size for name, p in model.named_parameters() if p.ndim == 2 and name != "wpe.weight")
    assert products == tokens * (6 * matrices + 12 * config.n_layer * config.n_embd * config.block_size)
    everything = sum(e.flops for e in prof.events)
    assert everything / tokens == pytest.approx(flops_per_token(config), rel=0.05)


def test_a_gpt_steps_self_times_account_for_its_wall_time():
    # the events' self times partition the time spent inside modules, ops and backwards: together they are the
    # step, less what runs outside any of them (the engine's walk between backwards, the profile's own work)
    config = GPTConfig(vocab_size=65, block_size=64, n_layer=2, n_head=4, n_embd=64)
    tt.manual_seed(0)
    model = GPT(config)
    idx = tt.tensor(np.random.default_rng(0).integers(0, 65, (4, 65)))
    shares = []
    for _ in range(3):  # the best of three: a busy machine can stop the process between two events
        with profiler.profile() as prof:
            start = time.perf_counter_ns()
            _, loss = model(idx[:, :-1], targets=idx[:, 1:])
            loss.backward()
            wall = time.perf_counter_ns() - start
        shares.append(sum(event.self_ns for event in prof.events) / wall)
    assert 0.9 <= max(shares) <= 1.0, shares


def test_conv2d_flops_in_a_profile():
    conv = nn.Conv2d(3, 8, 3, padding=1)
    with profiler.profile() as prof:
        conv(tt.randn(2, 3, 6, 6))
    assert next(e for e in prof.events if e.name == "Conv2dFunction").flops == 2 * (2 * 8 * 6 * 6) * (3 * 3 * 3)


def test_mfu_and_its_arguments():
    assert profiler.mfu(2e9, 0.1, 100e9) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="seconds must be a finite number > 0, got seconds=0"):
        profiler.mfu(1e9, 0, 1e9)
    with pytest.raises(TypeError, match="peak_flops must be a real number"):
        profiler.mfu(1e9, 1.0, "fast")


def test_peak_flops_measures_a_gemm(device):
    peak = profiler.peak_flops(device, n=64)
    assert peak > 1e6


# -- memory -----------------------------------------------------------------------------------------

def test_graph_saved_bytes_matches_tracemalloc():
    """What the graph keeps is what a forward pass leaves allocated, less its output."""
    tt.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    x = tt.randn(512, 64)
    model(x)  # warm-up: first-use allocations (caches, the allocator's settings)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    out = model(x)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    saved = profiler.graph_saved_bytes(out)
    assert saved == 4 * 512 * 256 * 4
    assert held == pytest.approx(saved + out.data.nbytes, rel=0.02)


def test_graph_saved_bytes_after_backward_is_zero(device):
    tt.manual_seed(0)
    w = tt.randn(4, 4, requires_grad=True, device=device)
    loss = (tt.randn(3, 4, device=device) @ w).tanh().sum()
    assert profiler.graph_saved_bytes(loss) > 0
    loss.backward()
    assert profiler.graph_saved_bytes(loss) == 0, "backward frees what the graph kept"


def test_graph_saved_bytes_skips_a_freed_function_that_kept_its_bookkeeping(device):
    # an engine (a student's Module 02) may clear a Function after its backward but put back its sequence and
    # inputs = None: no backend is left to tell arrays with, and nothing to count
    tt.manual_seed(0)
    loss = (tt.randn(3, 4, device=device, requires_grad=True) * 2.0).sum()
    loss.backward()
    loss._ctx.sequence, loss._ctx.inputs = 1, None
    assert profiler.graph_saved_bytes(loss) == 0


class KeepsATensor(Function):
    """The identity; keeps ``tensor`` (given to ``apply``) in an attribute of its own, and a tuple of
    an array inside a tuple."""

    def forward(self, a, tensor):
        self.kept, self.nested = tensor, ((self.xp.ones(1000, dtype=self.xp.float32),),)
        return a

    def backward(self, grad):
        return (grad,)


def test_graph_saved_bytes_walks_tensors_in_any_attribute_and_containers_one_level_deep(device):
    x = tt.randn(8, device=device, requires_grad=True)
    kept = x * 2.0  # not an input of the op that keeps it: its graph is alive through the attribute all the same
    out = KeepsATensor.apply(tt.randn(3, device=device, requires_grad=True), tensor=kept)
    # kept's array (8 float32) and nothing else: Mul holds only the leaf x; the tuple in a tuple is not searched
    assert profiler.graph_saved_bytes(out) == 8 * 4
    out = KeepsATensor.apply(tt.randn(3, device=device, requires_grad=True), tensor=kept * kept)
    assert profiler.graph_saved_bytes(out) == 2 * 8 * 4, "kept * kept's array and Mul's saved kept, found by the walk"


def test_training_memory_adds_the_activations_to_memory_report():
    tt.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = tt.AdamW(model.parameters(), lr=1e-3)
    x = tt.randn(10, 8)
    model(x).sum().backward()
    optimizer.step()
    out = model(x)
    report = profiler.training_memory(model, optimizer, out)
    base = tt.memory_report(model, optimizer)
    assert report["activations"] == profiler.graph_saved_bytes(out) == 2 * 10 * 16 * 4
    assert report["total"] == base["total"] + report["activations"]
    assert report["ratio"] == pytest.approx(report["total"] / base["parameters"])
    assert report["optimizer_state"] >= 2 * base["parameters"]


def test_measure_peak_memory_with_tracemalloc():
    peak = profiler.measure_peak_memory(lambda: np.ones(1_000_000, np.float32).sum())
    assert 4_000_000 <= peak < 4_200_000
    tracemalloc.start()
    try:
        with pytest.raises(RuntimeError, match="already tracing"):
            profiler.measure_peak_memory(lambda: None)
    finally:
        tracemalloc.stop()


class FakePool:
    """CuPy's memory pool as ``measure_peak_memory`` uses it: blocks kept after they are freed."""

    def __init__(self):
        self.total, self.freed = 1024, 0

    def free_all_blocks(self):
        self.freed += 1

    def total_bytes(self):
        return self.total


@pytest.fixture
def fake_gpu():
    from tinytrain.cuda import CupyBackend

    fake = register_fake_gpu(CupyBackend, devices=1)
    yield fake
    forget_fake_gpu()


def test_measure_peak_memory_reads_cupys_pool_and_synchronises(fake_gpu, monkeypatch):
    pool = FakePool()
    fake_gpu.get_default_memory_pool = lambda: pool
    synchronised = []
    monkeypatch.setattr(type(fake_gpu.cuda.Device(0)), "synchronize", lambda device: synchronised.append(device.id))

    def allocate():
        pool.total += 4096

    assert profiler.measure_peak_memory(allocate, device="fakecuda:0") == 4096
    assert pool.freed == 1 and synchronised == [0, 0]


def test_ops_on_a_gpu_are_timed_to_their_end(fake_gpu, monkeypatch):
    synchronised = []
    monkeypatch.setattr(type(fake_gpu.cuda.Device(0)), "synchronize", lambda device: synchronised.append(device.id))
    x = tt.randn(4, device="fakecuda:0", requires_grad=True)
    with profiler.profile() as prof:
        (x * 2).sum().backward()
    assert [e.name for e in prof.events] == ["Mul", "Sum", "Sum.backward", "Mul.backward"]
    assert synchronised == [0, 0, 0, 0], "one wait per op, before its end is stamped"
    measured = profiler.benchmark(lambda: x * 2, warmup=1, repeats=3, number=2, device="fakecuda:0")
    assert len(measured.samples) == 3 and len(synchronised) == 4 + 1 + 3


# -- benchmark --------------------------------------------------------------------------------------

def test_benchmark_reports_a_median_inside_its_interval():
    calls = []
    measured = profiler.benchmark(lambda: calls.append(1), warmup=2, repeats=5, number=10)
    assert len(calls) == 2 + 5 * 10
    assert measured.number == 10 and len(measured.samples) == 5 and measured.confidence == 0.95
    assert measured.ci_low <= measured.median <= measured.ci_high
    assert measured.median == pytest.approx(float(np.median(measured.samples)))
    assert "per call, 95% interval" in str(measured)


def test_benchmark_chooses_the_number_of_calls_per_run():
    measured = profiler.benchmark(lambda: None, warmup=0, repeats=3, min_run_time=0.003)
    assert measured.number >= 10, "a call of nothing is timed in batches"


def test_benchmark_and_median_interval_refuse_bad_arguments():
    with pytest.raises(TypeError, match="fn must be a function of no arguments"):
        profiler.benchmark(42)
    with pytest.raises(ValueError, match="repeats must be a whole number >= 1, got repeats=0"):
        profiler.benchmark(lambda: None, repeats=0)
    with pytest.raises(ValueError, match="no samples"):
        profiler.median_interval([])
    with pytest.raises(ValueError, match="confidence must be a finite number in"):
        profiler.median_interval([1.0, 2.0], confidence=1.0)
