"""Graded checks of Module 01 (the backend registry, dtype rules, Tensor, factories).

``student`` is the module's code: the installed package's, or a notebook's
(``tinytrain grade 01``). Everything here goes through the student's own
backend registry and ``Tensor``.
"""
import numpy as np
import pytest

from tinytrain.course.checks import check


@check(points=2, hint='parse_device splits "kind:index" with str.partition; no index gives None, "cuda:1" gives 1')
def test_parse_device(student):
    assert student.parse_device("cpu") == ("cpu", None)
    assert student.parse_device("cuda:1") == ("cuda", 1)
    assert student.parse_device("cuda") == ("cuda", None)
    assert student.parse_device("strict:0") == ("strict", 0)
    kind, index = student.parse_device("cuda:12")
    assert (kind, index) == ("cuda", 12) and isinstance(index, int)


@check(points=1, hint="parse_device raises ValueError naming the device and the known kinds, or a malformed index")
def test_parse_device_errors(student):
    with pytest.raises(ValueError) as unknown:
        student.parse_device("tpu")
    assert "tpu" in str(unknown.value) and "cpu" in str(unknown.value), "name the device and the known kinds"
    for malformed in ("cuda:x", "cuda:-1", "cuda:1.5"):
        with pytest.raises(ValueError):
            student.parse_device(malformed)
    with pytest.raises(TypeError):
        student.parse_device(0)


@check(points=2, hint="get_backend caches one backend per device: 'cuda' and 'cuda:0' (or 'strict', 'strict:0') are one object")
def test_get_backend_caches(student):
    cpu = student.get_backend("cpu")
    assert cpu is student.get_backend() is student.get_backend(None) is student.get_backend("cpu")
    assert cpu.xp is np and cpu.device == "cpu"
    assert student.get_backend(cpu) is cpu, "a Backend passed in comes back as it is"
    strict = student.get_backend("strict")
    assert strict is student.get_backend("strict:0"), "'strict' means 'strict:0': one backend for both names"
    assert strict.device == "strict:0"
    assert student.get_backend("strict:1") is not strict and student.get_backend("strict:1").device == "strict:1"
    assert strict in student.loaded_backends() and cpu in student.loaded_backends()
    with pytest.raises(ValueError):
        student.get_backend("tpu:0")


@check(points=1, hint="float64 -> float32, any int/uint -> int64, everything else (float16/32, bool) unchanged")
def test_default_dtype(student):
    rules = {"float64": "float32", "float32": "float32", "float16": "float16", "int8": "int64",
             "uint8": "int64", "int32": "int64", "int64": "int64", "bool": "bool"}
    for given, expected in rules.items():
        assert student.default_dtype(np.dtype(given)) == np.dtype(expected), f"default_dtype({given})"


@check(points=1, hint="to_array casts to dtype, else to default_dtype of the data's dtype; a Tensor keeps its dtype")
def test_to_array_dtypes(student):
    array, backend = student.to_array([[1.0, 2.0]])
    assert array.dtype == np.float32 and array.shape == (1, 2)
    assert backend is student.get_backend("cpu")
    assert student.to_array(np.arange(3, dtype=np.uint8))[0].dtype == np.int64
    assert student.to_array([True, False])[0].dtype == np.bool_
    assert student.to_array([1, 2], dtype="float64")[0].dtype == np.float64
    assert student.to_array(3.5)[0].shape == ()
    half = student.Tensor(np.zeros(2, dtype=np.float16))
    assert student.to_array(half)[0].dtype == np.float16


@check(points=1, hint="the array to_array returns never shares memory with the data: copy when no step copied")
def test_to_array_copies(student):
    source = np.zeros(3, dtype=np.float32)
    array, _ = student.to_array(source)
    assert array is not source and not np.shares_memory(array, source)
    t = student.Tensor([1.0, 2.0])
    copied, _ = student.to_array(t)
    assert copied is not t.data and not np.shares_memory(copied, t.data)
    source = np.ones(3)
    tensor = student.Tensor(source)
    source[0] = 5.0
    assert tensor.numpy()[0] == 1.0, "a tensor must not change when the array it was built from does"


@check(points=1, hint="to_array moves data with target.from_host(source.to_host(array)); non-numbers raise TypeError")
def test_to_array_devices_and_errors(student):
    array, strict = student.to_array([1.0, 2.0], device="strict")
    assert strict is student.get_backend("strict") and strict.is_array(array)
    back, cpu = student.to_array(student.Tensor(array), device="cpu")
    assert cpu is student.get_backend("cpu") and isinstance(back, np.ndarray)
    again, same = student.to_array(array, device=cpu)  # a Backend object names its device too
    assert same is cpu and isinstance(again, np.ndarray), "device= may be a Backend object, as get_backend takes"
    np.testing.assert_array_equal(back, [1.0, 2.0])
    with pytest.raises(TypeError) as error:
        student.to_array(["a", "b"])
    assert "<U1" in str(error.value), "say which dtype cannot become a tensor"


@check(points=1, hint="Tensor(data) takes its array and backend from to_array: shape, dtype, device and item()")
def test_tensor_construction(student):
    x = student.Tensor([[1.0, 2.0], [3.0, 4.0]])
    assert x.shape == (2, 2) and x.dtype == np.float32 and x.device == "cpu"
    assert student.tensor(np.arange(3)).dtype == np.int64
    assert student.Tensor(7).item() == 7 and isinstance(student.Tensor(2.5).item(), float)
    y = student.tensor([1.0, 2.0], requires_grad=True, device="strict")
    assert y.requires_grad and y.device == "strict:0"
    np.testing.assert_array_equal(y.numpy(), [1.0, 2.0])


@check(points=1, hint="zeros/ones take f(2, 3) or f((2, 3)), dtype (default float32), device and requires_grad")
def test_zeros_ones(student):
    assert student.zeros(2, 3).shape == student.zeros((2, 3)).shape == (2, 3)
    assert student.zeros(2, 3).dtype == np.float32 and not student.zeros(2).numpy().any()
    ones = student.ones(4, dtype="float64")
    assert ones.dtype == np.float64 and ones.numpy().tolist() == [1, 1, 1, 1]
    assert student.ones(2, dtype="int64").dtype == np.int64
    assert student.zeros(2, requires_grad=True).requires_grad
    assert student.ones(3, device="strict").device == "strict:0"


@check(points=2, hint="randn/rand draw from the backend's generator (random_normal/random_uniform): manual_seed repeats them")
def test_randn_rand(student):
    student.manual_seed(0)
    first = student.randn(3, 4)
    student.manual_seed(0)
    assert np.array_equal(first.numpy(), student.randn(3, 4).numpy()), "manual_seed must make randn reproducible"
    assert first.shape == (3, 4) and first.dtype == np.float32
    normal = student.randn(20_000, dtype="float64").numpy()
    assert normal.dtype == np.float64 and abs(normal.mean()) < 0.05 and abs(normal.std() - 1) < 0.05
    uniform = student.rand((50, 40)).numpy()
    assert uniform.shape == (50, 40) and uniform.dtype == np.float32
    assert uniform.min() >= 0.0 and uniform.max() < 1.0 and abs(uniform.mean() - 0.5) < 0.05
    assert student.rand(2, requires_grad=True).requires_grad
    assert student.randn(2, device="strict").device == "strict:0"
