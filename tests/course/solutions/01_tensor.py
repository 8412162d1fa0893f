"""Module 01 (tensor): a student's solutions, written from the lesson alone."""


def parse_device(device):
    if not isinstance(device, str):
        raise TypeError(f"a device name must be a string such as 'cpu' or 'cuda:0', got {device!r}")
    kind, colon, index_text = device.partition(":")
    if not kind or (colon and not (index_text.isascii() and index_text.isdigit())):
        raise ValueError(f"malformed device name {device!r}: expected 'kind' or 'kind:index', e.g. 'cpu' or 'cuda:1'")
    if kind not in _FACTORIES:
        raise ValueError(f"unknown device {device!r}; available kinds: {', '.join(sorted(_FACTORIES))}")
    index = int(index_text) if colon else None
    return (kind, index)


def get_backend(device=None):
    kind, index = parse_device(device)
    if kind == "cpu":  # there is one CPU: "cpu" (and "cpu:0") is the device "cpu"
        name = "cpu"
    else:  # "cuda" means "cuda:0"
        name = f"{kind}:{0 if index is None else index}"
    backend = _BACKENDS.get(name)
    if backend is None:
        backend = _FACTORIES[kind](name)
        _BACKENDS[name] = backend
    _BACKENDS[device] = backend


def default_dtype(dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        if dtype == float16 or dtype == float32:
            return dtype
        return float32
    if dtype.kind in "iu":
        return int64
    if dtype.kind == "b":
        return bool_
    raise TypeError(f"only bool, integer and float data can become a tensor, got dtype {dtype}")


def to_array(data, dtype=None, device=None):
    # 1. where is the data now?
    owned = False  # True once some step made an array that only we hold
    if isinstance(data, Tensor):
        array, source = data.data, data._backend
    else:
        source = backend_of_array(data)
        if source is not None:
            array = data
        else:
            array = np.asarray(data)
            owned = isinstance(data, (list, tuple, int, float))  # asarray built it; a memoryview or __array__ may share
            source = get_backend("cpu")
    if array.dtype.kind not in "biuf":
        raise TypeError(f"only bool, integer and float data can become a tensor, got dtype {array.dtype}")
    # 2. move it
    target = source if device is None else get_backend(device)
    if target is not source:
        array, owned = target.from_host(source.to_host(array)), True
    # 3. cast it, row-major
    if dtype is not None:
        dtype = np.dtype(dtype)
    elif isinstance(data, Tensor):
        dtype = array.dtype
    else:
        dtype = default_dtype(array.dtype)
    cast = array.astype(dtype, order="C", copy=False)
    if cast is array and not owned:  # no step made a copy
        cast = cast.copy()
    array = cast
    return array, target


def zeros(*shape, dtype=None, device=None, requires_grad=False):
    return _filled(lambda backend, shape, dtype: backend.xp.zeros(shape, dtype=dtype),
                   shape, dtype, device, requires_grad)


def ones(*shape, dtype=None, device=None, requires_grad=False):
    return _filled(lambda backend, shape, dtype: backend.xp.ones(shape, dtype=dtype),
                   shape, dtype, device, requires_grad)


def randn(*shape, dtype=None, device=None, requires_grad=False):
    return _filled(lambda backend, shape, dtype: backend.random_normal(shape, dtype),
                   shape, dtype, device, requires_grad)


def rand(*shape, dtype=None, device=None, requires_grad=False):
    return _filled(lambda backend, shape, dtype: backend.random_uniform(shape, dtype),
                   shape, dtype, device, requires_grad)
