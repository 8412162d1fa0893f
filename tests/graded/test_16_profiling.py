"""Graded checks of Module 16 (profiling): the event recorder and self time, FLOPs by formula,
recording a training step, ``key_averages``, the Trace Event Format events, MFU, the bytes a
graph keeps for backward, and the median's confidence interval.

``student`` is the module's code: the installed package's, or a notebook's
(``tinytrain grade 16``). The recorder runs on a fake clock so every time is exact; the
aggregation and the trace are checked on hand-made events; the graph walk on small graphs whose
saved bytes are counted by hand here.
"""
import json
import math
import statistics
import threading

import numpy as np

import tinytrain as tt
from tinytrain import nn
from tinytrain.autograd import Function
from tinytrain.course.checks import check, expect_close, expect_equal, expect_raises


def fake_clock(step=1_000):
    """A clock that reads 0, step, 2 step, ... nanoseconds, one tick per call."""
    ticks = iter(range(0, 10**9, step))
    return lambda: next(ticks)


def closed_event(student, name, start, end, children=0, flops=0, nbytes=0, category="op", thread=1, shapes=None):
    return student.Event(name, category, thread=thread, start_ns=start, end_ns=end, children_ns=children,
                         flops=flops, nbytes=nbytes, shapes=shapes)


# -- the recorder -------------------------------------------------------------------------------

@check(points=3, hint="EventRecorder.start: stack = self.open_events(); Event(name, category, "
                      "thread=threading.get_ident(), start_ns=self.clock(), parent=stack[-1] if stack else None, "
                      "shapes=shapes), appended to self.events and pushed on the stack. stop(event): it must be "
                      "stack[-1] (else RuntimeError naming both, nothing changed); end_ns = self.clock(), pop, and "
                      "event.parent.children_ns += event.duration_ns when there is a parent")
def test_recorder_nesting_and_self_time(student):
    recorder = student.EventRecorder(clock=fake_clock())
    step = recorder.start("step", "region")                       # t = 0
    block = recorder.start("nn.Block", "module", shapes=[(2, 3)])  # 1000
    matmul = recorder.start("MatMul", "op")                        # 2000
    expect_equal([step.parent, block.parent is step, matmul.parent is block], [None, True, True],
                 "parents of step > nn.Block > MatMul (None, then each the innermost open event)")
    expect_equal(recorder.stop(matmul) is matmul, True, "stop returns the event")  # 3000
    add = recorder.start("Add", "op")                              # 4000
    recorder.stop(add)                                             # 5000
    recorder.stop(block)                                           # 6000
    other = recorder.start("optimizer", "region")                  # 7000
    recorder.stop(other)                                           # 8000
    recorder.stop(step)                                            # 9000
    expect_equal([e.name for e in recorder.events], ["step", "nn.Block", "MatMul", "Add", "optimizer"],
                 "recorder.events: every event, in the order they started")
    expect_equal([(e.start_ns, e.end_ns) for e in recorder.events],
                 [(0, 9000), (1000, 6000), (2000, 3000), (4000, 5000), (7000, 8000)],
                 "(start_ns, end_ns) of each event, one clock reading at each start and stop")
    expect_equal([e.children_ns for e in recorder.events], [6000, 2000, 0, 0, 0],
                 "children_ns: the durations of the events directly inside, added up")
    expect_equal([e.self_ns for e in recorder.events], [3000, 3000, 1000, 1000, 1000], "self times")
    expect_equal([e.category for e in recorder.events], ["region", "module", "op", "op", "region"], "categories")
    expect_equal((block.shapes, matmul.shapes), ([(2, 3)], None), "shapes, as given to start")
    expect_equal({e.thread for e in recorder.events}, {threading.get_ident()}, "Event.thread: threading.get_ident()")
    expect_equal(recorder.open_events(), [], "the stack of open events after every event stopped")


@check(points=2, hint="EventRecorder.stop(event) when event is not the innermost open one: raise RuntimeError naming "
                      "the event and the innermost open one (or, when none is open, naming the event), BEFORE "
                      "changing anything or reading the clock. Each thread has its own stack: use "
                      "self.open_events(), not a list shared by all threads",
       after="test_recorder_nesting_and_self_time")
def test_recorder_refuses_and_threads(student):
    recorder = student.EventRecorder(clock=fake_clock())
    outer = recorder.start("outer-region", "region")
    middle = recorder.start("middle-module", "module")
    inner = recorder.start("inner-op", "op")
    expect_raises(RuntimeError, lambda: recorder.stop(outer), "stop(outer-region) while middle-module and inner-op "
                  "are open (the innermost is inner-op)", mentions=("outer-region", "inner-op"))
    expect_equal((outer.end_ns, inner.end_ns, outer.children_ns, recorder.open_events() == [outer, middle, inner]),
                 (None, None, 0, True), "(outer.end_ns, inner.end_ns, outer.children_ns, stack unchanged) after "
                 "the refused stop")
    for event in (inner, middle, outer):
        recorder.stop(event)
    expect_raises(RuntimeError, lambda: recorder.stop(outer), "stop(outer) a second time, with no event open",
                  mentions=("outer-region",))
    expect_equal(outer.end_ns, 5000, "end_ns of an event after a refused second stop")

    recorder = student.EventRecorder()
    main = recorder.start("main", "region")
    seen = {}

    def worker():
        event = recorder.start("worker-op", "op")
        seen["parent"], seen["thread"] = event.parent, event.thread
        recorder.stop(event)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    recorder.stop(main)
    expect_equal(seen["parent"], None, "the parent of an event started in another thread while 'main' is open in "
                                       "this one (each thread nests its own events)")
    expect_equal(seen["thread"] != main.thread, True, "an event of another thread has that thread's id")
    expect_equal(main.children_ns, 0, "children_ns of 'main': another thread's event is not its child")


# -- FLOPs --------------------------------------------------------------------------------------

@check(points=2, hint="op_flops: products (MatMul, LinearFunction: k = input_shapes[0][-1]; Conv2dFunction: k = "
                      "math.prod(input_shapes[1][1:])) count 2 * math.prod(output_shape) * k, twice that with "
                      "backward=True; the ops in _MOVES count 0; any other op the elements of its largest input or "
                      "output (the same backward)")
def test_op_flops(student):
    cases = [
        (("LinearFunction", [(32, 64), (128, 64), (128,)], (32, 128)), 2 * 32 * 64 * 128),
        (("LinearFunction", [(6, 5, 3), (4, 3)], (6, 5, 4)), 2 * 6 * 5 * 4 * 3),
        (("MatMul", [(5, 3), (3, 7)], (5, 7)), 2 * 5 * 3 * 7),
        (("MatMul", [(2, 4, 5, 8), (2, 4, 8, 6)], (2, 4, 5, 6)), 2 * 2 * 4 * 5 * 6 * 8),
        (("MatMul", [(9,), (9, 2)], (2,)), 2 * 9 * 2),
        (("Conv2dFunction", [(8, 3, 10, 10), (16, 3, 3, 5)], (8, 16, 8, 6)), 2 * 8 * 16 * 8 * 6 * 3 * 3 * 5),
        (("Conv2dFunction", [(2, 4, 6, 6), (5, 4, 2, 2), (5,)], (2, 5, 5, 5)), 2 * 2 * 5 * 5 * 5 * 4 * 2 * 2),
        (("Add", [(4, 5), (5,)], (4, 5)), 20),
        (("Mul", [(3, 1), (1, 7)], (3, 7)), 21),
        (("Sum", [(4, 5)], ()), 20),
        (("Max", [(6, 5)], (6, 1)), 30),
        (("Where", [(8,), (2, 8), (8,)], (2, 8)), 16),
        (("GELUTanh", [(3, 11)], (3, 11)), 33),
    ] + [((name, [(4, 5)], (5, 4)), 0) for name in ("Reshape", "Transpose", "GetItem", "Cast", "EmbeddingFunction")]
    for (name, shapes, out), want in cases:
        got = student.op_flops(name, shapes, out)
        expect_equal(got, want, f"op_flops({name!r}, {shapes}, {out})")
        expect_equal(type(got), int, f"the type of op_flops({name!r}, ...) (a Python int)")
        backward = student.op_flops(name, shapes, out, backward=True)
        factor = 2 if name in ("LinearFunction", "MatMul", "Conv2dFunction") else 1
        expect_equal(backward, factor * want, f"op_flops({name!r}, {shapes}, {out}, backward=True)")
    big = ("MatMul", [(1000, 100000), (100000, 1000)], (1000, 1000))
    expect_equal(student.op_flops(*big), 2 * 10**11, "op_flops of a (1000, 100000) @ (100000, 1000) product (exact)")


# -- recording a step ---------------------------------------------------------------------------

def small_step(student):
    """A profile of one training step of Linear(64, 128) + ReLU + Linear(128, 4) on 32 samples."""
    tt.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 4))
    x = tt.randn(32, 64)
    with student.profile(profile_memory=True, record_shapes=True) as prof:
        with student.record_function("step"):
            model(x).sum().backward()
    return prof


@check(points=3, hint="the profile records through your EventRecorder and op_flops: every module call nests in "
                      "its parent module, every op in its module, every backward in the region that called "
                      "backward(); Linear(64, 128) on 32 samples is 2*32*64*128 FLOPs forward, twice that backward",
       after=("test_recorder_nesting_and_self_time", "test_op_flops"))
def test_profile_of_a_step(student):
    prof = small_step(student)
    names = [(e.category, e.name) for e in prof.events]
    expect_equal(names[:4], [("region", "step"), ("module", "nn.Sequential"), ("module", "nn.Linear"),
                             ("op", "LinearFunction")], "the first events of the profile of a step")
    linear_ops = [e for e in prof.events if e.name == "LinearFunction"]
    expect_equal([e.parent.name for e in linear_ops], ["nn.Linear", "nn.Linear"], "the parents of the Linear ops")
    expect_equal([e.flops for e in linear_ops], [2 * 32 * 64 * 128, 2 * 32 * 128 * 4],
                 "FLOPs of Linear(64, 128) and Linear(128, 4) on 32 samples")
    backwards = [e for e in prof.events if e.category == "backward"]
    expect_equal([e.name for e in backwards], ["Sum.backward", "LinearFunction.backward", "ReLU.backward",
                                               "LinearFunction.backward"], "the backward events, in order")
    expect_equal({e.parent.name for e in backwards}, {"step"}, "the parent of every backward event")
    expect_equal(backwards[-1].flops, 4 * 32 * 64 * 128, "FLOPs of Linear(64, 128)'s backward")
    expect_equal(linear_ops[0].shapes, [(32, 64), (128, 64), (128,)], "the input shapes recorded for Linear(64, 128)")
    expect_equal(linear_ops[0].nbytes, 32 * 128 * 4, "bytes Linear(64, 128) creates on 32 samples (float32)")
    step = prof.events[0]
    expect_equal(sum(e.self_ns for e in prof.events), step.duration_ns,
                 "the sum of every event's self time (the step's total: nothing counted twice)")
    rows = {row.key: row for row in prof.key_averages()}
    expect_equal((rows["LinearFunction"].count, rows["LinearFunction"].flops), (2, 2 * 32 * 64 * 128 + 2 * 32 * 128 * 4),
                 "key_averages of the step: (count, flops) of LinearFunction")


# -- key_averages and the trace -----------------------------------------------------------------

@check(points=2, hint="key_averages: one KeyAverage per event name, in the order names first appear: the count; "
                      "cpu_time_total and self_cpu_time_total, the sums of duration_ns and self_ns divided by 1000 "
                      "(microseconds); the sums of flops and of nbytes (cpu_memory_usage); return KeyAverages(rows)")
def test_key_averages(student):
    events = [closed_event(student, "nn.Linear", 0, 12_500, children=10_000, category="module"),
              closed_event(student, "MatMul", 1_000, 7_000, flops=96, nbytes=64),
              closed_event(student, "Add", 7_000, 7_500, flops=8, nbytes=32),
              closed_event(student, "MatMul", 8_000, 11_500, children=500, flops=90, nbytes=16),
              closed_event(student, "MatMul.backward", 20_000, 23_000, flops=384, category="backward")]
    rows = student.key_averages(events)
    expect_equal(isinstance(rows, student.KeyAverages), True, "key_averages returns a KeyAverages")
    expect_equal([row.key for row in rows], ["nn.Linear", "MatMul", "Add", "MatMul.backward"],
                 "the keys, in the order they first appear")
    got = [(row.count, row.cpu_time_total, row.self_cpu_time_total, row.flops, row.cpu_memory_usage) for row in rows]
    want = [(1, 12.5, 2.5, 0, 0), (2, 9.5, 9.0, 186, 80), (1, 0.5, 0.5, 8, 32), (1, 3.0, 3.0, 384, 0)]
    expect_close(np.array(got, dtype=float), np.array(want, dtype=float),
                 "(count, cpu_time_total us, self_cpu_time_total us, flops, cpu_memory_usage) per row", rtol=1e-12)
    expect_equal(len(student.key_averages([])), 0, "key_averages of no events")
    table = rows.table(sort_by="self_cpu_time_total", row_limit=2)
    expect_equal(table.splitlines()[3].split()[0], "MatMul", "the first row of the table sorted by self time")


@check(points=2, hint="trace_events: one dict per event: name, 'cat': category, 'ph': 'X', 'ts': (start_ns - "
                      "origin_ns) / 1000, 'dur': duration_ns / 1000, 'pid': pid, 'tid': thread, 'args': "
                      "event.trace_args()")
def test_trace_events(student):
    events = [closed_event(student, "nn.Linear", 5_000, 17_500, category="module", thread=11),
              closed_event(student, "MatMul", 6_000, 12_250, flops=96, nbytes=64, thread=11, shapes=[(2, 3), (3, 4)]),
              closed_event(student, "Add.backward", 9_000, 9_500, category="backward", thread=12)]
    got = student.trace_events(events, 4_000, pid=3)
    want = [{"name": "nn.Linear", "cat": "module", "ph": "X", "ts": 1.0, "dur": 12.5, "pid": 3, "tid": 11,
             "args": {"flops": 0, "bytes": 0}},
            {"name": "MatMul", "cat": "op", "ph": "X", "ts": 2.0, "dur": 6.25, "pid": 3, "tid": 11,
             "args": {"flops": 96, "bytes": 64, "input shapes": [[2, 3], [3, 4]]}},
            {"name": "Add.backward", "cat": "backward", "ph": "X", "ts": 5.0, "dur": 0.5, "pid": 3, "tid": 12,
             "args": {"flops": 0, "bytes": 0}}]
    expect_equal(got, want, "trace_events(events, origin_ns=4000, pid=3)")


@check(points=1, hint="export_chrome_trace writes {'traceEvents': trace_events(...)}: complete events whose "
                      "intervals nest per thread, in microseconds", after=("test_trace_events", "test_profile_of_a_step"))
def test_exported_trace_is_valid(student, tmp_path):
    prof = small_step(student)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(path)
    document = json.loads(path.read_text())
    events = document["traceEvents"]
    expect_equal(len(events), len(prof.events), "the number of events in the trace")
    for event in events:
        for key, kind in (("name", str), ("cat", str), ("ph", str), ("ts", (int, float)), ("dur", (int, float)),
                          ("pid", int), ("tid", int), ("args", dict)):
            if not isinstance(event.get(key), kind):
                raise AssertionError(f"trace event {event}: expected {key!r} of type {kind}, got {event.get(key)!r}")
    step = events[0]
    expect_equal((step["name"], step["ts"]), ("step", 0.0), "the first trace event (the region 'step', at ts 0)")
    expect_close(step["dur"], prof.events[0].duration_ns / 1000, "the duration of 'step' in microseconds")
    for outer, inner in zip(prof.events, events):
        if outer.parent is not None:
            parent = events[prof.events.index(outer.parent)]
            if not (parent["ts"] - 1e-3 <= inner["ts"] and inner["ts"] + inner["dur"] <= parent["ts"] + parent["dur"]
                    + 1e-3):
                raise AssertionError(f"trace event {inner} does not lie inside its parent {parent}")


# -- MFU ----------------------------------------------------------------------------------------

@check(points=1, hint="mfu(flops, seconds, peak_flops) = flops / seconds / peak_flops")
def test_mfu(student):
    for flops, seconds, peak in ((2e9, 0.1, 100e9), (6e12, 2.0, 1e12), (5.0, 4.0, 0.5)):
        expect_close(student.mfu(flops, seconds, peak), flops / seconds / peak,
                     f"mfu(flops={flops}, seconds={seconds}, peak_flops={peak})", rtol=1e-12)


# -- memory -------------------------------------------------------------------------------------

class Visits(tuple):
    """A tuple that counts how often it is iterated: how often the graph walk looks at its holder."""
    count = 0

    def __iter__(self):
        Visits.count += 1
        return super().__iter__()


class Holds(Function):
    """The identity; keeps one 2-number float32 array in a ``Visits`` tuple."""

    def forward(self, a):
        self.kept = Visits((self.xp.ones(2, dtype=self.xp.float32),))
        return a

    def backward(self, grad):
        return (grad,)


def visits_of_a_diamond_chain(student, depth):
    """How often graph_saved_bytes looks at an op that 2**depth paths reach."""
    x = Holds.apply(tt.randn(3, requires_grad=True))
    for _ in range(depth):
        x = x + x  # both inputs of each Add are the same tensor: the number of paths doubles
    Visits.count = 0
    saved = student.graph_saved_bytes(x)
    expect_equal(saved, 8 + depth * 12 - 12 if depth else 8,
                 f"graph_saved_bytes of {depth} doublings x = x + x of a 3-number op that keeps 8 bytes")
    return Visits.count


class SavesExtras(Function):
    """Doubles its input; keeps a list of two arrays, a 100-number block through a 10-number view,
    and a leaf tensor (whose memory the graph does not own)."""

    def forward(self, a):
        xp = self.xp
        self.kept = [xp.ones(3, dtype=xp.float64), xp.ones(5, dtype=xp.float64)]
        self.part = xp.ones((10, 10), dtype=xp.float32)[:1]
        self.twin = tt.tensor([1.0, 2.0, 3.0, 4.0], device=self.backend.device)
        return a * 2

    def backward(self, grad):
        return (grad * 2,)


@check(points=3, hint="graph_saved_bytes: walk the Functions from output._ctx through the tensors in their "
                      "attributes (inputs), each Function once; count every array in vars(fn) (an array, a "
                      "Tensor's .data, or inside a tuple or LIST) by memory_owner(array): owner.nbytes once per "
                      "key; leave out the keys of leaf tensors' arrays (_ctx is None) -- by key, at the end, once "
                      "the whole walk has found every leaf; skip a Function with no backend (its backward has run)")
def test_graph_saved_bytes(student):
    for device in ("cpu", "strict"):
        tt.manual_seed(0)
        x = tt.randn(32, 64, device=device)
        w = tt.randn(128, 64, requires_grad=True, device=device)
        h = x @ w.T
        y = tt.nn.functional.relu(h)
        expect_equal(student.graph_saved_bytes(y), 2 * 32 * 128 * 4,
                     f"graph_saved_bytes(relu(x @ w.T)) on {device}: the product and the ReLU's output (x, w and "
                     "w.T are leaves' memory: MatMul's saved arrays are x's and a view of w's, and w turns up only "
                     "at the Transpose behind w.T)")
        z = y.reshape(64, 64) * 2.0 + y.reshape(64, 64)[:8].sum()
        expect_equal(student.graph_saved_bytes(z), 2 * 32 * 128 * 4 + 64 * 64 * 4 + 4,
                     f"graph_saved_bytes of y.reshape(64, 64) * 2.0 + y.reshape(64, 64)[:8].sum() on {device}: y's "
                     "blocks once (a reshape and a slice are views of y), the product and the 0-d sum")
        diamond = (h * h + h).sum()
        expect_equal(student.graph_saved_bytes(diamond), 3 * 32 * 128 * 4,
                     f"graph_saved_bytes of sum(h * h + h) on {device}: h, h * h and h * h + h, each once")
        extras = SavesExtras.apply(y)
        expect_equal(student.graph_saved_bytes(extras), 2 * 32 * 128 * 4 + 8 * 3 + 8 * 5 + 400,
                     f"graph_saved_bytes of an op on relu(x @ w.T) that holds a list of two float64 arrays (3 and 5 "
                     f"numbers), a view of a 100-number float32 block and a leaf tensor, on {device}")
        expect_equal(student.graph_saved_bytes(x), 0, f"graph_saved_bytes of a leaf (no graph) on {device}")
        expect_equal(student.graph_saved_bytes(w * 1.0), 0, f"graph_saved_bytes of w * 1.0 (it keeps leaves only)")
        diamond.backward()
        diamond._ctx.sequence = 0  # bookkeeping an engine may put back after clearing a Function: still no backend
        expect_equal(student.graph_saved_bytes(diamond), 0,
                     f"graph_saved_bytes of sum(h * h + h) after its backward on {device} (every Function of its "
                     "graph was cleared; skip a Function that has no backend)")
    once, many = visits_of_a_diamond_chain(student, 1), visits_of_a_diamond_chain(student, 6)
    expect_equal(many, once, "how often the walk looks at an op reached by 64 paths (expected: as often as when "
                             "2 paths reach it; visit each Function once)")


# -- timing ---------------------------------------------------------------------------------------

def reference_interval(samples, confidence):
    ordered = sorted(samples)
    n = len(ordered)
    spread = statistics.NormalDist().inv_cdf(0.5 + confidence / 2) * math.sqrt(n)
    j = max(1, math.floor((n - spread) / 2))
    k = min(n, math.ceil(1 + (n + spread) / 2))
    return statistics.median(ordered), ordered[j - 1], ordered[k - 1]


@check(points=2, hint="median_interval: sort; z = NormalDist().inv_cdf(0.5 + confidence / 2); j = floor((n - z "
                      "sqrt(n)) / 2), k = ceil(1 + (n + z sqrt(n)) / 2), clamped to 1..n; return "
                      "(statistics.median, sorted[j - 1], sorted[k - 1])")
def test_median_interval(student):
    rng = np.random.default_rng(16)
    for n, confidence in ((20, 0.95), (21, 0.95), (100, 0.5), (100, 0.99), (7, 0.9), (3, 0.95), (1, 0.95), (2, 0.8),
                          (50, 0.8)):
        samples = list(rng.exponential(1.0, n) + 1.0)
        got = student.median_interval(samples, confidence=confidence)
        expect_close(np.array(got), np.array(reference_interval(samples, confidence)),
                     f"median_interval of {n} samples at confidence {confidence} (median, low, high)", rtol=1e-12)
    expect_equal(student.median_interval(range(1, 21)), (10.5, 5.0, 16.0),
                 "median_interval(1..20) at the default confidence 0.95")
