"""Graded checks of Module 12 (the cost model, the random stream, scatter-add, host <-> device copies).

``student`` is the module's code: the installed package's, or a notebook's
(``tinytrain grade 12``). No GPU is needed: the student's ``CupyBackend`` runs
on :class:`tinytrain.testing.fake_cupy.FakeCupy`, a FAKE CuPy built on the strict device
(two fake GPUs; arrays made on the *current* one, as CuPy does). Backends are
built directly, never through the registry, so nothing of the student's stays
cached after a check.
"""
import pickle

import numpy as np

from tinytrain.testing.fake_cupy import FakeCupy
from tinytrain.course.checks import check, expect_close, expect_equal, expect_raises


def backend(student, fake, index=1):
    return student.CupyBackend(f"cuda:{index}", cupy=fake, cupyx=fake.cupyx)


@check(points=1, hint="matmul_cost is (2*m*k*n, itemsize*(m*k + k*n + m*n)); roofline_seconds is "
                      "launch_seconds + max(flops/peak_flops, nbytes/bandwidth)")
def test_cost_model(student):
    expect_equal(student.matmul_cost(128, 784, 256), (2 * 128 * 784 * 256, 4 * (128 * 784 + 784 * 256 + 128 * 256)),
                 "matmul_cost(128, 784, 256): (FLOPs, bytes)")
    expect_equal(student.matmul_cost(1, 1, 1, itemsize=8), (2, 24), "matmul_cost(1, 1, 1, itemsize=8)")
    expect_equal(student.matmul_cost(2, 3, 5, itemsize=2), (60, 2 * (6 + 15 + 10)), "matmul_cost(2, 3, 5, itemsize=2)")
    side = 10**6 + 1  # 2 * side**3 needs 61 bits: a float keeps 53
    cost = student.matmul_cost(side, side, side)
    expect_equal((cost, [type(c).__name__ for c in cost]), ((2 * side**3, 4 * 3 * side**2), ["int", "int"]),
                 f"(matmul_cost({side}, {side}, {side}), the types of its two numbers): exact Python ints")
    expect_close(student.roofline_seconds(6.0, 1.0, peak_flops=2.0, bandwidth=1.0), 3.0,
                 "roofline_seconds(6 FLOPs, 1 byte, peak 2 FLOP/s, 1 byte/s): compute-bound")
    expect_close(student.roofline_seconds(1.0, 8.0, peak_flops=2.0, bandwidth=2.0, launch_seconds=0.25), 4.25,
                 "roofline_seconds(1 FLOP, 8 bytes, peak 2, 2 bytes/s, launch 0.25 s): memory-bound plus launch")
    expect_close(student.roofline_seconds(3.0, 1.0, peak_flops=2.0, bandwidth=1.0, launch_seconds=0.5), 2.0,
                 "roofline_seconds(3 FLOPs, 1 byte, peak 2 FLOP/s, 1 byte/s, launch 0.5 s): compute-bound (1.5 s) "
                 "plus launch")


@check(points=2, hint="next_seed returns draw_seed(seed, draws) and then counts the draw; state() is "
                      "{'generator': GENERATOR, 'seed': ..., 'draws': ...}; load_state sets both back")
def test_draw_counter_round_trip(student):
    stream = student.DrawCounter(seed=12)
    expect_equal([stream.next_seed() for _ in range(2)], [student.draw_seed(12, 0), student.draw_seed(12, 1)],
                 "the first two next_seed() of DrawCounter(seed=12)")
    state = pickle.loads(pickle.dumps(stream.state()))
    expect_equal(state, {"generator": student.GENERATOR, "seed": 12, "draws": 2}, "state() after two draws")
    expected = [stream.next_seed() for _ in range(3)]
    fresh = student.DrawCounter(seed=0)
    fresh.load_state(state)
    expect_equal([fresh.next_seed() for _ in range(3)], expected, "the next three draws after load_state")
    fresh.load_state({"generator": student.GENERATOR, "seed": 2**64 + 5, "draws": 1})
    expect_equal((fresh.state()["seed"], fresh.next_seed()), (5, student.draw_seed(5, 1)),
                 "(state()['seed'], next_seed()) after load_state of a seed 2**64 + 5 and 1 draw: kept modulo 2**64, "
                 "as DrawCounter(seed=2**64 + 5) keeps it")


@check(points=1, hint="load_state raises ValueError for anything that is not a dict with this GENERATOR and "
                      "'seed' and 'draws' (no other keys) that are Python ints >= 0 (not bool, float or NumPy "
                      "integers; e.g. NumPy's PCG64 state is refused); check everything before setting anything; its "
                      "message names the generator expected and shows the state given")
def test_draw_counter_refuses_foreign_states(student):
    stream = student.DrawCounter(seed=1)
    stream.next_seed()
    good = stream.state()
    for bad, shown in (({"bit_generator": "PCG64", "state": {}}, "PCG64"),
                       ({"generator": student.GENERATOR, "seed": 5}, "'seed': 5"),
                       ({"generator": "other", "seed": 5, "draws": 0}, "other"),
                       ({"generator": student.GENERATOR, "seed": "5", "draws": 0}, "'5'"),
                       ({"generator": student.GENERATOR, "seed": 5, "draws": -3}, "-3"),
                       ({"generator": student.GENERATOR, "seed": -5, "draws": 0}, "-5"),
                       ({"generator": student.GENERATOR, "seed": 5, "draws": 2.5}, "2.5"),
                       ({"generator": student.GENERATOR, "seed": 5.0, "draws": 0}, "5.0"),
                       ({"generator": student.GENERATOR, "seed": 5, "draws": True}, "True"),
                       ({"generator": student.GENERATOR, "seed": np.int64(3), "draws": 0}, repr(np.int64(3))),
                       ({"generator": student.GENERATOR, "seed": 5, "draws": np.int64(2)}, repr(np.int64(2))),
                       ({"generator": student.GENERATOR, "seed": 5, "draws": 0, "bit_generator": "PCG64"}, "PCG64"),
                       (None, "None"), ([student.GENERATOR, 5, 0], "[")):
        expect_raises(ValueError, lambda: stream.load_state(bad), f"load_state({bad!r})",
                      mentions=(student.GENERATOR, shown))
        expect_equal(stream.state(), good, f"the state after load_state({bad!r}) was refused (it changes nothing)")


class RecordingCupyx:
    """The fake ``cupyx``, recording the dtypes of every ``scatter_add``'s target and values."""

    def __init__(self, fake):
        self.inner, self.calls = fake.cupyx, []

    def scatter_add(self, target, index, values):
        kind = str(np.dtype(values.dtype)) if hasattr(values, "dtype") else type(values).__name__
        self.calls.append((str(np.dtype(target.dtype)), kind))
        self.inner.scatter_add(target, index, values)


@check(points=2, hint="scatter_add passes float16/32/64, int32, uint32, uint64 straight to cupyx.scatter_add; "
                      "int64 goes as uint64 views of the target AND the values (an array: "
                      "values.astype(np.int64).view(np.uint64); a number: np.uint64(int(values) & (2**64 - 1))); "
                      "anything else raises TypeError naming the dtype and the supported ones")
def test_scatter_add_routing(student):
    fake = FakeCupy(devices=1)
    cupyx = RecordingCupyx(fake)
    floats = fake.zeros(3, dtype=np.float32)
    student.scatter_add(cupyx, floats, fake.asarray(np.array([2, 2, 0])), fake.asarray(np.array([1.0, 2.0, 5.0],
                                                                                               np.float32)))
    expect_equal(fake.asnumpy(floats), np.array([5.0, 0.0, 3.0], np.float32), "float32 [0, 0, 0] after "
                                                                              "scatter_add at [2, 2, 0] of [1, 2, 5]")
    expect_equal(cupyx.calls, [("float32", "float32")], "(target dtype, values dtype) that reached cupyx.scatter_add")
    ints = fake.asarray(np.array([10, -10], dtype=np.int64))
    cupyx.calls.clear()
    student.scatter_add(cupyx, ints, fake.asarray(np.array([1, 1, 0])), fake.asarray(np.array([-3, -4, 2**40])))
    expect_equal((str(ints.dtype), fake.asnumpy(ints).tolist()), ("int64", [10 + 2**40, -17]),
                 "int64 [10, -10] after scatter_add at [1, 1, 0] of [-3, -4, 2**40]: (dtype, values)")
    expect_equal(cupyx.calls, [("uint64", "uint64")],
                 "(target dtype, values dtype) that reached cupyx.scatter_add for an int64 target and int64 values")
    for number in (-10, np.int64(-10)):
        cupyx.calls.clear()
        before = fake.asnumpy(ints).tolist()
        student.scatter_add(cupyx, ints, fake.asarray(np.array([0])), number)
        expect_equal(fake.asnumpy(ints).tolist(), [before[0] - 10, before[1]],
                     f"int64 {before} after scatter_add at [0] of the number {number!r}")
        expect_equal(cupyx.calls, [("uint64", "uint64")],
                     f"(target dtype, values dtype) that reached cupyx.scatter_add for an int64 target and the "
                     f"number {number!r}")
    values = fake.asarray(np.array([1, 2, 3], np.int32))  # int32 values into an int64 target: astype first
    before = fake.asnumpy(ints).tolist()
    student.scatter_add(cupyx, ints, fake.asarray(np.array([0, 0, 1])), values)
    expect_equal(fake.asnumpy(ints).tolist(), [before[0] + 3, before[1] + 3],
                 f"int64 {before} after scatter_add at [0, 0, 1] of int32 values [1, 2, 3]")
    for dtype in ("float16", "float32", "float64", "int32", "uint32", "uint64"):
        cupyx.calls.clear()
        target = fake.zeros(3, dtype=dtype)
        student.scatter_add(cupyx, target, fake.asarray(np.array([2, 2, 0])), fake.asarray(np.array([1, 2, 5], dtype)))
        expect_equal(fake.asnumpy(target).tolist(), [5, 0, 3],
                     f"{dtype} [0, 0, 0] after scatter_add at [2, 2, 0] of [1, 2, 5]")
        expect_equal(cupyx.calls, [(dtype, dtype)],
                     f"(target dtype, values dtype) that reached cupyx.scatter_add for a {dtype} target (supported: "
                     "passed straight through)")
    for dtype in ("bool", "int16", "int8"):
        cupyx.calls.clear()
        expect_raises(TypeError, lambda: student.scatter_add(cupyx, fake.zeros(2, dtype=dtype),
                                                             fake.asarray(np.array([0])), 1),
                      f"scatter_add into a {dtype} target", mentions=(dtype, "float32", "uint32", "uint64"))
        expect_equal(cupyx.calls, [], f"calls that reached cupyx.scatter_add for a {dtype} target")


@check(points=2, hint="from_host makes the backend's GPU current (self.make_current()) and copies with "
                      "self._cupy.asarray; to_host copies back with self._cupy.asnumpy(array, order='A')")
def test_copies_land_on_the_backends_gpu(student):
    fake = FakeCupy(devices=2)
    gpu1 = backend(student, fake)
    fake.cuda.Device(0).use()
    data = np.arange(6.0).reshape(3, 2)
    on_gpu = gpu1.from_host(data)
    expect_equal(on_gpu.device.id, 1, "the GPU from_host of cuda:1 copies to while GPU 0 is current")
    expect_equal(fake.cuda.runtime.getDevice(), 1, "the current GPU after from_host of cuda:1 (make_current leaves "
                                                   "the backend's GPU current)")
    for host_array in (np.array([3, 1, 2]), np.array([0.1, 0.2]), np.array([1, 2], np.uint8)):
        expect_equal(str(gpu1.from_host(host_array).dtype), str(host_array.dtype),
                     f"the dtype of from_host of a {host_array.dtype} array (a copy keeps its dtype)")
    data[0, 0] = 50.0
    back = gpu1.to_host(on_gpu)
    expect_equal(type(back).__name__, "ndarray", "the type to_host returns")
    expect_equal(back, np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]),
                 "to_host(from_host(x)) after x changed (from_host copies)")
    back[1, 1] = -1.0
    expect_equal(gpu1.to_host(on_gpu)[1, 1], 3.0, "the GPU array after changing what to_host returned (a copy)")
    with fake.cuda.Device(1):
        column_major = fake.asarray(np.asfortranarray(np.arange(6.0, dtype=np.float32).reshape(2, 3)))
    host = gpu1.to_host(column_major)
    expect_equal(host, np.arange(6.0, dtype=np.float32).reshape(2, 3), "to_host of a column-major GPU array")
    expect_equal((host.flags.f_contiguous, host.flags.c_contiguous), (True, False),
                 "(F-contiguous, C-contiguous) of to_host of a column-major (2, 3) array: it keeps its memory "
                 "order, order='A'")


@check(points=1, hint="to_host raises TypeError naming the backend's device and where the array lives (its "
                      "device, or its type) for an array that is not on its GPU: check self.is_array(array) first")
def test_to_host_refuses_other_devices(student):
    fake = FakeCupy(devices=2)
    gpu1 = backend(student, fake)
    with fake.cuda.Device(0):
        elsewhere = fake.zeros(2)
    error = expect_raises(TypeError, lambda: gpu1.to_host(elsewhere), "to_host of cuda:1 given an array of GPU 0",
                          mentions=("cuda:1",))
    assert repr(elsewhere.device) in str(error) or "cuda:0" in str(error), \
        f"to_host of cuda:1 given an array of GPU 0: expected the TypeError to name where the array lives " \
        f"({elsewhere.device!r} or 'cuda:0'); its message was {str(error)!r}"
    expect_raises(TypeError, lambda: gpu1.to_host(np.zeros(2)), "to_host of cuda:1 given a NumPy array",
                  mentions=("cuda:1",))
    expect_raises(TypeError, lambda: gpu1.to_host([1.0, 2.0]), "to_host of cuda:1 given a list (no device: its type)",
                  mentions=("cuda:1", "list"))


@check(points=1, hint="the backend's random draws re-seed its generator from DrawCounter.next_seed(); "
                      "rng_state / set_rng_state are the counter's state()/load_state()",
       after="test_draw_counter_round_trip")
def test_backend_random_numbers_resume_exactly(student):
    fake = FakeCupy(devices=2)
    gpu1 = backend(student, fake)
    gpu1.seed(8)
    state = gpu1.rng_state()
    first = [fake.asnumpy(gpu1.random_normal((4,))), fake.asnumpy(gpu1.random_uniform((2, 2)))]
    gpu1.set_rng_state(pickle.loads(pickle.dumps(state)))
    again = [fake.asnumpy(gpu1.random_normal((4,))), fake.asnumpy(gpu1.random_uniform((2, 2)))]
    expect_equal(again[0], first[0], "random_normal((4,)) after set_rng_state of the saved state")
    expect_equal(again[1], first[1], "random_uniform((2, 2)) after set_rng_state of the saved state")
    later = fake.asnumpy(gpu1.random_normal((4,)))
    assert not np.array_equal(first[0], later), \
        f"a later random_normal((4,)): expected new numbers, got the first draw again {later}"
