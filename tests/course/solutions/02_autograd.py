"""Module 02 (autograd): a student's solutions, written from the lesson alone."""


class Function:
    @classmethod
    def apply(cls, *inputs, **params):
        fn = cls()
        fn.backend = inputs[0]._backend
        arrays = [t.data for t in inputs]
        try:
            data = fn.forward(*arrays, **params)
        except ValueError as error:
            shapes = [str(tuple(t.shape)) for t in inputs]
            if len(shapes) == 1:
                described = f"a tensor with shape {shapes[0]}"
            else:
                described = "tensors with shapes " + ", ".join(shapes[:-1]) + " and " + shapes[-1]
            raise ValueError(f"{cls.__name__} of {described}: {error}") from error
        backend = fn.output_backend or fn.backend
        if not backend.is_array(data):
            data = backend.xp.asarray(data)
        requires_grad = is_grad_enabled() and any(t.requires_grad for t in inputs)
        out = inputs[0]._make(data, backend, requires_grad)
        if requires_grad:
            out._ctx = fn
            fn.inputs = inputs
            fn.sequence = next(_creation_order)
        return out


def sum_to_shape(grad, shape):
    if grad.shape == shape:
        return grad
    extra = grad.ndim - len(shape)
    if extra > 0:
        # keepdims then reshape: a 0-d array for shape (), not a NumPy scalar
        grad = grad.sum(axis=tuple(range(extra)), keepdims=True).reshape(grad.shape[extra:])
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    if axes:
        grad = grad.sum(axis=axes, keepdims=True)
    return grad


class Mul:
    def backward(self, grad):
        a, b = self.a, self.b
        grad_a = sum_to_shape(grad * b, a.shape) if self.inputs[0].requires_grad else None
        grad_b = sum_to_shape(grad * a, b.shape) if self.inputs[1].requires_grad else None
        return grad_a, grad_b


class Pow:
    def backward(self, grad):
        a, b = self.a, self.b
        grad_a = None
        grad_b = None
        if self.inputs[0].requires_grad:
            grad_a = sum_to_shape(grad * b * a ** (b - 1), a.shape)
        if self.inputs[1].requires_grad:
            grad_b = sum_to_shape(grad * self.out * self.xp.log(a), b.shape)
        return grad_a, grad_b


class MatMul:
    def backward(self, grad):
        a, b = self.a, self.b
        # promote vectors to matrices: a (k,) -> (1, k), b (k,) -> (k, 1)
        a2 = a[None, :] if a.ndim == 1 else a
        b2 = b[:, None] if b.ndim == 1 else b
        g = grad
        if b.ndim == 1:
            g = g[..., None]
        if a.ndim == 1:
            g = g[..., None, :]
        grad_a = None
        grad_b = None
        if self.inputs[0].requires_grad:
            grad_a = sum_to_shape(g @ b2.swapaxes(-1, -2), a2.shape)
            if a.ndim == 1:
                grad_a = grad_a.reshape(a.shape)
        if self.inputs[1].requires_grad:
            grad_b = sum_to_shape(a2.swapaxes(-1, -2) @ g, b2.shape)
            if b.ndim == 1:
                grad_b = grad_b.reshape(b.shape)
        return grad_a, grad_b


class Max:
    def backward(self, grad):
        winners = (self.a == self.peak).astype(self.a.dtype)
        share = winners / winners.sum(axis=self.axis, keepdims=True)
        grad = _expand_reduced(self.xp, grad, self.axis, self.keepdims)
        return (grad * share,)


class Sigmoid:
    def forward(self, a):
        e = self.xp.exp(-self.xp.abs(a))  # always in (0, 1]: never overflows
        self.out = self.xp.where(a >= 0, 1 / (1 + e), e / (1 + e))
        return self.out


class Softmax:
    def forward(self, a, axis):
        self.axis = axis
        shifted = a - a.max(axis=axis, keepdims=True)
        e = self.xp.exp(shifted)
        self.out = e / e.sum(axis=axis, keepdims=True)
        return self.out

    def backward(self, grad):
        s = self.out
        return (s * (grad - (grad * s).sum(axis=self.axis, keepdims=True)),)


class GetItem:
    def backward(self, grad):
        out = self.xp.zeros(self.shape, dtype=grad.dtype)
        if _is_integer_array_index(self.index):
            self.backend.scatter_add(out, self.index, grad)  # repeated positions add up
        else:
            out[self.index] = grad
        return (out,)


def backward(tensor, grad=None, retain_graph=False):
    root = tensor._ctx
    grads = {root: grad}  # operation -> gradient collected for its output
    owns = {root: owned}  # operation -> whether that gradient is the engine's alone
    heap = [(-root.sequence, root)]
    while heap:
        _, fn = heapq.heappop(heap)
        if fn.inputs is None:
            raise _freed_graph_error()
        incoming = grads.pop(fn)
        fn.owns_grad = owns.pop(fn)
        input_grads = fn.backward(incoming)
        if not isinstance(input_grads, tuple):
            raise TypeError(f"{type(fn).__name__}.backward must return a tuple, got {type(input_grads).__name__}")
        for t, g in zip(fn.inputs, input_grads):
            if g is None or not t.requires_grad:
                continue
            unshared = not retain_graph and _unshared(g, fn, input_grads, incoming)
            if t._ctx is None:
                _accumulate(t, g, unshared)
            else:
                creator = t._ctx
                if creator in grads:
                    grads[creator] = grads[creator] + g
                    owns[creator] = True
                else:
                    grads[creator] = g
                    owns[creator] = unshared
                    heapq.heappush(heap, (-creator.sequence, creator))
        if not retain_graph:
            # free the graph: drop the saved arrays and the links to the inputs
            sequence = fn.sequence
            vars(fn).clear()
            fn.sequence = sequence
            fn.inputs = None


def gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-3):
    worst = None  # (excess over tolerance, input, index, analytic, numerical)
    for i in checked:
        x = inputs[i]
        if x.grad is None:
            analytic = np.zeros(x.shape, dtype=np.float64)
        else:
            analytic = x.grad.numpy().astype(np.float64)
        for index in np.ndindex(*x.shape):
            original = x.data[index].copy()
            x.data[index] = original + eps
            plus = projected_output()
            x.data[index] = original - eps
            minus = projected_output()
            x.data[index] = original
            numerical = (plus - minus) / (2 * eps)
            a = float(analytic[index])
            excess = abs(a - numerical) - (atol + rtol * abs(numerical))
            if np.isnan(excess):
                excess = np.inf
            if worst is None or excess > worst[0]:
                worst = (excess, i, index, a, numerical)
    if worst is not None and worst[0] > 0:
        _, i, index, a, numerical = worst
        raise GradcheckError(
            f"gradcheck: input {i} at index {index}: analytic gradient {a:.8g} but numerical {numerical:.8g} "
            f"(difference {abs(a - numerical):.3g}, allowed atol={atol} + rtol={rtol} * |numerical|)"
        )
    return True
