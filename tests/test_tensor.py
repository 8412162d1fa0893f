"""The Tensor object: construction, dtype rules, attributes, devices, factories,
operator syntax and error messages. Op values and gradients are in
``test_ops_grad.py``; the autograd engine is in ``test_autograd.py``."""
from __future__ import annotations

import operator
import re

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinytrain as tt


def assert_values(t, expected, rtol=1e-6, atol=1e-6):
    """``t`` (a Tensor) holds ``expected``; read through ``numpy()`` only."""
    got = t.numpy()
    assert type(got) is np.ndarray
    expected = np.asarray(expected)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    if expected.dtype.kind == "f":
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)
    else:
        np.testing.assert_array_equal(got, expected)


# -- construction and dtype rules -------------------------------------------------

@pytest.mark.parametrize(
    "data, dtype",
    [
        (1.5, np.float32),
        ([1.0, 2.5], np.float32),
        ([[1, 2.5], [3, 4]], np.float32),  # mixed int/float lists are float
        (np.array([1.0, 2.0], dtype=np.float64), np.float32),
        (np.array([1.0, 2.0], dtype=np.float32), np.float32),
        (np.array([1.0, 2.0], dtype=np.float16), np.float16),
        (3, np.int64),
        ([1, 2, 3], np.int64),
        (True, np.bool_),
        ([True, False], np.bool_),
    ],
    ids=repr,
)
def test_tensor_infers_dtype(device, data, dtype):
    t = tt.tensor(data, device=device)
    assert t.dtype == np.dtype(dtype)
    assert_values(t, np.asarray(data).astype(dtype))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32", "int64", "bool"])
def test_dtype_names_are_numpy_dtypes(dtype):
    assert np.dtype(getattr(tt, dtype)) == np.dtype(dtype)


def test_integer_arrays_stay_integer(device):
    t = tt.tensor(np.array([1, 2], dtype=np.int32), device=device)
    assert t.dtype.kind == "i"


@pytest.mark.parametrize(
    "data, dtype",
    [([1, 2], tt.float64), ([1.5, 2.5], tt.float16), (np.arange(3.0), tt.float64), ([1.0, 2.0], tt.int32)],
    ids=repr,
)
def test_explicit_dtype_wins(device, data, dtype):
    t = tt.tensor(data, dtype=dtype, device=device)
    assert t.dtype == np.dtype(dtype)
    assert_values(t, np.asarray(data).astype(dtype))


def test_tensor_class_constructs_like_tensor_function(device):
    t = tt.Tensor([1.0, 2.0], requires_grad=True, device=device)
    assert isinstance(t, tt.Tensor)
    assert isinstance(tt.tensor(1.0), tt.Tensor)
    assert t.requires_grad and t.dtype == np.float32
    assert_values(t, [1.0, 2.0])


@pytest.mark.parametrize("data", [[1, 2], np.array([1, 2], dtype=np.int32)], ids=repr)
def test_requires_grad_on_integer_tensor_raises(device, data):
    with pytest.raises((TypeError, ValueError, RuntimeError)):
        tt.tensor(data, requires_grad=True, device=device)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_tensor_does_not_share_memory_with_its_source(device, dtype):
    source = np.array([1, 2, 3], dtype=dtype)
    t = tt.tensor(source, device=device)
    source[0] = 100
    assert t.numpy()[0] == 1


def test_tensor_does_not_share_the_array_an_objects_array_method_hands_out(device):
    """np.asarray returns that very array (base None): it is not a copy, so to_array must make one."""

    class Column:
        def __init__(self):
            self.values = np.ones(3, dtype=np.float32)

        def __array__(self, dtype=None, copy=None):
            return self.values

    column = Column()
    t = tt.tensor(column, device=device)
    column.values[0] = 5.0
    assert t.numpy().tolist() == [1.0, 1.0, 1.0]


def test_requires_grad_flag(device):
    assert tt.tensor([1.0], device=device).requires_grad is False
    assert tt.tensor([1.0], requires_grad=True, device=device).requires_grad is True


# -- attributes ----------------------------------------------------------------------

def test_attributes(device, canonical_device):
    t = tt.tensor(np.zeros((2, 3, 4)), device=device)
    assert t.shape == (2, 3, 4) and type(t.shape) is tuple
    assert t.ndim == 3
    assert isinstance(t.dtype, np.dtype)
    assert t.device == canonical_device
    assert t.grad is None


def test_scalar_tensor_has_empty_shape(device):
    t = tt.tensor(2.0, device=device)
    assert t.shape == () and t.ndim == 0


def test_data_is_ndarray_on_cpu():
    assert type(tt.tensor([1.0, 2.0]).data) is np.ndarray
    assert tt.tensor([1.0]).device == "cpu"


def test_data_on_a_device_is_not_a_host_array(device):
    """A device tensor keeps its own array type; the strict device's arrays refuse NumPy."""
    t = tt.tensor([1.0, 2.0], device=device)
    if device == "cpu":
        pytest.skip("cpu data is a NumPy array by design")
    with pytest.raises(Exception):
        np.asarray(t.data)


def test_numpy_returns_host_copy(device):
    t = tt.tensor([1.0, 2.0], device=device)
    host = t.numpy()
    assert type(host) is np.ndarray and host.dtype == np.float32
    host[0] = 99.0
    assert_values(t, [1.0, 2.0])


@pytest.mark.parametrize(
    "data, expected, kind",
    [(2.5, 2.5, float), ([[7]], 7, int), ([True], True, bool), (np.float64(0.25), 0.25, float)],
    ids=repr,
)
def test_item_returns_python_scalar(device, data, expected, kind):
    value = tt.tensor(data, device=device).item()
    assert type(value) is kind and value == expected


def test_numpy_asarray_of_a_cpu_tensor_is_its_array_and_a_device_tensor_refuses(device, canonical_device):
    t = tt.tensor([[1.0, 2.0], [3.0, 4.0]], device=device)
    if canonical_device != "cpu":  # like CuPy's arrays: the copy to the host is t.numpy(), never implicit
        with pytest.raises(TypeError, match=re.escape(f"a tensor on '{canonical_device}' is not converted to NumPy "
                                                      "implicitly; use t.numpy()")):
            np.asarray(t)
        return
    assert np.asarray(t) is t.data  # shares memory, as np.asarray of a torch tensor does
    assert np.asarray(t, dtype=np.float64).dtype == np.float64
    assert np.array(t) is not t.data
    np.testing.assert_array_equal(np.stack([t, t]), [t.numpy(), t.numpy()])  # numbers, not an object array
    assert_values(tt.tensor([tt.tensor(1.0), tt.tensor(2.0)]), [1.0, 2.0])


def test_item_on_non_scalar_names_shape(device):
    with pytest.raises((ValueError, RuntimeError)) as info:
        tt.zeros(2, 3, device=device).item()
    assert "(2, 3)" in str(info.value)


def test_to_moves_values(device, canonical_device):
    src = tt.tensor([[1.5, -2.0], [3.0, 4.0]])
    moved = src.to(device)
    assert moved.device == canonical_device
    assert moved.dtype == src.dtype
    assert_values(moved, src.numpy())
    back = moved.to("cpu")
    assert back.device == "cpu"
    assert_values(back, src.numpy())


def test_to_same_device_keeps_values(device, canonical_device):
    t = tt.tensor([1.0, 2.0], device=device)
    assert t.to(device).device == canonical_device
    assert t.to(canonical_device).device == canonical_device
    assert_values(t.to(device), [1.0, 2.0])


def test_gradient_flows_back_through_to(device, other_device):
    x = tt.tensor([1.0, 2.0, 3.0], requires_grad=True, device=device)
    y = x.to(other_device)
    assert y.requires_grad
    (y * y).sum().backward()
    assert x.grad.device == x.device
    assert_values(x.grad, [2.0, 4.0, 6.0])


def test_a_0d_tensor_moves_to_another_device_with_its_gradient(device, other_device):
    """A 0-d result is wrapped into an array of the device it lands on, not of the one it left."""
    x = tt.tensor(3.0, requires_grad=True, device=device)
    y = x.to(other_device)
    assert y.shape == () and y.device == tt.tensor(0.0, device=other_device).device
    (y * y).backward()
    assert x.grad.device == x.device
    assert_values(x.grad, 6.0)


def test_detach(device):
    x = tt.tensor([1.0, 2.0], requires_grad=True, device=device)
    d = (x * 2).detach()
    assert d.requires_grad is False
    assert d.device == x.device and d.dtype == x.dtype
    assert_values(d, [2.0, 4.0])


def test_repr_mentions_values(device):
    text = repr(tt.tensor([1.5, -2.25], device=device))
    assert "1.5" in text and "-2.25" in text


def test_repr_mentions_dtype_device_and_requires_grad(device, canonical_device):
    text = repr(tt.tensor([1.0], dtype=tt.float64, requires_grad=True, device=device))
    assert "float64" in text
    assert "requires_grad" in text
    if device != "cpu":
        assert canonical_device in text


def test_repr_omits_requires_grad_when_unset(device):
    assert "requires_grad" not in repr(tt.tensor([1.0], device=device))


# -- devices -------------------------------------------------------------------------

@pytest.mark.parametrize(
    "make",
    [
        lambda: tt.tensor([1.0], device="tpu"),
        lambda: tt.zeros(2, device="tpu"),
        lambda: tt.tensor([1.0]).to("tpu"),
    ],
    ids=["tensor", "zeros", "to"],
)
def test_unknown_device_raises_value_error_naming_it(make):
    with pytest.raises(ValueError, match="tpu"):
        make()


MIXED_DEVICE_OPS = {
    "add": operator.add,
    "mul": operator.mul,
    "matmul": operator.matmul,
    "stack": lambda a, b: tt.stack([a, b]),
    "concatenate": lambda a, b: tt.concatenate([a, b]),
    "where": lambda a, b: tt.where(a > 0, a, b),
}


@pytest.mark.parametrize("name", MIXED_DEVICE_OPS)
def test_mixing_devices_raises_naming_both(device, other_device, name):
    a = tt.ones(2, 2, device=device)
    b = tt.ones(2, 2, device=other_device)
    with pytest.raises(RuntimeError) as info:
        MIXED_DEVICE_OPS[name](a, b)
    message = str(info.value)
    assert a.device in message and b.device in message, message


# -- factories -----------------------------------------------------------------------

FILLED = {"zeros": 0.0, "ones": 1.0}


@pytest.mark.parametrize("name", ["zeros", "ones"])
@pytest.mark.parametrize("args", [((2, 3),), (2, 3)], ids=["tuple", "varargs"])
def test_filled_factories(device, canonical_device, name, args):
    t = getattr(tt, name)(*args, device=device)
    assert t.shape == (2, 3) and t.dtype == np.float32 and t.device == canonical_device
    assert t.requires_grad is False
    assert_values(t, np.full((2, 3), FILLED[name]))


@pytest.mark.parametrize("name", ["zeros", "ones", "randn", "rand"])
def test_factory_options(device, canonical_device, name):
    factory = getattr(tt, name)
    assert factory(4, device=device).shape == (4,)
    t = factory(2, 3, dtype=tt.float64, device=device, requires_grad=True)
    assert t.shape == (2, 3) and t.dtype == np.float64
    assert t.device == canonical_device and t.requires_grad
    assert factory((3, 1), device=device).shape == (3, 1)


def test_int_zeros(device):
    t = tt.zeros(3, dtype=tt.int64, device=device)
    assert t.dtype == np.int64
    assert_values(t, [0, 0, 0])


def test_randn_statistics(device):
    tt.manual_seed(0)
    x = tt.randn(100_000, device=device).numpy()
    assert x.dtype == np.float32
    assert abs(x.mean()) < 0.02 and abs(x.std() - 1.0) < 0.02


def test_rand_range(device):
    tt.manual_seed(0)
    x = tt.rand(100_000, device=device).numpy()
    assert x.dtype == np.float32
    assert x.min() >= 0.0 and x.max() < 1.0
    assert abs(x.mean() - 0.5) < 0.01


@pytest.mark.parametrize("name", ["randn", "rand"])
def test_manual_seed_reproducible(device, name):
    factory = getattr(tt, name)
    tt.manual_seed(123)
    a = factory(2, 5, device=device).numpy()
    tt.manual_seed(123)
    b = factory(2, 5, device=device).numpy()
    tt.manual_seed(124)
    c = factory(2, 5, device=device).numpy()
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_a_fractional_size_raises_naming_it():
    with pytest.raises(TypeError, match=r"shape\[0\] must be a whole number, got shape\[0\]=2\.5"):
        tt.randn(2.5, 3)  # not int(2.5): a (2, 3) tensor without a word
    with pytest.raises(TypeError, match=r"shape\[1\]=1\.5"):
        tt.zeros(4).reshape(2, 1.5)


def test_a_negative_size_raises_naming_it():
    with pytest.raises(ValueError, match=r"shape\[0\] must be a whole number >= 0, got shape\[0\]=-1"):
        tt.zeros(-1, 3)
    assert tt.zeros(6).reshape(-1, 3).shape == (2, 3), "reshape's -1 still means the size that fits"


@pytest.mark.parametrize(
    "args, kwargs, expected",
    [((0, 5, 2), {}, [0, 2, 4]), ((5,), {}, [0, 1, 2, 3, 4]), ((2, 5), {}, [2, 3, 4]),
     ((0, 1, 0.25), {}, [0, 0.25, 0.5, 0.75]), ((5,), {"step": 2}, [0, 2, 4]), ((5, 0), {"step": -2}, [5, 3, 1])],
    ids=repr,
)
def test_arange(device, canonical_device, args, kwargs, expected):
    t = tt.arange(*args, **kwargs, device=device)  # a lone bound with step= must not ignore the step
    assert t.device == canonical_device
    assert t.dtype == (np.float32 if isinstance(args[-1], float) else np.int64)
    assert_values(t, expected)


@pytest.mark.parametrize("factory, dtype", [("randn", "float16"), ("rand", "int64")])
def test_random_factories_name_a_dtype_they_cannot_draw(device, factory, dtype):
    """NumPy said only "Unsupported dtype dtype('float16') for standard_normal"."""
    with pytest.raises(TypeError, match=rf"random numbers come as float32 or float64, not {dtype}"):
        getattr(tt, factory)(2, dtype=dtype, device=device)


@pytest.mark.parametrize("dtype", ["complex64", "U3", object, "datetime64[s]"])
@pytest.mark.parametrize(
    "make",
    [
        lambda dtype, device: tt.tensor([1, 2], dtype=dtype, device=device),
        lambda dtype, device: tt.Tensor([1.0], dtype=dtype, device=device),
        lambda dtype, device: tt.zeros(2, dtype=dtype, device=device),
        lambda dtype, device: tt.ones(2, dtype=dtype, device=device),
        lambda dtype, device: tt.arange(3, dtype=dtype, device=device),
        lambda dtype, device: tt.tensor([1.0], device=device).astype(dtype),
    ],
    ids=["tensor", "Tensor", "zeros", "ones", "arange", "astype"],
)
def test_a_dtype_no_tensor_can_hold_raises_naming_it(device, make, dtype):
    """Each of these must refuse a complex, string, object or date tensor, as tensor(complex data) does."""
    message = f"a tensor holds bool, integer or floating-point numbers, not dtype={np.dtype(dtype)}"
    with pytest.raises(TypeError, match=re.escape(message)):
        make(dtype, device)


def test_a_device_that_is_not_a_string_raises_naming_it():
    """get_backend(['cpu']) said only "unhashable type: 'list'"."""
    with pytest.raises(TypeError, match=r"a device is a string such as 'cpu' or 'cuda:0', got \['cpu'\]"):
        tt.zeros(2, device=["cpu"])


def test_arange_with_a_zero_step_raises_naming_it(device):
    with pytest.raises(ValueError, match=r"arange: step must not be 0, got start=0, stop=5, step=0"):
        tt.arange(0, 5, 0, device=device)  # NumPy said only 'division by zero'


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_stack(device, axis):
    arrays = [np.arange(6.0).reshape(2, 3) + 10 * i for i in range(3)]
    t = tt.stack([tt.tensor(a, device=device) for a in arrays], axis=axis)
    assert_values(t, np.stack(arrays, axis=axis))


def test_stack_default_axis(device):
    t = tt.stack([tt.tensor([1.0, 2.0], device=device), tt.tensor([3.0, 4.0], device=device)])
    assert_values(t, [[1.0, 2.0], [3.0, 4.0]])


CONCAT_CASES = {0: [(2, 3), (1, 3)], 1: [(2, 3), (2, 2)], -1: [(2, 3), (2, 1), (2, 2)]}


@pytest.mark.parametrize("axis", sorted(CONCAT_CASES))
def test_concatenate(device, axis):
    arrays = [np.arange(float(np.prod(s))).reshape(s) + i for i, s in enumerate(CONCAT_CASES[axis])]
    t = tt.concatenate([tt.tensor(a, device=device) for a in arrays], axis=axis)
    assert_values(t, np.concatenate(arrays, axis=axis))


def test_concatenate_default_axis(device):
    t = tt.concatenate([tt.tensor([1.0], device=device), tt.tensor([2.0, 3.0], device=device)])
    assert_values(t, [1.0, 2.0, 3.0])


@pytest.mark.parametrize("name", ["stack", "concatenate"])
def test_joining_no_tensors_raises_naming_the_argument(name):
    with pytest.raises(ValueError, match=rf"{name} needs at least one tensor, got tensors=\[\]"):
        getattr(tt, name)([])


def test_where(device):
    cond = tt.tensor([True, False, True], device=device)
    a = tt.tensor([1.0, 2.0, 3.0], device=device)
    b = tt.tensor([-1.0, -2.0, -3.0], device=device)
    assert_values(tt.where(cond, a, b), [1.0, -2.0, 3.0])
    assert_values(tt.where(a > 1.5, a, b), [-1.0, 2.0, 3.0])


def test_where_of_shapes_that_do_not_broadcast_names_all_three(device):
    """The message names the condition's shape too, not a's and b's as if they were the only operands."""
    with pytest.raises(ValueError, match=r"where: condition of shape \(2,\), a of shape \(3,\) and b of shape "
                                         r"\(1,\) do not broadcast together"):
        tt.where(tt.tensor([True, False], device=device), tt.ones(3, device=device), tt.zeros(1, device=device))


# -- operator syntax, dtype preservation ------------------------------------------------

SCALAR_OPS = [
    ("t + 2", lambda t: t + 2, lambda a: a + 2),
    ("2 + t", lambda t: 2 + t, lambda a: 2 + a),
    ("t - 2", lambda t: t - 2, lambda a: a - 2),
    ("2 - t", lambda t: 2 - t, lambda a: 2 - a),
    ("t * 1.5", lambda t: t * 1.5, lambda a: a * 1.5),
    ("1.5 * t", lambda t: 1.5 * t, lambda a: 1.5 * a),
    ("t / 4", lambda t: t / 4, lambda a: a / 4),
    ("1 / t", lambda t: 1 / t, lambda a: 1 / a),
    ("t ** 2", lambda t: t**2, lambda a: a**2),
    ("t ** 0.5", lambda t: t**0.5, lambda a: a**0.5),
    ("2 ** t", lambda t: 2**t, lambda a: 2.0**a),
    ("-t", lambda t: -t, lambda a: -a),
]


@pytest.mark.parametrize("name, op, ref", SCALAR_OPS, ids=[row[0] for row in SCALAR_OPS])
def test_operators_with_python_scalars(device, name, op, ref):
    a = np.array([[0.5, 1.0, 2.0], [3.0, 4.0, 8.0]], dtype=np.float32)
    out = op(tt.tensor(a, device=device))
    assert isinstance(out, tt.Tensor)
    assert out.dtype == np.float32, "a Python scalar must not promote float32"
    assert_values(out, ref(a), rtol=1e-6)


TENSOR_OPS = [operator.add, operator.sub, operator.mul, operator.truediv, operator.pow, operator.matmul]


@pytest.mark.parametrize("op", TENSOR_OPS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_binary_ops_keep_float_dtype(device, op, dtype):
    a = tt.tensor(np.full((2, 2), 1.5), dtype=dtype, device=device)
    b = tt.tensor(np.full((2, 2), 2.0), dtype=dtype, device=device)
    out = op(a, b)
    assert out.dtype == np.dtype(dtype)
    assert_values(out, op(a.numpy(), b.numpy()), rtol=1e-3)


def test_integer_arithmetic_stays_integer(device):
    a = tt.tensor([1, 2, 3], device=device)
    assert (a + a).dtype == np.int64
    assert (a * 2).dtype == np.int64
    assert_values(a * 2 + a, [3, 6, 9])


# What PyTorch gives where kinds of dtype mix (bool < integer < float): the higher kind's dtype.
# NumPy alone makes the float cases float64 (and `ids * np.float32(2.5)` int64, `mask * 3` True).
MIXED_KIND_OPS = [
    ("float32 * int64 mask", lambda f, i, b: f * i, "float32", [0.5, 0.0, 4.0]),
    ("int64 mask * float32", lambda f, i, b: i * f, "float32", [0.5, 0.0, 4.0]),
    ("float16 + int64", lambda f, i, b: f.astype("float16") + i, "float16", [1.5, 1.0, 4.0]),
    ("float32 - bool", lambda f, i, b: f - b, "float32", [-0.5, 1.0, 1.0]),
    ("int64 * 0.5", lambda f, i, b: i * 0.5, "float32", [0.5, 0.0, 1.0]),
    ("0.5 * int64", lambda f, i, b: 0.5 * i, "float32", [0.5, 0.0, 1.0]),
    ("int64 * np.float32(2.5)", lambda f, i, b: i * np.float32(2.5), "float32", [2.5, 0.0, 5.0]),
    ("int64 / int64", lambda f, i, b: i / (i + 1), "float32", [0.5, 0.0, 2 / 3]),
    ("int64 / 4", lambda f, i, b: i / 4, "float32", [0.25, 0.0, 0.5]),
    ("1 / (int64 + 1)", lambda f, i, b: 1 / (i + 1), "float32", [0.5, 1.0, 1 / 3]),
    ("int64 ** 0.5", lambda f, i, b: i**0.5, "float32", [1.0, 0.0, 2**0.5]),
    ("int64 ** 2", lambda f, i, b: i**2, "int64", [1, 0, 4]),
    ("bool * 3", lambda f, i, b: b * 3, "int64", [3, 0, 3]),
    ("bool + 1", lambda f, i, b: b + 1, "int64", [2, 1, 2]),
    ("bool * int64", lambda f, i, b: b * i, "int64", [1, 0, 2]),
    ("bool * 2.5", lambda f, i, b: b * 2.5, "float32", [2.5, 0.0, 2.5]),
    ("float32 @ int64", lambda f, i, b: f @ i, "float32", 4.5),
    ("int64.exp()", lambda f, i, b: i.exp(), "float32", np.exp([1.0, 0.0, 2.0])),
    ("int64.sqrt()", lambda f, i, b: i.sqrt(), "float32", [1.0, 0.0, 2**0.5]),
    ("int64.sigmoid()", lambda f, i, b: i.sigmoid(), "float32", 1 / (1 + np.exp([-1.0, 0.0, -2.0]))),
    ("int64.softmax()", lambda f, i, b: i.softmax(), "float32", np.exp([1.0, 0.0, 2.0]) / np.exp([1.0, 0.0, 2.0]).sum()),
    ("bool.mean()", lambda f, i, b: b.mean(), "float32", 2 / 3),
    ("int64.mean()", lambda f, i, b: i.mean(), "float32", 1.0),
    ("float32 * float64", lambda f, i, b: f * f.astype("float64"), "float64", [0.25, 1.0, 4.0]),
    ("stack(float32, int64)", lambda f, i, b: tt.stack([f, i]), "float32", [[0.5, 1.0, 2.0], [1.0, 0.0, 2.0]]),
    ("concatenate(bool, int64)", lambda f, i, b: tt.concatenate([b, i]), "int64", [1, 0, 1, 1, 0, 2]),
    ("where(bool, int64, 0.5)", lambda f, i, b: tt.where(b, i, 0.5), "float32", [1.0, 0.5, 2.0]),
]


@pytest.mark.parametrize("name, op, dtype, expected", MIXED_KIND_OPS, ids=[row[0] for row in MIXED_KIND_OPS])
def test_mixing_kinds_of_dtype_gives_the_higher_kind_as_pytorch_does(device, name, op, dtype, expected):
    f = tt.tensor([0.5, 1.0, 2.0], device=device)
    i = tt.tensor([1, 0, 2], device=device)
    b = tt.tensor([True, False, True], device=device)
    out = op(f, i, b)
    assert out.dtype == np.dtype(dtype), f"{name}: expected {dtype}, got {out.dtype}"
    assert_values(out, np.asarray(expected, dtype=dtype), rtol=1e-3 if dtype == "float16" else 1e-6)


def test_a_float32_gradient_through_an_integer_mask_stays_float32(device):
    x = tt.tensor([1.0, -2.0, 3.0], requires_grad=True, device=device)
    mask = tt.tensor([1, 0, 1], device=device)
    loss = (x * mask).sum() / mask.sum()
    assert loss.dtype == np.float32
    loss.backward()
    assert x.grad.dtype == np.float32
    assert_values(x.grad, [0.5, 0.0, 0.5])


def test_comparing_with_a_float_scalar_does_not_truncate_it(device):
    t = tt.tensor([2, 3], device=device)
    np.testing.assert_array_equal((t > np.float32(2.5)).numpy(), [False, True])
    np.testing.assert_array_equal((t < 2.5).numpy(), [True, False])


def test_equality_with_none_is_false_as_in_pytorch(device):
    t = tt.tensor([1.0, 2.0], device=device)
    assert (t == None) is False  # noqa: E711  (the operator is what is tested)
    assert (t != None) is True  # noqa: E711
    assert t not in [None]


COMPARISONS = [operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne]


@pytest.mark.parametrize("op", COMPARISONS, ids=lambda f: f.__name__)
def test_comparisons_give_bool_tensors_without_grad(device, op):
    a_np = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    b_np = np.array([4.0, 2.0, 1.0, 4.0], dtype=np.float32)
    a = tt.tensor(a_np, requires_grad=True, device=device)
    b = tt.tensor(b_np, device=device)
    for out, expected in [(op(a, b), op(a_np, b_np)), (op(a, 2.0), op(a_np, 2.0)), (op(2.0, a), op(2.0, a_np))]:
        assert isinstance(out, tt.Tensor)
        assert out.dtype == np.bool_
        assert out.requires_grad is False
        np.testing.assert_array_equal(out.numpy(), expected)


def test_comparison_broadcasts(device):
    a = tt.tensor([[1.0], [3.0]], device=device)
    b = tt.tensor([0.0, 2.0, 4.0], device=device)
    np.testing.assert_array_equal((a < b).numpy(), [[False, True, True], [False, False, True]])


@pytest.mark.parametrize("dtype", [tt.float64, tt.float16, tt.int64, tt.bool])
def test_astype(device, dtype):
    t = tt.tensor([0.0, 1.0, 2.5], device=device).astype(dtype)
    assert t.dtype == np.dtype(dtype)
    assert_values(t, np.array([0.0, 1.0, 2.5]).astype(dtype))


@pytest.mark.parametrize("name", ["sum", "mean", "max"])
def test_reductions_keep_float32(device, name):
    t = tt.tensor(np.arange(6.0).reshape(2, 3), device=device)
    assert getattr(t, name)().dtype == np.float32
    assert getattr(t, name)(axis=1).dtype == np.float32


@pytest.mark.parametrize(
    "name", ["exp", "log", "sqrt", "tanh", "sigmoid", "relu", "abs", "softmax", "log_softmax"]
)
def test_unary_methods_keep_float32(device, name):
    t = tt.tensor([0.5, 1.0, 2.0], device=device)
    assert getattr(t, name)().dtype == np.float32


def test_softmax_takes_one_axis_and_refuses_a_tuple(device):
    t = tt.tensor([[1.0, 2.0], [3.0, 5.0]], device=device)
    for name in ("softmax", "log_softmax"):
        with pytest.raises(TypeError, match=re.escape("axis must be one int, got axis=(0, 1)")):
            getattr(t, name)((0, 1))  # not normalised over axis 0 alone
        with pytest.raises(ValueError, match="axis 2 is out of range for a tensor with 2 dimensions"):
            getattr(t, name)(2)
    e = np.exp([[1.0, 2.0], [3.0, 5.0]])
    assert_values(t.softmax(np.int64(0)), e / e.sum(axis=0))  # a NumPy integer is one axis too


@pytest.mark.parametrize("name", ["sum", "mean", "max"])
@pytest.mark.parametrize("axis", [0, -1, (0,)])
def test_a_0d_tensor_reduces_over_axis_0_or_minus_1_as_in_pytorch(device, name, axis):
    x = tt.tensor(3.0, requires_grad=True, device=device)
    out = getattr(x, name)(axis=axis)
    assert out.shape == () and out.item() == 3.0
    out.backward()
    assert_values(x.grad, 1.0)
    with pytest.raises(ValueError, match="axis 1 is out of range for a tensor with 0 dimensions"):
        getattr(x, name)(axis=1)


# -- shape manipulation values -------------------------------------------------------------

@pytest.mark.parametrize(
    "args, shape",
    [((2, 3), (2, 3)), (((2, 3),), (2, 3)), ((-1,), (6,)), ((3, -1), (3, 2)), (((1, -1, 2),), (1, 3, 2))],
    ids=repr,
)
def test_reshape(device, args, shape):
    a = np.arange(6.0, dtype=np.float32)
    assert_values(tt.tensor(a, device=device).reshape(*args), a.reshape(shape))


@pytest.mark.parametrize("axes", [(), (0, 1, 2), (2, 0, 1), (1, 0, 2)], ids=repr)
def test_transpose(device, axes):
    a = np.arange(24.0, dtype=np.float32).reshape(2, 3, 4)
    assert_values(tt.tensor(a, device=device).transpose(*axes), a.transpose(*axes))


def test_T(device):
    a = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    assert_values(tt.tensor(a, device=device).T, a.T)


# -- bad input --------------------------------------------------------------------------------

def test_matmul_shape_mismatch_names_both_shapes(device):
    with pytest.raises(ValueError) as info:
        tt.ones(2, 3, device=device) @ tt.ones(4, 5, device=device)
    assert "(2, 3)" in str(info.value) and "(4, 5)" in str(info.value)


def test_batched_matmul_shape_mismatch(device):
    with pytest.raises(ValueError) as info:
        tt.ones(2, 3, 4, device=device) @ tt.ones(3, 4, 5, device=device)
    assert "(2, 3, 4)" in str(info.value) and "(3, 4, 5)" in str(info.value)


@pytest.mark.parametrize("op", [operator.add, operator.sub, operator.mul, operator.truediv], ids=lambda f: f.__name__)
def test_broadcast_mismatch_names_both_shapes(device, op):
    with pytest.raises(ValueError) as info:
        op(tt.ones(2, 3, device=device), tt.ones(4, device=device))
    assert "(2, 3)" in str(info.value) and "(4,)" in str(info.value)


def test_reshape_to_wrong_size_raises(device):
    with pytest.raises(ValueError):
        tt.ones(2, 3, device=device).reshape(4, 2)


def test_pickle_and_deepcopy_keep_values_and_device(device):
    """Tensors refer to their backend by device name, so they pickle and deep-copy."""
    import copy
    import pickle

    original = tt.tensor([[1.0, 2.0], [3.0, 4.0]], device=device)
    for clone in (pickle.loads(pickle.dumps(original)), copy.deepcopy(original)):
        assert clone.device == original.device
        np.testing.assert_array_equal(clone.numpy(), original.numpy())
        assert clone.data is not original.data


def test_memory_order_names_arrays_stored_column_major_only():
    from tinytrain.backend import memory_order

    a = np.zeros((3, 4), np.float32)
    assert memory_order(a) == "C" and memory_order(a.T) == "F" and memory_order(np.asfortranarray(a)) == "F"
    assert memory_order(np.zeros(5)) == "C" and memory_order(np.zeros((1, 4)).T) == "C"  # both at once: C
    assert memory_order(a[:, ::2]) == "C"  # neither: C, the order of NumPy's copies


@pytest.mark.parametrize("dtype", [None, "float32", "float64"])
def test_new_tensors_are_row_major_whatever_order_the_data_has(device, dtype):
    """``x.T`` is stored column-major; a tensor made from it is a row-major copy with the same values,
    whether or not its dtype changes (arithmetic mixing the two orders is several times slower)."""
    from tinytrain.backend import memory_order

    column_major = np.arange(6.0).reshape(2, 3).T
    t = tt.tensor(column_major, dtype=dtype, device=device)
    assert memory_order(t.data) == "C" and np.array_equal(t.numpy(), column_major)
    assert memory_order(tt.tensor(tt.tensor(column_major, device=device)).data) == "C"


@st.composite
def _scatter_case(draw):
    """A target, an index into it (basic, or an integer array that may repeat rows) and values for it."""
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4))
    dtype = draw(st.sampled_from([np.float32, np.float64, np.int64]))
    target = draw(hnp.arrays(dtype, shape, elements=st.integers(-5, 5)))
    if shape and draw(st.booleans()):
        index = draw(hnp.arrays(np.int64, st.integers(1, 6), elements=st.integers(-shape[0], shape[0] - 1)))
    else:
        index = draw(hnp.basic_indices(shape, allow_newaxis=True))
    values_shape = target[index].shape
    values = draw(hnp.arrays(np.float64, values_shape, elements=st.floats(-4, 4, width=16)))
    return target, index, values


@given(_scatter_case())
def test_scatter_add_equals_np_add_at_for_every_index(case):
    """The NumPy backend's scatter_add adds up repeated positions and casts exactly as np.add.at does,
    whichever way it takes (one vectorised add for a basic index, np.add.at for an integer array)."""
    target, index, values = case
    expected = target.copy()
    np.add.at(expected, index, values)
    tt.get_backend("cpu").scatter_add(target, index, values)
    np.testing.assert_array_equal(target, expected)
    assert target.dtype == expected.dtype


@pytest.mark.parametrize("rows", [[3, -1, 0, 3, 4, 3, -5], [2], [[4, 4], [4, -1]]])
def test_scatter_add_of_whole_rows_is_np_add_at_bit_for_bit(rows):
    """An embedding's backward (rows of an integer array, repeated and negative) goes to np.add.at on the flat
    array, NumPy's fast loop: the same additions in the same order, so the same bits."""
    rng = np.random.default_rng(0)
    index = np.array(rows)
    start = rng.standard_normal((5, 2, 3)).astype(np.float32)
    for values in (rng.standard_normal(index.shape + (2, 3)).astype(np.float32),
                   rng.standard_normal(index.shape + (2, 3))):  # float64 values cast as np.add.at casts them
        expected, target = start.copy(), start.copy()
        np.add.at(expected, index, values)
        tt.get_backend("cpu").scatter_add(target, index, values)
        np.testing.assert_array_equal(target, expected)


def test_scatter_add_of_rows_out_of_range_raises_as_np_add_at_does():
    for rows in ([0, 5], [-6, 1]):
        target = np.zeros((5, 3), np.float32)
        with pytest.raises(IndexError):
            tt.get_backend("cpu").scatter_add(target, np.array(rows), np.ones((2, 3), np.float32))


def test_scatter_add_takes_a_vectorised_add_for_an_index_that_cannot_repeat(monkeypatch):
    """np.add.at adds element by element: on the slices of a GPT's query/key/value split it makes the
    backward of a GetItem that always scatters (a correct student solution) 20-100x slower than `+=`."""
    import tinytrain.backend as backend_module

    element_wise = []

    class Add:  # np.add, recording np.add.at
        def __call__(self, *args, **kwargs):
            return np.add(*args, **kwargs)

        def at(self, *args):
            element_wise.append(args[1])
            np.add.at(*args)

    class Numpy:
        add = Add()

        def __getattr__(self, name):
            return getattr(np, name)

    monkeypatch.setattr(backend_module, "np", Numpy())
    cpu = tt.get_backend("cpu")
    target, expected = np.zeros((2, 3, 6), np.float32), np.zeros((2, 3, 6), np.float32)

    def scatter(index, values):
        cpu.scatter_add(target, index, values)
        np.add.at(expected, index, values)

    for index in [(Ellipsis, slice(0, 2)), slice(None, None, -1), (1, 2, 3), (None, 0), np.int64(1), ()]:
        scatter(index, np.arange(target[index].size, dtype=np.float32).reshape(target[index].shape))
    assert element_wise == [], f"np.add.at was used for the basic indexes {element_wise}"
    scatter(np.array([0, 0]), np.ones((2, 3, 6), np.float32))
    scatter(np.array([True, False]), np.ones((1, 3, 6), np.float32))
    assert len(element_wise) == 2, "an integer array (which may repeat) or a mask goes to np.add.at"
    assert element_wise[0].shape == (2 * 3 * 6,), "whole rows go to np.add.at's fast loop: one flat index an element"
    np.testing.assert_array_equal(target, expected)
