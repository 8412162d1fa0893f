"""Graded checks of Module 01 (the backend registry, dtype rules, Tensor, factories).

``student`` is the module's code: the installed package's, or a notebook's
(``tinytrain grade 01``). Everything here goes through the student's own
backend registry and ``Tensor``.
"""
import tracemalloc

import numpy as np

from tinytrain.testing.strict import host_reads
from tinytrain.course.checks import check, expect_close, expect_equal, expect_raises


@check(points=2, hint='parse_device splits "kind:index" with str.partition; no index gives None, "cuda:1" gives 1')
def test_parse_device(student):
    for name, expected in (("cpu", ("cpu", None)), ("cuda:1", ("cuda", 1)), ("cuda", ("cuda", None)),
                           ("strict:0", ("strict", 0)), ("cuda:12", ("cuda", 12))):
        expect_equal(student.parse_device(name), expected, f"parse_device({name!r})")
    kind, index = student.parse_device("cuda:12")
    assert isinstance(index, int), f"parse_device('cuda:12'): expected the index as an int, got {index!r}"


@check(points=1, hint="parse_device raises ValueError naming the device (and, for an unknown kind, the known "
                      "kinds) or TypeError naming a device that is not a string")
def test_parse_device_errors(student):
    expect_raises(ValueError, lambda: student.parse_device("tpu"), "parse_device('tpu')", mentions=("tpu", "cpu"))
    expect_raises(ValueError, lambda: student.parse_device("tpu:3"), "parse_device('tpu:3')",
                  mentions=("tpu:3", "cpu"))
    for malformed in ("cuda:x", "cuda:-1", "cuda:1.5", "cuda:+1", "cuda: 1", "cuda:1_0", "cuda:\u00b2", "cuda:"):
        expect_raises(ValueError, lambda: student.parse_device(malformed), f"parse_device({malformed!r})",
                      mentions=(malformed,))
    expect_raises(TypeError, lambda: student.parse_device(3.25), "parse_device(3.25)", mentions=("3.25",))


@check(points=2, hint="get_backend caches one backend per device: every spelling of a device ('strict', "
                      "'strict:0', 'strict:00'; 'cpu' and 'cpu:0') gives the one object made for its normalised name",
       after="test_parse_device")
def test_get_backend_caches(student):
    cpu = student.get_backend("cpu")
    assert cpu is student.get_backend() is student.get_backend(None) is student.get_backend("cpu"), \
        "get_backend('cpu'), get_backend() and get_backend(None): expected one object, got different ones"
    assert cpu.xp is np, f"the CPU backend's xp: expected numpy, got {cpu.xp!r}"
    expect_equal(cpu.device, "cpu", "get_backend('cpu').device")
    assert student.get_backend(cpu) is cpu, "get_backend(backend): expected the Backend passed in, got another object"
    assert student.get_backend("cpu:0") is cpu, "get_backend('cpu:0'): expected the one CPU backend, got another"
    strict = student.get_backend("strict")
    assert strict is student.get_backend("strict:0"), \
        "get_backend('strict') and get_backend('strict:0'): expected one object, got two"
    expect_equal(strict.device, "strict:0", "get_backend('strict').device")
    # a spelling never asked for before, of a device that already has its backend
    assert student.get_backend("strict:00") is strict, \
        "get_backend('strict:00') after get_backend('strict:0'): expected the cached backend, got a new one"
    one = student.get_backend("strict:1")
    assert one is not strict, "get_backend('strict:1'): expected a backend of its own, got the one of 'strict:0'"
    expect_equal(one.device, "strict:1", "get_backend('strict:1').device")
    assert student.get_backend("strict:01") is one, \
        "get_backend('strict:01') after get_backend('strict:1'): expected the cached backend, got a new one"
    loaded = student.loaded_backends()
    assert strict in loaded and cpu in loaded and one in loaded, \
        f"loaded_backends(): expected the cpu, strict:0 and strict:1 backends among them, got {loaded}"
    expect_raises(ValueError, lambda: student.get_backend("tpu:0"), "get_backend('tpu:0')", mentions=("tpu",))
    expect_raises(TypeError, lambda: student.get_backend(3), "get_backend(3) (not a name, a Backend or None)",
                  mentions=("3",))


@check(points=1, hint="float64 -> float32, any int/uint -> int64, everything else (float16/32, bool) unchanged")
def test_default_dtype(student):
    rules = {"float64": "float32", "float32": "float32", "float16": "float16", "int8": "int64", "int16": "int64",
             "uint8": "int64", "uint32": "int64", "uint64": "int64", "int32": "int64", "int64": "int64",
             "bool": "bool"}
    for given, expected in rules.items():
        expect_equal(student.default_dtype(np.dtype(given)), np.dtype(expected), f"default_dtype({given})")


@check(points=1, hint="to_array casts to dtype when one is given (a Tensor too), else to default_dtype of the data's "
                      "dtype (a Python number too: 3.5 is float64 data); a Tensor without dtype= keeps its own",
       after="test_default_dtype")
def test_to_array_dtypes(student):
    array, backend = student.to_array([[1.0, 2.0]])
    expect_equal(array.dtype, np.dtype("float32"), "to_array([[1.0, 2.0]]) dtype")
    expect_equal(array.shape, (1, 2), "to_array([[1.0, 2.0]]) shape")
    assert backend is student.get_backend("cpu"), f"to_array of a list: expected the cpu backend, got {backend!r}"
    expect_equal(student.to_array(np.arange(3, dtype=np.uint8))[0].dtype, np.dtype("int64"),
                 "to_array(uint8 array) dtype")
    expect_equal(student.to_array([True, False])[0].dtype, np.dtype("bool"), "to_array([True, False]) dtype")
    expect_equal(student.to_array([1, 2], dtype="float64")[0].dtype, np.dtype("float64"),
                 "to_array([1, 2], dtype='float64') dtype")
    expect_equal(student.to_array(3.5)[0].shape, (), "to_array(3.5) shape")
    expect_equal(student.to_array(3.5)[0].dtype, np.dtype("float32"), "to_array(3.5) dtype")
    expect_equal(student.to_array(7)[0].dtype, np.dtype("int64"), "to_array(7) dtype")
    expect_equal(student.to_array(student.Tensor([1.0]), dtype="float64")[0].dtype, np.dtype("float64"),
                 "to_array(float32 Tensor, dtype='float64') dtype (dtype= applies to a Tensor too)")
    half = student.Tensor(np.zeros(2, dtype=np.float16))
    expect_equal(student.to_array(half)[0].dtype, np.dtype("float16"), "to_array(float16 Tensor) dtype")
    wide = student.Tensor(np.zeros(2), dtype="float64")
    expect_equal(student.to_array(wide)[0].dtype, np.dtype("float64"), "to_array(float64 Tensor) dtype")


@check(points=1, hint="every array to_array returns is row-major (C-contiguous): astype(..., order='C'), also for a "
                      "transposed array and after a move to another device")
def test_to_array_row_major(student):
    column_major = np.asfortranarray(np.arange(12.0).reshape(3, 4))
    for what, data, device in (("to_array(a float64 column-major array)", column_major, None),
                               ("to_array(a float32 column-major array, device='strict')",
                                column_major.astype(np.float32, order="F"), "strict")):
        array, _ = student.to_array(data, device=device)
        assert array.flags.c_contiguous, f"{what}: expected a C-contiguous (row-major) array, got flags " \
                                         f"c_contiguous={array.flags.c_contiguous}, f_contiguous={array.flags.f_contiguous}"
        expect_close(array.tolist() if device else array, column_major, what)


@check(points=1, hint="the array to_array returns never shares memory with the data: copy when no step copied, and "
                      "only then (a move to another device already copies); np.asarray copies only lists, tuples "
                      "and numbers")
def test_to_array_copies(student):
    source = np.zeros(3, dtype=np.float32)
    array, _ = student.to_array(source)
    assert array is not source and not np.shares_memory(array, source), \
        "to_array(float32 array): expected a new array, got one sharing memory with the data"
    t = student.Tensor([1.0, 2.0])
    copied, _ = student.to_array(t)
    assert copied is not t.data and not np.shares_memory(copied, t.data), \
        "to_array(Tensor): expected a new array, got one sharing memory with the tensor's"
    source = np.ones(3)
    tensor = student.Tensor(source)
    source[0] = 5.0
    expect_equal(tensor.numpy(), np.ones(3, dtype=np.float32), "Tensor(array) after the array changed")
    source = np.ones(3, dtype=np.float32)
    tensor = student.Tensor(memoryview(source))  # np.asarray gives a view of source's memory
    source[0] = 5.0
    expect_equal(tensor.numpy(), np.ones(3, dtype=np.float32), "Tensor(memoryview(array)) after the array changed")

    class Column:
        """An object that hands out the array it keeps, as a pandas column does."""

        def __init__(self):
            self.values = np.ones(3, dtype=np.float32)

        def __array__(self, dtype=None, copy=None):
            return self.values

    column = Column()
    array, _ = student.to_array(column)
    column.values[0] = 5.0
    expect_equal(array, np.ones(3, dtype=np.float32),
                 "to_array(an object whose __array__ returns the array it keeps) after that array changed")
    # a move between devices is a copy already: a second one would double the memory of a large tensor
    # a cast copies, and so does a move between devices: a second copy would double the memory of a large tensor
    big = np.ones((256, 512), dtype=np.float32)
    student.get_backend("strict")
    for what, data, device in (("to_array(a 512 KiB float32 array, device='strict')", big, "strict"),
                               ("to_array(a 512 KiB strict tensor, device='cpu')",
                                student.Tensor(big, device="strict"), "cpu"),
                               ("to_array(a 1 MiB float64 array), cast to 512 KiB of float32", big.astype(np.float64),
                                None),
                               ("to_array(a list of 65536 ints): np.asarray makes the only array needed",
                                list(range(65536)), None),
                               ("to_array(a 512 KiB strict tensor, device='strict'), already there",
                                student.Tensor(big, device="strict"), "strict")):
        reads = host_reads()
        tracemalloc.start()
        try:
            array, _ = student.to_array(data, device=device)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 1.5 * big.nbytes, f"{what}: expected one copy of {big.nbytes} bytes at most, got a peak of " \
                                        f"{peak} bytes allocated (copied twice?)"
        if device == "strict" and not isinstance(data, np.ndarray):
            expect_equal(host_reads() - reads, 0, f"host reads in {what} (no move to the device it is on)")


@check(points=1, hint="to_array moves data with target.from_host(source.to_host(array)); non-numbers raise TypeError "
                      "naming the dtype")
def test_to_array_devices_and_errors(student):
    array, strict = student.to_array([1.0, 2.0], device="strict")
    assert strict is student.get_backend("strict"), f"to_array(..., device='strict'): expected the strict backend, " \
                                                   f"got {strict!r}"
    assert strict.is_array(array), f"to_array(..., device='strict'): expected a strict-device array, got " \
                                   f"{type(array).__name__}"
    back, cpu = student.to_array(student.Tensor(array), device="cpu")
    assert cpu is student.get_backend("cpu"), f"to_array(..., device='cpu'): expected the cpu backend, got {cpu!r}"
    assert isinstance(back, np.ndarray), f"to_array(strict tensor, device='cpu'): expected a numpy.ndarray, got " \
                                         f"{type(back).__name__}"
    again, same = student.to_array(array, device=cpu)  # a Backend object names its device too
    assert same is cpu and isinstance(again, np.ndarray), \
        f"to_array(strict array, device=<cpu Backend>): expected a numpy array and the cpu backend, got " \
        f"{type(again).__name__} and {same!r}"
    expect_equal(back, np.array([1.0, 2.0], dtype=np.float32), "to_array(strict tensor, device='cpu')")
    for what, data in (("a strict array", array), ("a strict tensor", student.Tensor([1.0], device="strict"))):
        kept, where = student.to_array(data)
        assert where is strict and strict.is_array(kept), (
            f"to_array({what}) without a device keeps it where it is: expected a strict-device array and the strict "
            f"backend, got {type(kept).__name__} and {where!r}")
    expect_raises(TypeError, lambda: student.to_array(["a", "b"]), "to_array(['a', 'b'])", mentions=("<U1",))
    expect_raises(TypeError, lambda: student.to_array(np.array(["a"])), "to_array(np.array(['a']))", mentions=("<U1",))
    expect_raises(TypeError, lambda: student.to_array(np.array([1 + 2j])), "to_array(np.array([1 + 2j]))",
                  mentions=("complex128",))
    strict_tensor = student.Tensor([1.0, 2.0], device="strict")
    expect_equal((strict_tensor + [1.0, 2.0]).numpy(), np.array([2.0, 4.0], np.float32),
                 "Tensor([1.0, 2.0], device='strict') + [1.0, 2.0] (the list goes to the tensor's device, a Backend)")


@check(points=1, hint="Tensor(data) takes its array and backend from to_array: shape, dtype, device and item()",
       after="test_to_array_dtypes")
def test_tensor_construction(student):
    x = student.Tensor([[1.0, 2.0], [3.0, 4.0]])
    expect_equal((x.shape, x.dtype, x.device), ((2, 2), np.dtype("float32"), "cpu"),
                 "Tensor([[1.0, 2.0], [3.0, 4.0]]) (shape, dtype, device)")
    expect_equal(student.tensor(np.arange(3)).dtype, np.dtype("int64"), "tensor(np.arange(3)).dtype")
    expect_equal(student.Tensor(7).item(), 7, "Tensor(7).item()")
    item = student.Tensor(2.5).item()
    assert isinstance(item, float), f"Tensor(2.5).item(): expected a Python float, got {item!r}"
    y = student.tensor([1.0, 2.0], requires_grad=True, device="strict")
    expect_equal((y.requires_grad, y.device), (True, "strict:0"),
                 "tensor([1.0, 2.0], requires_grad=True, device='strict') (requires_grad, device)")
    expect_equal(y.numpy(), np.array([1.0, 2.0], dtype=np.float32), "tensor([1.0, 2.0], device='strict')")


def _expect_on_strict(student, factory: str, source: str) -> None:
    """``factory(2, device="strict")`` is on the strict device and holds that device's array (``source`` says how)."""
    made = getattr(student, factory)(2, device="strict")
    expect_equal(made.device, "strict:0", f"{factory}(2, device='strict').device")
    assert student.get_backend("strict").is_array(made.data), \
        f"{factory}(2, device='strict').data: expected an array of the strict device ({source}), " \
        f"got {type(made.data).__name__}"


@check(points=1, hint="zeros/ones take f(2, 3) or f((2, 3)), dtype (default float32), device and requires_grad")
def test_zeros_ones(student):
    expect_equal(student.zeros(2, 3).shape, (2, 3), "zeros(2, 3).shape")
    expect_equal(student.zeros((2, 3)).shape, (2, 3), "zeros((2, 3)).shape")
    expect_equal((student.zeros().shape, student.ones(()).shape), ((), ()), "(zeros().shape, ones(()).shape): 0-d")
    for what, got, expected in (("zeros(2, 3)", student.zeros(2, 3), np.zeros((2, 3), dtype=np.float32)),
                                ("ones(4, dtype='float64')", student.ones(4, dtype="float64"), np.ones(4)),
                                ("ones(2, dtype='int64')", student.ones(2, dtype="int64"), np.ones(2, dtype=np.int64)),
                                ("ones((1, 3))", student.ones((1, 3)), np.ones((1, 3), dtype=np.float32)),
                                ("zeros(2, dtype='float16')", student.zeros(2, dtype="float16"),
                                 np.zeros(2, dtype=np.float16)),
                                ("zeros(3, dtype='int64')", student.zeros(3, dtype="int64"),
                                 np.zeros(3, dtype=np.int64))):
        expect_close(got, expected, what, dtype=expected.dtype)
    for name in ("zeros", "ones"):  # Module 02's lesson builds its leaves with ones(..., requires_grad=True)
        make = getattr(student, name)
        expect_equal(make(2, requires_grad=True).requires_grad, True, f"{name}(2, requires_grad=True).requires_grad")
        expect_equal(make(2).requires_grad, False, f"{name}(2).requires_grad")
        _expect_on_strict(student, name, "made with the backend's xp")


@check(points=2, hint="randn/rand draw from the backend's generator (random_normal/random_uniform with the shape and "
                      "dtype, float64 drawn as float64): manual_seed repeats them")
def test_randn_rand(student):
    student.manual_seed(0)
    first = student.randn(3, 4)
    student.manual_seed(0)
    expect_equal(student.randn(3, 4).numpy(), first.numpy(), "randn(3, 4) after manual_seed(0) again")
    for name, draw in (("randn", "random_normal"), ("rand", "random_uniform")):
        student.manual_seed(0)
        expected = getattr(student.get_backend("cpu"), draw)((3, 4))  # the device's own generator, not np.random's
        student.manual_seed(0)
        expect_equal(getattr(student, name)(3, 4).numpy(), expected, f"{name}(3, 4) after manual_seed(0): the draws "
                     f"of get_backend('cpu').{draw}((3, 4)) after the same seed")
        student.manual_seed(0)
        expected = getattr(student.get_backend("cpu"), draw)((3, 4), "float64")  # drawn in float64, not cast up
        student.manual_seed(0)
        expect_equal(getattr(student, name)(3, 4, dtype="float64").numpy(), expected,
                     f"{name}(3, 4, dtype='float64') after manual_seed(0): the draws of get_backend('cpu')."
                     f"{draw}((3, 4), 'float64') after the same seed")
    expect_equal((first.shape, first.dtype), ((3, 4), np.dtype("float32")), "randn(3, 4) (shape, dtype)")
    normal = student.randn(20_000, dtype="float64").numpy()
    expect_equal(normal.dtype, np.dtype("float64"), "randn(20000, dtype='float64').dtype")
    expect_close([normal.mean(), normal.std()], [0.0, 1.0], "randn(20000): [mean, std]", atol=0.05)
    uniform = student.rand((50, 40)).numpy()
    expect_equal((uniform.shape, uniform.dtype), ((50, 40), np.dtype("float32")), "rand((50, 40)) (shape, dtype)")
    assert uniform.min() >= 0.0 and uniform.max() < 1.0, \
        f"rand((50, 40)): expected values in [0, 1), got min {uniform.min()}, max {uniform.max()}"
    expect_close(uniform.mean(), 0.5, "rand((50, 40)).mean()", atol=0.05)
    wide = student.rand(20_000, dtype="float64").numpy()
    expect_equal(wide.dtype, np.dtype("float64"), "rand(20000, dtype='float64').dtype")
    expect_close(wide.mean(), 0.5, "rand(20000, dtype='float64').mean()", atol=0.05)
    expect_equal(student.rand(2, requires_grad=True).requires_grad, True, "rand(2, requires_grad=True).requires_grad")
    expect_equal(student.randn(2, requires_grad=True).requires_grad, True, "randn(2, requires_grad=True).requires_grad")
    student.manual_seed(0)
    one, two = student.randn(3).numpy(), student.randn(3).numpy()
    assert not np.array_equal(one, two), f"two randn(3) after one manual_seed(0): expected different draws (the " \
                                         f"generator goes on), got {one} twice"
    for name in ("randn", "rand"):
        _expect_on_strict(student, name, "from its generator")
