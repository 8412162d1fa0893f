"""The strict device: StrictArrays refuse host/device leaks and otherwise act like NumPy.

The whole suite runs on device "strict" so that CI, which has no GPU, catches
code that would break on CuPy. That only works if the stand-in is right both
ways: every leak CuPy refuses must raise here (else the bug slips through), and
everything CuPy allows must compute exactly what NumPy computes (else correct
code fails). Each test checks one side of that contract.
"""
from __future__ import annotations

import copy
import operator
import pickle
from typing import Any, Callable

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinytrain.backend import NumpyBackend, backend_of_array, get_backend
from tinytrain.testing.strict import StrictArray, StrictBackend, float64_promotions, host_reads

strict = get_backend("strict")
strict1 = get_backend("strict:1")
xp = strict.xp

float_arrays = hnp.arrays(
    np.float32,
    hnp.array_shapes(min_dims=1, max_dims=3, max_side=4),
    elements=st.floats(-10, 10, width=32),
)


def on_device(host: np.ndarray) -> StrictArray:
    return strict.from_host(host)


def assert_same(result: Any, expected: np.ndarray) -> None:
    """``result`` is a strict array holding exactly NumPy's ``expected``."""
    assert isinstance(result, StrictArray) and result.device == "strict:0"
    value = strict.to_host(result)
    assert value.dtype == np.asarray(expected).dtype
    np.testing.assert_array_equal(value, expected)


# -- the registry ---------------------------------------------------------------
def test_registry_gives_one_backend_per_strict_device() -> None:
    assert isinstance(strict, StrictBackend) and strict.device == "strict:0"
    assert get_backend("strict:0") is strict
    assert strict1 is not strict and strict1.device == "strict:1"
    assert strict.xp.ndarray is StrictArray


def test_is_array_and_backend_of_array_tell_devices_apart() -> None:
    a, b = on_device(np.ones(2)), strict1.from_host(np.ones(2))
    assert strict.is_array(a) and not strict.is_array(b) and not strict.is_array(np.ones(2))
    assert backend_of_array(a) is strict and backend_of_array(b) is strict1


# -- leaks that must fail ---------------------------------------------------------
@pytest.mark.parametrize(
    "convert",
    [np.asarray, np.array, np.asanyarray, np.ascontiguousarray, lambda a: np.array([a, a]), memoryview],
    ids=["asarray", "array", "asanyarray", "ascontiguousarray", "array-of-list", "memoryview"],
)
def test_implicit_conversion_to_numpy_raises(convert: Callable[[Any], Any]) -> None:
    with pytest.raises(TypeError):
        convert(on_device(np.ones(3)))


def test_conversion_error_says_how_to_copy_to_host() -> None:
    with pytest.raises(TypeError, match="to_host"):
        np.asarray(on_device(np.ones(3)))


@pytest.mark.parametrize(
    "mix",
    [
        lambda a, h: np.add(a, h),
        lambda a, h: a + h,
        lambda a, h: h + a,
        lambda a, h: a @ h,
        lambda a, h: np.concatenate([a, h]),
        lambda a, h: np.where(a > 0, a, h),
        lambda a, h: a[h.astype(np.int64)],
        lambda a, h: a[h > 0],
        lambda a, h: a.__setitem__(slice(None), h),
        lambda a, h: xp.exp(h),
        lambda a, h: xp.asarray(h),
        lambda a, h: strict.asarray(h),
        lambda a, h: strict.scatter_add(a, np.array([0, 1]), 1.0),
    ],
    ids=[
        "np.add", "a+h", "h+a", "matmul", "concatenate", "where", "int-index", "bool-index",
        "setitem", "xp.exp", "xp.asarray", "backend.asarray", "scatter_add-index",
    ],
)
def test_mixing_with_host_arrays_raises(mix: Callable[[StrictArray, np.ndarray], Any]) -> None:
    with pytest.raises(TypeError, match=r"numpy\.ndarray.*StrictArray"):
        mix(on_device(np.ones((3, 3))), np.ones((3, 3)))


def test_in_place_ops_mixing_host_arrays_raise_and_leave_both_unchanged() -> None:
    a, h = on_device(np.ones(3)), np.ones(3)
    with pytest.raises(TypeError):
        a += h
    with pytest.raises(TypeError):
        h += a
    np.testing.assert_array_equal(strict.to_host(a), np.ones(3))
    np.testing.assert_array_equal(h, np.ones(3))


def test_lists_are_not_operands() -> None:
    """CuPy's ufuncs reject lists; Python data enters through asarray instead."""
    with pytest.raises(TypeError):
        on_device(np.ones(3)) + [1, 2, 3]
    with pytest.raises(TypeError, match="scalar"):
        on_device(np.ones(3))[:] = [1, 2, 3]


@pytest.mark.parametrize(
    "name", ["data", "ctypes", "flat", "tobytes", "__array_interface__", "__array_struct__"]
)
def test_host_memory_attributes_are_not_offered(name: str) -> None:
    assert not hasattr(on_device(np.ones(3)), name)


def test_random_is_not_in_the_namespace() -> None:
    with pytest.raises(AttributeError, match="backend"):
        xp.random


# -- two strict devices ---------------------------------------------------------------
@pytest.mark.parametrize(
    "mix",
    [
        lambda a, b: a + b,
        lambda a, b: np.concatenate([a, b]),
        lambda a, b: a[b.astype(np.int64)],
        lambda a, b: a.__setitem__(0, b[0]),
        lambda a, b: strict.xp.exp(b),
        lambda a, b: strict.asarray(b),
        lambda a, b: strict.to_host(b),
        lambda a, b: strict.scatter_add(b, 0, 1.0),
    ],
    ids=[
        "add", "concatenate", "index", "setitem", "xp-of-other-device", "asarray", "to_host", "scatter_add",
    ],
)
def test_arrays_of_two_strict_devices_refuse_to_mix(
    mix: Callable[[StrictArray, StrictArray], Any],
) -> None:
    a, b = on_device(np.zeros(3)), strict1.from_host(np.zeros(3))
    with pytest.raises(TypeError, match="strict:1"):
        mix(a, b)


# -- what is allowed: scalars -------------------------------------------------------------
@pytest.mark.parametrize(
    "scalar", [2, 2.5, True, np.float32(2.5), np.int64(2), np.array(2.5)], ids=repr
)
def test_scalars_mix_freely(scalar: Any) -> None:
    host = np.arange(4, dtype=np.float32)
    a = on_device(host)
    assert_same(a + scalar, host + scalar)
    assert_same(scalar * a, scalar * host)
    assert_same(np.maximum(a, scalar), np.maximum(host, scalar))
    a[1] = scalar
    host[1] = scalar
    assert_same(a, host)


# -- what is allowed: the same results as NumPy ----------------------------------------------
@given(float_arrays)
def test_ufuncs_match_numpy(host: np.ndarray) -> None:
    a = on_device(host)
    for ufunc in (np.exp, np.tanh, np.negative, np.abs, np.sign):
        assert_same(ufunc(a), ufunc(host))
        assert_same(getattr(xp, ufunc.__name__)(a), ufunc(host))
    assert_same(a * a - 1, host * host - 1)
    assert_same(a > 0, host > 0)
    assert_same(np.maximum(a, a.T.T / 2), np.maximum(host, host / 2))


@given(float_arrays, st.data())
def test_reductions_match_numpy(host: np.ndarray, data: st.DataObject) -> None:
    a = on_device(host)
    axis = data.draw(st.none() | st.integers(0, host.ndim - 1), label="axis")
    keepdims = data.draw(st.booleans(), label="keepdims")
    for name in ("sum", "mean", "max", "min"):
        expected = getattr(host, name)(axis=axis, keepdims=keepdims)
        assert_same(getattr(a, name)(axis=axis, keepdims=keepdims), expected)
        assert_same(getattr(np, name)(a, axis=axis, keepdims=keepdims), expected)
    assert_same(a.argmax(axis=axis), np.asarray(host.argmax(axis=axis)))


def test_scalar_results_stay_on_the_device_and_read_out_explicitly() -> None:
    """Like CuPy, a full reduction or a single element is a 0-d device array."""
    a = on_device(np.array([[1.5, 2.0], [3.0, 4.0]], dtype=np.float32))
    total, element = a.sum(), a[0, 0]
    assert isinstance(total, StrictArray) and total.shape == ()
    assert isinstance(element, StrictArray) and element.shape == ()
    assert float(total) == 10.5 and total.item() == 10.5 and f"{total:.1f}" == "10.5"
    assert int(a.argmax()) == 3 and [10, 20, 30, 40][a.argmax()] == 40
    assert bool(a[0, 0] > 1) and a.tolist() == [[1.5, 2.0], [3.0, 4.0]]


@pytest.mark.parametrize("read", [bool, float, int, complex, operator.index, lambda a: f"{a:.2f}", repr, str,
                                  lambda a: a.item(), lambda a: a.tolist(), strict.to_host])
def test_every_read_to_the_host_is_counted_once(read: Callable[[StrictArray], Any]) -> None:
    scalar = xp.asarray(np.float32(2.5)) if read is not operator.index else xp.asarray(np.int64(2))
    before = host_reads()
    read(scalar)
    assert host_reads() - before == 1


def test_work_on_the_device_reads_nothing() -> None:
    before = host_reads()
    a = strict.from_host(np.arange(6.0).reshape(2, 3))
    b = (a * 2 + 1).sum(axis=0)
    a[0] = b
    assert (a.shape, len(a), a.dtype) == ((2, 3), 2, np.float64)
    copy.deepcopy(pickle.loads(pickle.dumps(a)))
    assert host_reads() == before


@pytest.mark.parametrize("compute, promoted", [
    (lambda a, i, d: a * np.float64(0.1), 1),  # a NumPy float64 scalar is not weak (NEP 50)
    (lambda a, i, d: a / np.sqrt(2.0), 1),
    (lambda a, i, d: i * a, 1),  # int64 with float32 is float64
    (lambda a, i, d: xp.maximum(a, np.float64(0.0)), 1),
    (lambda a, i, d: a * 0.1 + xp.sqrt(a), 0),  # Python floats adapt to the array
    (lambda a, i, d: a.astype(np.float64), 0),  # an explicit cast is asked for
    (lambda a, i, d: d * a, 0),  # a float64 operand: float64 was there already
    (lambda a, i, d: xp.multiply(a, np.float64(2.0), out=a), 1),  # out= keeps float32, but the loop ran in float64
    (lambda a, i, d: a.__imul__(np.float64(2.0)), 1),  # a *= np.float64(2.0): the same
    (lambda a, i, d: xp.multiply(a, 2.0, out=a), 0),
    (lambda a, i, d: a > np.float64(0.5), 0),  # a comparison gives booleans, not a float array
])
def test_float64_promotions_counts_implicit_widening_only(compute: Callable, promoted: int) -> None:
    a = strict.from_host(np.ones(3, np.float32))
    i, d = strict.from_host(np.arange(3)), strict.from_host(np.ones(3))
    before = float64_promotions()
    compute(a, i, d)
    assert float64_promotions() - before == promoted


@given(
    hnp.arrays(np.float32, (3, 4), elements=st.floats(-10, 10, width=32)),
    hnp.arrays(np.float32, (4, 2), elements=st.floats(-10, 10, width=32)),
)
def test_matmul_matches_numpy(x: np.ndarray, y: np.ndarray) -> None:
    assert_same(on_device(x) @ on_device(y), x @ y)
    assert_same(np.matmul(on_device(x), on_device(y)), x @ y)
    assert_same(xp.matmul(on_device(x), on_device(y)), x @ y)


def test_concatenate_stack_and_where_match_numpy() -> None:
    x, y = np.arange(6.0).reshape(2, 3), np.arange(6.0, 12.0).reshape(2, 3)
    a, b = on_device(x), on_device(y)
    assert_same(np.concatenate([a, b], axis=1), np.concatenate([x, y], axis=1))
    assert_same(xp.concatenate((a, b)), np.concatenate((x, y)))
    assert_same(np.stack([a, b]), np.stack([x, y]))
    assert_same(np.where(a > 2, a, b), np.where(x > 2, x, y))
    assert_same(xp.where(a > 2, a, 0.0), np.where(x > 2, x, 0.0))
    rows, cols = np.nonzero(a > 2)
    assert_same(rows, np.nonzero(x > 2)[0])
    assert_same(cols, np.nonzero(x > 2)[1])


@given(float_arrays, st.data())
def test_indexing_with_device_index_arrays_matches_numpy(host: np.ndarray, data: st.DataObject) -> None:
    a = on_device(host)
    rows = st.integers(0, len(host) - 1)
    index = data.draw(hnp.arrays(np.int64, st.integers(0, 5), elements=rows), label="index")
    mask = host > 0
    assert_same(a[on_device(index)], host[index])
    assert_same(a[a > 0], host[mask])
    assert_same(a[1:, ..., None], host[1:, ..., None])
    a[a > 0] = 0.0
    host[mask] = 0.0
    assert_same(a, host)


def test_setitem_with_device_values_and_index_arrays() -> None:
    host = np.zeros((3, 2), dtype=np.float32)
    a = on_device(host)
    a[on_device(np.array([2, 0])), 1] = on_device(np.array([5.0, 7.0], dtype=np.float32))
    host[np.array([2, 0]), 1] = [5.0, 7.0]
    assert_same(a, host)


@given(
    hnp.arrays(np.int64, st.integers(1, 20), elements=st.integers(0, 4)),
    st.floats(-3, 3, width=32),
)
def test_scatter_add_adds_up_repeated_indices_like_np_add_at(index: np.ndarray, value: float) -> None:
    target, expected = on_device(np.zeros((5, 2), dtype=np.float32)), np.zeros((5, 2), dtype=np.float32)
    values = np.full((len(index), 2), value, dtype=np.float32)
    strict.scatter_add(target, on_device(index), on_device(values))
    np.add.at(expected, index, values)
    assert_same(target, expected)


def test_np_add_at_dispatches_to_the_device() -> None:
    target = on_device(np.zeros(3))
    np.add.at(target, on_device(np.array([0, 0, 2])), 1.0)
    assert_same(target, np.array([2.0, 0.0, 1.0]))


def test_sliding_window_view_and_pad_match_numpy() -> None:
    host = np.arange(12.0).reshape(3, 4)
    window = xp.lib.stride_tricks.sliding_window_view(on_device(host), (2, 2))
    assert_same(window, np.lib.stride_tricks.sliding_window_view(host, (2, 2)))
    padded = strict.pad(on_device(host), ((1, 1), (0, 2)), value=-1.0)
    assert_same(padded, np.pad(host, ((1, 1), (0, 2)), constant_values=-1.0))


def test_in_place_operators_and_out_keep_the_same_object() -> None:
    host = np.arange(4, dtype=np.float32)
    a = same = on_device(host)
    a += 1
    a *= on_device(np.full(4, 2, dtype=np.float32))
    assert a is same
    assert np.exp(a, out=a) is same and xp.asarray(a) is same
    assert_same(a, np.exp((host + 1) * 2))


def test_array_methods_match_numpy() -> None:
    host = np.arange(6, dtype=np.float32).reshape(2, 3)
    a = on_device(host)
    assert (a.shape, a.dtype, a.ndim, a.size, a.itemsize, a.nbytes, a.strides) == (
        host.shape, host.dtype, host.ndim, host.size, host.itemsize, host.nbytes, host.strides,
    )
    assert_same(a.reshape(3, 2), host.reshape(3, 2))
    assert_same(a.transpose(1, 0), host.T)
    assert_same(a.T, host.T)
    assert_same(a.astype(np.int32), host.astype(np.int32))
    assert_same(a.ravel(), host.ravel())
    assert_same(a.clip(1, 4), host.clip(1, 4))
    assert len(a) == 2 and all(isinstance(row, StrictArray) for row in a)
    assert [float(x) for x in a[0]] == [0.0, 1.0, 2.0]
    b = a.copy()
    b.fill(3.0)
    assert_same(b, np.full((2, 3), 3.0, dtype=np.float32))
    assert_same(a, host)


def test_namespace_creates_arrays_on_its_device_and_passes_constants_through() -> None:
    assert_same(xp.zeros((2, 3), dtype=xp.float32), np.zeros((2, 3), dtype=np.float32))
    assert_same(xp.asarray([[1, 2], [3, 4]], dtype=xp.float32), np.array([[1.0, 2], [3, 4]], np.float32))
    assert_same(xp.asarray(2.5), np.asarray(2.5))
    assert_same(xp.arange(3)[xp.newaxis], np.arange(3)[np.newaxis])
    assert strict1.xp.ones(2).device == "strict:1"
    assert xp.float32 is np.float32 and xp.newaxis is None and xp.pi == np.pi
    assert xp.finfo(xp.float32).eps == np.finfo(np.float32).eps
    assert_same(xp.linalg.norm(on_device(np.array([3.0, 4.0]))), np.asarray(5.0))


# -- host transfer and random numbers ---------------------------------------------------------
def test_from_host_and_to_host_copy() -> None:
    host = np.arange(3.0)
    a = strict.from_host(host)
    host[0] = 100.0
    back = strict.to_host(a)
    back[1] = 100.0
    assert isinstance(back, np.ndarray) and not isinstance(back, StrictArray)
    np.testing.assert_array_equal(strict.to_host(a), np.arange(3.0))


def test_host_transfer_refuses_the_wrong_kind_of_array() -> None:
    with pytest.raises(TypeError, match="asarray"):
        strict.from_host([1.0, 2.0])
    with pytest.raises(TypeError, match="StrictArray"):
        strict.to_host(np.ones(2))


def test_copies_and_pickles_do_not_share_memory() -> None:
    a = on_device(np.zeros(2))
    copies = [copy.copy(a), copy.deepcopy(a), pickle.loads(pickle.dumps(a))]
    a += 1
    for c in copies:
        assert_same(c, np.zeros(2))


def test_random_numbers_are_device_arrays_with_the_cpu_sequence() -> None:
    cpu = NumpyBackend()
    for backend in (strict, cpu):
        backend.seed(7)
    normal, uniform = strict.random_normal((2, 3)), strict.random_uniform((4,), np.float64)
    perm = strict.permutation(5)
    assert_same(normal, cpu.random_normal((2, 3)))
    assert_same(uniform, cpu.random_uniform((4,), np.float64))
    assert_same(perm, cpu.permutation(5))


def test_repr_names_dtype_and_device() -> None:
    assert repr(strict1.from_host(np.array([1.0, 2.0], dtype=np.float32))) == (
        "strict_array([1., 2.], dtype=float32, device='strict:1')"
    )


def test_clip_needs_an_array_first_as_cupys_does() -> None:
    # cupy.clip(a, lo, hi) calls a.clip(lo, hi): NumPy converts a number in a's place, a GPU fails on it
    xp = strict.xp
    codes = on_device(np.array([-200.0, 3.0, 200.0]))
    assert_same(xp.clip(codes, -128, 127), np.array([-128.0, 3.0, 127.0]))
    with pytest.raises(TypeError, match=r"xp.clip's first argument must be an array on a GPU .* got int -128"):
        xp.clip(-128, codes, 127)
