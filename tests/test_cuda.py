"""The CUDA backend (Module 12) without a GPU, and with one where there is one.

Three kinds of tests:

* **No CuPy.** ``import cupy`` is made to fail (``sys.modules["cupy"] = None``),
  and the errors must say how to install the right wheel; checkpoints from a GPU
  machine must still load.
* **A FAKE CuPy.** :class:`tinytrain.testing.fake_cupy.FakeCupy` is *not* CuPy and not a
  GPU: it is a stand-in built on the strict device that behaves the way CuPy
  documents (arrays on a *current* device, ``cupy.asarray`` copying host data,
  ``cupyx.scatter_add``'s dtype rules, cuRAND generators bound to a device). It
  drives :class:`tinytrain.cuda.CupyBackend`'s own logic: device-index checks,
  which device arrays land on, scatter-add routing, the random stream's state.
  ``tinytrain doctor``'s GPU report (:mod:`tinytrain.course.gpu`) is driven the
  same way, with its probes of the driver and of the installed packages replaced.
* **A real GPU** (skipped without one): the same properties on CuPy itself.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import json
import pickle
import sys
import warnings

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinytrain as tt
from tinytrain import backend as registry
from tinytrain import cuda
from tinytrain.serialization import capture_rng_state, read_checkpoint, restore_rng_state, to_plain, write_checkpoint
from tinytrain.course import gpu as gpu_check
from tinytrain.course.gpu import gpu_report
from tinytrain.cuda import GENERATOR, CupyBackend, DrawCounter, _OnDevice, draw_seed, scatter_add
from tinytrain.testing.fake_cupy import FakeCupy, forget_fake_gpu, register_fake_gpu
from tinytrain.testing.strict import StrictArray


def _gpu() -> bool:
    try:
        tt.get_backend("cuda")
    except (RuntimeError, ValueError):
        return False
    return True


needs_gpu = pytest.mark.skipif(not _gpu(), reason="needs CuPy and a CUDA GPU")


@pytest.fixture
def no_cupy(monkeypatch):
    """``import cupy`` fails, as on a machine without CuPy; no CUDA backend is cached."""
    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.setitem(sys.modules, "cupyx", None)
    for name in [name for name in registry._BACKENDS if name.startswith("cuda")]:
        monkeypatch.delitem(registry._BACKENDS, name)


@pytest.fixture
def fake() -> FakeCupy:
    return FakeCupy(devices=2)


def gpu(fake: FakeCupy, index: int = 1) -> CupyBackend:
    return CupyBackend(f"cuda:{index}", cupy=fake, cupyx=fake.cupyx)


def host(fake: FakeCupy, array) -> np.ndarray:
    return fake.asnumpy(array)


# -- without CuPy: clear errors with the install command ---------------------------------------------
def test_asking_for_cuda_without_cupy_says_how_to_install_it(no_cupy) -> None:
    hint = r"needs CuPy, which is not installed.*tinytrain\[cuda12\].*tinytrain\[cuda13\]"
    with pytest.raises(RuntimeError, match=hint):
        tt.zeros(2, device="cuda")
    with pytest.raises(RuntimeError, match="not installed"):
        tt.ones(2).to("cuda:1")
    assert not any(name.startswith("cuda") for name in registry._BACKENDS), "a failed backend is not cached"
    assert tt.zeros(2).device == "cpu", "the CPU is unaffected"


def test_a_cupy_that_fails_to_import_is_reported_as_broken_not_missing(monkeypatch) -> None:
    monkeypatch.setattr(cuda.importlib.util, "find_spec", lambda name: importlib.machinery.ModuleSpec(name, None))

    def broken(name):
        raise ImportError("libcudart.so.12: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(cuda.importlib, "import_module", broken)
    broken_hint = r"installed but cannot use a GPU \(ImportError: libcudart.so.12.*tinytrain\[cuda12\]"
    with pytest.raises(RuntimeError, match=broken_hint):
        cuda._import_cupy()


def test_a_cupy_that_sees_no_gpu_says_so(monkeypatch, fake) -> None:
    fake.__spec__ = importlib.machinery.ModuleSpec("cupy", None)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setitem(sys.modules, "cupyx", fake.cupyx)
    assert cuda._import_cupy() == (fake, fake.cupyx)
    monkeypatch.setattr(fake, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="finds no usable CUDA GPU.*nvidia-smi"):
        cuda._import_cupy()

    def raises():
        raise RuntimeError("CUDA driver version is insufficient for CUDA runtime version")

    monkeypatch.setattr(fake, "is_available", raises)
    with pytest.raises(RuntimeError, match="insufficient.*tinytrain doctor"):
        cuda._import_cupy()


def test_a_gpu_checkpoint_loads_without_cupy_skipping_the_gpu_generator(no_cupy, tmp_path) -> None:
    tt.manual_seed(0)
    state = capture_rng_state()
    state["backends"]["cuda:0"] = DrawCounter(seed=1).state()  # as saved on a GPU machine
    write_checkpoint(tmp_path / "rng.ckpt", {"rng": state})
    expected = np.random.rand()
    np.random.seed(5)
    with pytest.warns(RuntimeWarning, match=r"cuda:0.*not installed"):
        restore_rng_state(read_checkpoint(tmp_path / "rng.ckpt")["rng"])
    assert np.random.rand() == expected, "the other generators are restored"


# -- the cost model ------------------------------------------------------------------------------------
def test_matmul_cost_and_roofline() -> None:
    assert cuda.matmul_cost(128, 784, 256) == (2 * 128 * 784 * 256, 4 * (128 * 784 + 784 * 256 + 128 * 256))
    assert cuda.roofline_seconds(10.0, 1.0, peak_flops=10.0, bandwidth=10.0, launch_seconds=2.0) == 3.0
    assert cuda.roofline_seconds(1.0, 10.0, peak_flops=10.0, bandwidth=10.0) == 1.0


# -- the random stream ---------------------------------------------------------------------------------
def test_draw_seed_is_splitmix64() -> None:
    # SplitMix64 seeded with 0 (Steele, Lea & Flood 2014) starts e220a8397b1dcdaf, 6e789e6aa1b965f4, 06c45d188009454f
    assert [draw_seed(0, i) for i in range(3)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    assert draw_seed(2**64 - 1, 10**6) < 2**64


def test_draw_counter_state_is_plain_data_that_survives_a_checkpoint(tmp_path) -> None:
    stream = DrawCounter(seed=2**64 - 5)
    stream.next_seed()
    write_checkpoint(tmp_path / "s.ckpt", {"stream": stream.state()})
    saved = read_checkpoint(tmp_path / "s.ckpt")["stream"]
    assert saved == {"generator": GENERATOR, "seed": 2**64 - 5, "draws": 1} == to_plain(stream.state())
    expected = [stream.next_seed() for _ in range(3)]
    stream.load_state(saved)
    assert [stream.next_seed() for _ in range(3)] == expected


@pytest.mark.parametrize("bad", [None, [], {"generator": GENERATOR, "seed": 1},
                                 {"generator": "xorwow", "seed": 1, "draws": 0},
                                 {"generator": GENERATOR, "seed": 1.5, "draws": 0},
                                 {"generator": GENERATOR, "seed": 1, "draws": -2},
                                 {"bit_generator": "PCG64", "state": {"state": 1, "inc": 3}}])
def test_draw_counter_refuses_foreign_states(bad) -> None:
    with pytest.raises(ValueError, match="not the random state of a CUDA device"):
        DrawCounter(seed=0).load_state(bad)


def test_backend_random_numbers_resume_exactly(fake) -> None:
    backend = gpu(fake)
    backend.seed(11)
    backend.random_uniform((2,))
    state = pickle.loads(pickle.dumps(backend.rng_state()))
    draws = [backend.random_normal((3, 4)), backend.random_uniform((5,), "float64"), backend.permutation(7)]
    backend.set_rng_state(state)
    again = [backend.random_normal((3, 4)), backend.random_uniform((5,), "float64"), backend.permutation(7)]
    for a, b in zip(draws, again):
        assert a.dtype == b.dtype and np.array_equal(host(fake, a), host(fake, b))
    assert draws[0].dtype == np.float32 and draws[1].dtype == np.float64 and draws[2].dtype == np.int64
    assert sorted(host(fake, draws[2]).tolist()) == list(range(7))
    backend.seed(11)
    backend.random_uniform((2,))
    assert np.array_equal(host(fake, backend.random_normal((3, 4))), host(fake, draws[0])), "seeding repeats"


def test_each_draw_reseeds_the_philox_generator_with_a_numpy_uint64(fake) -> None:
    backend = gpu(fake)
    assert backend._generator.method == fake.cuda.curand.CURAND_RNG_PSEUDO_PHILOX4_32_10
    with pytest.raises(TypeError):  # the fake takes seeds as strictly as CuPy's seed() does under NumPy 2
        fake.random.RandomState(5)
    backend.seed(3)
    backend.random_normal((2,))
    backend.random_normal((2,))
    assert backend.rng_state() == {"generator": GENERATOR, "seed": 3, "draws": 2}


def test_bad_random_dtypes_raise_without_using_a_draw(fake) -> None:
    backend = gpu(fake)
    before = backend.rng_state()
    with pytest.raises(TypeError, match="float16"):
        backend.random_normal((2,), "float16")
    with pytest.raises(TypeError, match="int32"):
        backend.random_uniform((2,), "int32")
    assert backend.rng_state() == before


def test_seed_none_picks_a_random_seed_that_the_state_records(fake) -> None:
    backend = gpu(fake)
    backend.seed(None)
    state = backend.rng_state()
    assert 0 <= state["seed"] < 2**64 and state["draws"] == 0
    first = host(fake, backend.random_uniform((4,)))
    backend.set_rng_state(state)
    assert np.array_equal(host(fake, backend.random_uniform((4,))), first)


def test_each_gpu_has_its_own_stream(fake) -> None:
    gpu0, gpu1 = gpu(fake, 0), gpu(fake, 1)
    gpu0.seed(4)
    gpu1.seed(4)
    first = host(fake, gpu0.random_uniform((3,)))
    gpu1.random_uniform((3,))
    gpu1.random_uniform((3,))
    assert gpu0.rng_state()["draws"] == 1 and gpu1.rng_state()["draws"] == 2
    gpu0.seed(4)
    assert np.array_equal(host(fake, gpu0.random_uniform((3,))), first), "draws on GPU 1 leave GPU 0's stream alone"


def test_set_rng_state_refuses_a_numpy_state(fake) -> None:
    with pytest.raises(ValueError, match="not the random state of a CUDA device"):
        gpu(fake).set_rng_state(tt.get_backend("cpu").rng_state())


def test_manual_seed_and_checkpoints_cover_a_cuda_backend(fake, monkeypatch) -> None:
    backend = gpu(fake)
    monkeypatch.setitem(registry._BACKENDS, "cuda:1", backend)
    tt.manual_seed(21)
    assert backend.rng_state() == {"generator": GENERATOR, "seed": 21, "draws": 0}
    backend.random_normal((2,))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        state = capture_rng_state()
    assert state["backends"]["cuda:1"] == backend.rng_state()
    expected = host(fake, backend.random_normal((3,)))
    restore_rng_state(pickle.loads(pickle.dumps(state)))
    assert np.array_equal(host(fake, backend.random_normal((3,))), expected)


# -- devices: which GPU arrays land on ---------------------------------------------------------------------
def test_a_gpu_that_does_not_exist_is_refused(fake) -> None:
    expected = r"'cuda:2' does not exist.*2 CUDA GPU\(s\) \(cuda:0, cuda:1\).*CUDA_VISIBLE_DEVICES"
    with pytest.raises(RuntimeError, match=expected):
        gpu(fake, 2)


def test_creating_a_backend_leaves_the_current_device_alone(fake) -> None:
    backend = gpu(fake, 1)
    assert fake.cuda.runtime.getDevice() == 0
    assert backend._generator.device_id == 1, "its cuRAND generator is made on its own GPU"


@pytest.mark.parametrize("make", [
    lambda b: b.from_host(np.ones((2, 3))),
    lambda b: b.asarray([1.0, 2.0]),
    lambda b: b.random_normal((2, 2)),
    lambda b: b.random_uniform((2,)),
    lambda b: b.permutation(4),
    lambda b: b.xp.zeros(3),
    lambda b: b.xp.ones_like(b.from_host(np.ones(2))),
    lambda b: b.xp.arange(4),
    lambda b: b.pad(b.from_host(np.ones((2, 2))), ((1, 1), (0, 0))),
    lambda b: b.xp.stack([b.from_host(np.ones(2)), b.from_host(np.ones(2))]),
    lambda b: b.xp.lib.stride_tricks.sliding_window_view(b.from_host(np.arange(5.0)), 3) * 1,
], ids=["from_host", "asarray", "random_normal", "random_uniform", "permutation", "xp.zeros", "xp.ones_like",
        "xp.arange", "pad", "xp.stack", "xp.lib submodule"])
def test_arrays_of_cuda_1_are_made_on_gpu_1_whatever_is_current(fake, make) -> None:
    backend = gpu(fake)
    fake.cuda.Device(0).use()
    array = make(backend)
    assert array.device.id == 1 and backend.is_array(array)
    assert fake.cuda.runtime.getDevice() == 1, "the backend leaves its GPU current for the work that follows"


def test_the_namespace_passes_types_and_constants_through(fake) -> None:
    xp = gpu(fake).xp
    assert isinstance(xp, _OnDevice)
    assert xp.ndarray is StrictArray and xp.float32 is np.float32 and xp.pi == np.pi and xp.newaxis is None
    target = gpu(fake).xp.zeros(3)
    xp.add.at(target, fake.asarray(np.array([0, 0])), 1.0)  # ufunc methods are wrapped too
    assert host(fake, target).tolist() == [2.0, 0.0, 0.0]
    assert xp.zeros is xp.zeros, "wrapped functions are cached"


def test_with_one_gpu_the_namespace_is_cupy_itself() -> None:
    single = FakeCupy(devices=1)
    backend = CupyBackend("cuda:0", cupy=single, cupyx=single.cupyx)
    assert backend.xp is single


def test_switching_devices_only_when_needed(fake) -> None:
    backend = gpu(fake)
    backend.from_host(np.ones(2))
    calls = fake.cuda.runtime.set_device_calls
    for _ in range(5):
        backend.from_host(np.ones(2))
        backend.xp.zeros(2)
    assert fake.cuda.runtime.set_device_calls == calls, "an already current device is not set again"


def test_is_array_and_to_host_tell_devices_apart(fake) -> None:
    gpu0, gpu1 = gpu(fake, 0), gpu(fake, 1)
    a1 = gpu1.from_host(np.arange(3.0))
    assert gpu1.is_array(a1) and not gpu0.is_array(a1)
    assert not gpu1.is_array(np.arange(3.0)) and not gpu1.is_array(tt.get_backend("strict").from_host(np.ones(2)))
    copy = gpu1.to_host(a1)
    assert type(copy) is np.ndarray and copy.tolist() == [0.0, 1.0, 2.0]
    copy[0] = 9.0
    assert gpu1.to_host(a1)[0] == 0.0
    for other in (gpu0.from_host(np.ones(2)), np.ones(2), tt.get_backend("strict").from_host(np.ones(2))):
        with pytest.raises(TypeError, match="cuda:1"):
            gpu1.to_host(other)


def test_host_and_device_copies_keep_a_column_major_array_so(fake) -> None:
    """A ``Linear`` weight is column-major; CuPy's asnumpy makes row-major copies unless told
    ``order="A"``, so the trip to a GPU and back would otherwise change its order."""
    from tinytrain.backend import memory_order

    weight = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    on_gpu = gpu(fake).from_host(weight)
    assert memory_order(on_gpu) == "F" and memory_order(fake.asnumpy(on_gpu)) == "C"  # CuPy's default
    back = gpu(fake).to_host(on_gpu)
    assert memory_order(back) == "F" and np.array_equal(back, weight)
    assert memory_order(gpu(fake).to_host(gpu(fake).from_host(np.ones((2, 3))))) == "C"


def test_from_host_copies(fake) -> None:
    source = np.zeros(3)
    on_gpu = gpu(fake).from_host(source)
    source[0] = 5.0
    assert host(fake, on_gpu)[0] == 0.0


def test_the_fake_refuses_what_cupy_refuses(fake) -> None:
    array = fake.asarray(np.ones(3))
    with pytest.raises(TypeError):
        np.asarray(array)
    with pytest.raises(TypeError):
        array + np.ones(3)
    with fake.cuda.Device(1):
        other = fake.zeros(3)
    with pytest.raises(TypeError, match="mix"):
        array + other
    generator = fake.random.RandomState(np.uint64(1))
    fake.cuda.Device(1).use()
    with pytest.raises(RuntimeError, match="generator lives on device 0"):
        generator.standard_normal((2,))
    with pytest.raises(TypeError, match="scatter_add only supports"):
        fake.cupyx.scatter_add(fake.zeros(2, dtype=np.int64), fake.asarray(np.array([0])), 1)


# -- scatter-add routing ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32", "uint32", "uint64"])
def test_supported_dtypes_go_straight_to_cupyx(fake, dtype) -> None:
    target = fake.zeros((4, 2), dtype=dtype)
    index = fake.asarray(np.array([3, 0, 3]))
    scatter_add(fake.cupyx, target, index, fake.asarray(np.ones((3, 2), dtype=dtype)))
    expected = np.zeros((4, 2), dtype=dtype)
    np.add.at(expected, np.array([3, 0, 3]), 1)
    assert np.array_equal(host(fake, target), expected) and fake.cupyx.scatter_add_dtypes[-1] == np.dtype(dtype)


def test_int64_goes_through_a_uint64_view_with_exact_wraparound(fake) -> None:
    big = np.array([2**62, -(2**62), 5, -7], dtype=np.int64)
    target = fake.asarray(big.copy())
    index = (fake.asarray(np.array([0, 0, 1, 3])),)
    values = fake.asarray(np.array([2**62, 3, -5, -(2**63) + 7], dtype=np.int64))
    scatter_add(fake.cupyx, target, index, values)
    expected = big.copy()
    with np.errstate(over="ignore"):
        np.add.at(expected, np.array([0, 0, 1, 3]), np.array([2**62, 3, -5, -(2**63) + 7], dtype=np.int64))
    assert target.dtype == np.int64 and np.array_equal(host(fake, target), expected)
    assert fake.cupyx.scatter_add_dtypes[-1] == np.uint64
    scatter_add(fake.cupyx, target, fake.asarray(np.array([2])), -3)  # a Python number
    assert host(fake, target)[2] == 2


@given(rows=st.integers(1, 6), indices=st.lists(st.integers(0, 5), min_size=1, max_size=20),
       dtype=st.sampled_from(["int64", "float64", "int32", "uint64"]), seed=st.integers(0, 2**32 - 1))
def test_scatter_add_equals_numpy_add_at(rows, indices, dtype, seed) -> None:
    fake = FakeCupy(devices=1)
    index = np.array([i % rows for i in indices])
    rng = np.random.default_rng(seed)
    start = rng.integers(-(2**40), 2**40, (rows, 2)).astype(dtype)
    values = rng.integers(-(2**40), 2**40, (len(index), 2)).astype(dtype)
    expected = start.copy()
    with np.errstate(over="ignore"):
        np.add.at(expected, index, values)
    target = fake.asarray(start)
    scatter_add(fake.cupyx, target, fake.asarray(index), fake.asarray(values))
    assert target.dtype == np.dtype(dtype) and np.array_equal(host(fake, target), expected)


def test_two_dimensional_integer_indices(fake) -> None:
    target = fake.zeros((3, 3), dtype=np.float32)
    rows, cols = fake.asarray(np.array([0, 0, 2])), fake.asarray(np.array([1, 1, 2]))
    scatter_add(fake.cupyx, target, (rows, cols), fake.asarray(np.array([1.0, 2.0, 4.0], dtype=np.float32)))
    assert host(fake, target)[0, 1] == 3.0 and host(fake, target)[2, 2] == 4.0


@pytest.mark.parametrize("dtype", ["bool", "int8", "int16", "uint8", "complex64"])
def test_unsupported_dtypes_raise_naming_the_dtype(fake, dtype) -> None:
    with pytest.raises(TypeError, match=dtype):
        scatter_add(fake.cupyx, fake.zeros(2, dtype=dtype), fake.asarray(np.array([0])), 1)


def test_the_backend_routes_its_scatter_add_on_its_gpu(fake) -> None:
    backend = gpu(fake)
    grads = backend.from_host(np.zeros(3, dtype=np.float32))
    fake.cuda.Device(0).use()
    backend.scatter_add(grads, backend.from_host(np.array([1, 1])), backend.from_host(np.ones(2, dtype=np.float32)))
    assert backend.to_host(grads).tolist() == [0.0, 2.0, 0.0]


# -- gpu_report ---------------------------------------------------------------------------------------------
@pytest.fixture
def machine(monkeypatch):
    """Set what gpu_report sees: ``machine(packages=[...], driver=12040, cupy=module_or_None)``."""

    def configure(packages=(), driver=None, cupy=None):
        monkeypatch.setattr(gpu_check, "_cupy_packages", lambda: list(packages))
        monkeypatch.setattr(gpu_check, "_driver_cuda_version", lambda: driver)
        monkeypatch.setitem(sys.modules, "cupy", cupy)

    return configure


def lines(report) -> str:
    return "\n".join(f"{ok} | {line} | {fix}" for ok, line, fix in report)


def test_report_without_driver_or_cupy_is_fine(machine) -> None:
    machine()
    [(ok, line, fix)] = gpu_report()
    assert ok and "no NVIDIA driver" in line and "CPU" in line and fix is None


@pytest.mark.parametrize("driver,extra", [(12040, "tinytrain[cuda12]"), (13000, "tinytrain[cuda13]"),
                                          (11080, "update the NVIDIA driver")])
def test_report_with_a_driver_but_no_cupy_says_which_wheel_to_install(machine, driver, extra) -> None:
    machine(driver=driver)
    [(ok, line, fix)] = gpu_report()
    assert ok and "CuPy is not installed" in line and extra in fix
    assert f"CUDA {driver // 1000}.{driver % 1000 // 10}" in line


def test_report_two_cupy_packages(machine) -> None:
    machine(packages=[("cupy-cuda12x", "13.3.0"), ("cupy-cuda13x", "13.6.0")], driver=13000, cupy=FakeCupy(1))
    report = gpu_report()
    assert not report[0][0] and "2 CuPy packages" in report[0][1]
    assert "pip uninstall -y cupy-cuda12x cupy-cuda13x" in report[0][2]


def test_report_a_wheel_newer_than_the_driver(machine) -> None:
    machine(packages=[("cupy-cuda13x", "13.6.0")], driver=12040)
    report = gpu_report()
    assert report[0][0] and "cupy-cuda13x" in report[0][1]
    ok, line, fix = report[-1]
    assert not ok and "needs a driver for CUDA 13" in line and "CUDA 12.4" in line
    assert "update the NVIDIA driver" in fix and "tinytrain[cuda12]" in fix


def test_report_a_wheel_without_a_driver(machine) -> None:
    machine(packages=[("cupy-cuda12x", "13.3.0")])
    ok, line, fix = gpu_report()[-1]
    assert not ok and "no NVIDIA driver" in line and "pip uninstall -y cupy-cuda12x" in fix


def test_report_a_working_gpu(machine) -> None:
    fake = FakeCupy(devices=2, runtime_version=12080, driver_version=13000)
    machine(packages=[("cupy-cuda12x", "13.3.0")], driver=13000, cupy=fake)
    report = gpu_report()
    assert all(ok for ok, _, _ in report), lines(report)
    text = lines(report)
    assert "CuPy 13.3.0 (package cupy-cuda12x, built for CUDA 12)" in text
    assert "CUDA 13.0" in text and "CUDA 12.8 runtime" in text and "2 GPU(s)" in text
    assert "cuda:1: Fake GPU 1" in text and "compute capability 8.0" in text
    assert "runs kernels on cuda:0" in report[-1][1]
    assert fake.cuda.runtime.getDevice() == 0, "the report leaves the current device as it was"


def test_report_a_gpu_too_old_for_cuda_13(machine) -> None:
    machine(packages=[("cupy-cuda13x", "13.6.0")], driver=13000, cupy=FakeCupy(1, compute_capability=(7, 0)))
    failures = [(line, fix) for ok, line, fix in gpu_report() if not ok]
    assert len(failures) == 1
    line, fix = failures[0]
    assert "compute capability 7.0" in line and "too old for CUDA 13" in line and "tinytrain[cuda12]" in fix


def test_report_missing_cuda_libraries_suggests_the_toolkit_or_ctk(machine) -> None:
    fake = FakeCupy(1)

    def nvrtc_missing(*args, **kwargs):
        raise RuntimeError("CuPy failed to load libnvrtc.so.12: OSError: libnvrtc.so.12: "
                           "cannot open shared object file")

    fake.arange = nvrtc_missing
    machine(packages=[("cupy-cuda12x", "13.3.0")], driver=13000, cupy=fake)
    ok, line, fix = gpu_report()[-1]
    assert not ok and "cannot run a kernel" in line and "libnvrtc.so.12" in line
    assert "CUDA Toolkit 12.x" in fix and "pip install 'cupy-cuda12x[ctk]'" in fix and "tinytrain[cuda13]" in fix


def test_report_a_cupy_that_does_not_import(machine, monkeypatch) -> None:
    machine(packages=[("cupy-cuda12x", "13.3.0")], driver=12040)
    real = importlib.import_module

    def failing(name, *args):
        if name == "cupy":
            raise ImportError("libcublas.so.12: cannot open shared object file")
        return real(name, *args)

    monkeypatch.setattr(cuda.importlib, "import_module", failing)
    ok, line, fix = gpu_report()[-1]
    assert not ok and "cannot reach the GPU" in line and "[ctk]" in fix


@pytest.mark.parametrize("message,advice", [
    ("cudaErrorNoDevice: no CUDA-capable device is detected", "CUDA_VISIBLE_DEVICES"),
    ("cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version", "update the driver"),
])
def test_report_explains_runtime_errors(machine, message, advice) -> None:
    fake = FakeCupy(1)

    def fails():
        raise RuntimeError(message)

    fake.cuda.runtime.getDeviceCount = fails
    machine(packages=[("cupy-cuda12x", "13.3.0")], driver=12040, cupy=fake)
    ok, line, fix = gpu_report()[-1]
    assert not ok and message in line and advice in fix


def test_report_never_raises(machine) -> None:
    fake = FakeCupy(1)
    fake.cuda.runtime.getDeviceProperties = lambda index: (_ for _ in ()).throw(RuntimeError("boom"))
    machine(packages=[("cupy-cuda12x", "13.3.0")], driver=12040, cupy=fake)
    report = gpu_report()
    assert any(not ok and "boom" in line for ok, line, _ in report)


def test_package_names_and_probes() -> None:
    assert gpu_check._package_cuda_major("cupy-cuda12x") == 12 and gpu_check._package_cuda_major("cupy-cuda13x") == 13
    assert gpu_check._package_cuda_major("cupy-cuda110") == 11 and gpu_check._package_cuda_major("cupy") is None
    assert gpu_check._package_cuda_major("cupy-rocm-5-0") is None and gpu_check._cuda_text(12040) == "12.4"
    assert all(name.startswith("cupy") for name, _ in gpu_check._cupy_packages())
    driver = gpu_check._driver_cuda_version()
    assert driver is None or driver >= 1000


def test_report_on_this_machine_runs() -> None:
    report = gpu_report()
    assert report and all(isinstance(ok, bool) and isinstance(line, str) for ok, line, _ in report)


# -- benchmarks/gpu.py ------------------------------------------------------------------------------------
@pytest.fixture
def gpu_benchmark(monkeypatch):
    """benchmarks/gpu.py as a module, timing the tiny MLP only."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu.py"
    spec = importlib.util.spec_from_file_location("gpu_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "MODELS", {k: v for k, v in module.MODELS.items() if k.startswith("mlp-digits")})
    return module


def test_the_benchmark_without_a_gpu_says_why_and_times_the_cpu(gpu_benchmark, no_cupy, tmp_path, capsys) -> None:
    assert gpu_benchmark.main(["--quick", "--json", str(tmp_path / "report.json")]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("No GPU: device 'cuda' needs CuPy, which is not installed") and "CPU only" in printed
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["gpu"] is None and "not installed" in report["skipped"]
    [row] = report["results"]
    assert row["cpu_ms"] > 0 and row["gpu_ms"] is None and row["speedup"] is None


def test_the_benchmark_on_the_fake_gpu_compares_both(gpu_benchmark, capsys) -> None:
    register_fake_gpu(CupyBackend, devices=2)
    try:
        assert gpu_benchmark.main(["--quick", "--device", "fakecuda:1", "--json"]) == 0
    finally:
        forget_fake_gpu()
    report = json.loads(capsys.readouterr().out)
    assert report["skipped"] is None and report["gpu"]["device"] == "fakecuda:1"
    assert report["gpu"]["name"].startswith("Fake GPU 1") and report["gpu"]["cuda_runtime"] == "12.8"
    [row] = report["results"]
    assert row["gpu_ms"] > 0 and row["speedup"] == pytest.approx(row["cpu_ms"] / row["gpu_ms"])


# -- a real GPU -------------------------------------------------------------------------------------------
@needs_gpu
def test_real_gpu_backend_round_trip_scatter_and_rng() -> None:
    backend = tt.get_backend("cuda")
    array = backend.from_host(np.arange(6.0, dtype=np.float32))
    assert backend.is_array(array) and backend.to_host(array).tolist() == list(range(6))
    counts = backend.from_host(np.array([2**62, -3], dtype=np.int64))
    backend.scatter_add(counts, backend.from_host(np.array([0, 0, 1])), backend.from_host(np.array([2**62, 1, -4])))
    expected = np.array([2**62, -3], dtype=np.int64)
    with np.errstate(over="ignore"):
        np.add.at(expected, [0, 0, 1], np.array([2**62, 1, -4], dtype=np.int64))
    assert backend.to_host(counts).tolist() == expected.tolist()
    backend.seed(5)
    state = backend.rng_state()
    draws = [backend.to_host(backend.random_normal((64,))), backend.to_host(backend.random_uniform((9,), "float64")),
             backend.to_host(backend.permutation(10))]
    backend.set_rng_state(state)
    again = [backend.to_host(backend.random_normal((64,))), backend.to_host(backend.random_uniform((9,), "float64")),
             backend.to_host(backend.permutation(10))]
    assert all(np.array_equal(a, b) for a, b in zip(draws, again))
    assert abs(draws[0].mean()) < 0.5 and sorted(draws[2].tolist()) == list(range(10))


@needs_gpu
def test_real_gpu_report_is_all_ok() -> None:
    report = gpu_report()
    assert all(ok for ok, _, _ in report), lines(report)


@pytest.mark.skipif(not _gpu() or __import__("cupy").cuda.runtime.getDeviceCount() < 2, reason="needs two CUDA GPUs")
def test_real_second_gpu_gets_its_arrays() -> None:
    import cupy

    gpu1 = tt.get_backend("cuda:1")
    cupy.cuda.Device(0).use()
    for array in (gpu1.from_host(np.ones(3)), gpu1.xp.zeros(3), gpu1.random_normal((3,))):
        assert array.device.id == 1
    x = tt.randn(4, 4, device="cuda:1", requires_grad=True)
    (x @ x).sum().backward()
    assert x.grad.data.device.id == 1
