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
import pytest

from tinytrain.testing.fake_cupy import FakeCupy
from tinytrain.course.checks import check


def backend(student, fake, index=1):
    return student.CupyBackend(f"cuda:{index}", cupy=fake, cupyx=fake.cupyx)


@check(points=1, hint="matmul_cost is (2*m*k*n, itemsize*(m*k + k*n + m*n)); roofline_seconds is "
                      "launch_seconds + max(flops/peak_flops, nbytes/bandwidth)")
def test_cost_model(student):
    assert student.matmul_cost(128, 784, 256) == (2 * 128 * 784 * 256, 4 * (128 * 784 + 784 * 256 + 128 * 256))
    assert student.matmul_cost(1, 1, 1, itemsize=8) == (2, 24)
    assert student.roofline_seconds(6.0, 1.0, peak_flops=2.0, bandwidth=1.0) == 3.0
    assert student.roofline_seconds(1.0, 8.0, peak_flops=2.0, bandwidth=2.0, launch_seconds=0.25) == 4.25


@check(points=2, hint="next_seed returns draw_seed(seed, draws) and then counts the draw; state() is "
                      "{'generator': GENERATOR, 'seed': ..., 'draws': ...}; load_state sets both back")
def test_draw_counter_round_trip(student):
    stream = student.DrawCounter(seed=12)
    assert [stream.next_seed() for _ in range(2)] == [student.draw_seed(12, 0), student.draw_seed(12, 1)]
    state = pickle.loads(pickle.dumps(stream.state()))
    assert state == {"generator": student.GENERATOR, "seed": 12, "draws": 2}
    expected = [stream.next_seed() for _ in range(3)]
    fresh = student.DrawCounter(seed=0)
    fresh.load_state(state)
    assert [fresh.next_seed() for _ in range(3)] == expected


@check(points=1, hint="load_state raises ValueError for anything that is not a dict with this GENERATOR and "
                      "non-negative integer 'seed' and 'draws' (e.g. NumPy's PCG64 state)")
def test_draw_counter_refuses_foreign_states(student):
    stream = student.DrawCounter(seed=1)
    for bad in ({"bit_generator": "PCG64", "state": {}}, {"generator": student.GENERATOR, "seed": 1},
                {"generator": "other", "seed": 1, "draws": 0},
                {"generator": student.GENERATOR, "seed": "1", "draws": 0}):
        with pytest.raises(ValueError):
            stream.load_state(bad)
    assert stream.state()["seed"] == 1, "a refused state changes nothing"


@check(points=2, hint="scatter_add passes float16/32/64, int32, uint32, uint64 straight to cupyx.scatter_add; "
                      "int64 goes as uint64 views of target and values; anything else raises TypeError")
def test_scatter_add_routing(student):
    fake = FakeCupy(devices=1)
    floats = fake.zeros(3, dtype=np.float32)
    student.scatter_add(fake.cupyx, floats, fake.asarray(np.array([2, 2, 0])), fake.asarray(np.array([1.0, 2.0, 5.0])))
    assert fake.asnumpy(floats).tolist() == [5.0, 0.0, 3.0]
    ints = fake.asarray(np.array([10, -10], dtype=np.int64))
    student.scatter_add(fake.cupyx, ints, fake.asarray(np.array([1, 1, 0])), fake.asarray(np.array([-3, -4, 2**40])))
    assert ints.dtype == np.int64 and fake.asnumpy(ints).tolist() == [10 + 2**40, -17]
    student.scatter_add(fake.cupyx, ints, fake.asarray(np.array([0])), -10)
    assert fake.asnumpy(ints).tolist() == [2**40, -17]
    for dtype in ("bool", "int16"):
        with pytest.raises(TypeError):
            student.scatter_add(fake.cupyx, fake.zeros(2, dtype=dtype), fake.asarray(np.array([0])), 1)


@check(points=2, hint="from_host makes the backend's GPU current (self.make_current()) and copies with "
                      "self._cupy.asarray; to_host copies back with self._cupy.asnumpy")
def test_copies_land_on_the_backends_gpu(student):
    fake = FakeCupy(devices=2)
    gpu1 = backend(student, fake)
    fake.cuda.Device(0).use()
    data = np.arange(6.0).reshape(3, 2)
    on_gpu = gpu1.from_host(data)
    assert on_gpu.device.id == 1, "the copy must be made on GPU 1, not on the GPU that happened to be current"
    data[0, 0] = 50.0
    back = gpu1.to_host(on_gpu)
    assert type(back) is np.ndarray and back.tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    back[1, 1] = -1.0
    assert gpu1.to_host(on_gpu)[1, 1] == 3.0, "to_host returns a copy"


@check(points=1, hint="to_host raises TypeError (naming the backend's device) for an array that is not on its "
                      "GPU: check self.is_array(array) first")
def test_to_host_refuses_other_devices(student):
    fake = FakeCupy(devices=2)
    gpu1 = backend(student, fake)
    with fake.cuda.Device(0):
        elsewhere = fake.zeros(2)
    for wrong in (elsewhere, np.zeros(2)):
        with pytest.raises(TypeError):
            gpu1.to_host(wrong)


@check(points=1, hint="the backend's random draws re-seed its generator from DrawCounter.next_seed(); "
                      "rng_state / set_rng_state are the counter's state()/load_state()")
def test_backend_random_numbers_resume_exactly(student):
    fake = FakeCupy(devices=2)
    gpu1 = backend(student, fake)
    gpu1.seed(8)
    state = gpu1.rng_state()
    first = [fake.asnumpy(gpu1.random_normal((4,))), fake.asnumpy(gpu1.random_uniform((2, 2)))]
    gpu1.set_rng_state(pickle.loads(pickle.dumps(state)))
    again = [fake.asnumpy(gpu1.random_normal((4,))), fake.asnumpy(gpu1.random_uniform((2, 2)))]
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not np.array_equal(first[0], fake.asnumpy(gpu1.random_normal((4,))))
