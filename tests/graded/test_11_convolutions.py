"""Graded checks of Module 11 (convolutions): the loop convolution of the lesson, im2col and
col2im, the convolution's forward and backward passes, ``conv2d`` and its errors, ``Conv2d``'s
initialisation, max and average pooling (values, the first-maximum tie rule, overlapping windows,
1x1 and very large windows) and a Conv -> BatchNorm2d -> ReLU -> MaxPool block.

``student`` is the module's code: the installed package's, or a notebook's
(``tinytrain grade 11``). Every value is compared with a plain NumPy loop written
here, independent of im2col; gradients also with ``tt.gradcheck`` in float64 on
tiny shapes. The convolution's checks run on the CPU and on the strict device.
``conv2d_loops`` lives in a lesson cell, not an export cell, so it is not among
``student``'s names: :func:`lesson_function` runs the cell that defines it.
"""
import ast
import re
from pathlib import Path

import nbformat
import numpy as np

import tinytrain as tt
from tinytrain.testing.strict import host_reads
from tinytrain.course.checks import check, expect_close, expect_equal, expect_gradcheck, expect_raises
from tinytrain.course.inventory import installed_modules

RNG = np.random.default_rng(9)
ROOT = Path(__file__).resolve().parents[2]


# -- the student's lesson-cell function -------------------------------------------------------------

def lesson_function(student, name):
    """``name`` as the student wrote it in a lesson cell (not an export cell): from the graded
    notebook; for the installed package, from the notebook its code was exported from, or from
    the module source when the package holds the reference. The cell's imports, functions and
    classes run (nothing else: no lesson code, no plots), with ``np`` defined as in the notebook."""
    origin = student._tt_origin
    if origin == "installed":
        installed = installed_modules().get(student._tt_module)
        exported = sorted(set(installed.exported.values())) if installed is not None else []
        origin = exported[0] if exported else None
    if origin is None:
        where = ROOT / "modules" / student._tt_module / f"{student._tt_module}.py"
        sources = re.split(r"^# %%.*$", where.read_text(encoding="utf-8"), flags=re.M)
    else:
        where = next((path for path in (Path(origin), ROOT / origin) if path.is_file()), Path(origin))
        assert where.is_file(), f"{name}: expected to read the notebook {origin}, but it does not exist"
        sources = [cell.source for cell in nbformat.read(where, as_version=4).cells if cell.cell_type == "code"]
    found = None
    for source in sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        if any(isinstance(node, ast.FunctionDef) and node.name == name for node in tree.body):
            found = tree  # the last definition wins, as when the notebook runs top to bottom
    assert found is not None, f"expected a code cell that defines {name}(...) in {where}, found none"
    keep = [node for node in found.body if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef,
                                                             ast.ClassDef))]
    namespace = {"np": np, "__name__": f"lesson_{name}"}
    exec(compile(ast.Module(keep, type_ignores=[]), f"<the cell of {name} in {where.name}>", "exec"), namespace)
    return namespace[name]


# -- NumPy references, one output number at a time ------------------------------------------------

def loops_conv(x, w, b=None, stride=(1, 1), padding=(0, 0)):
    """y[n, o, r, q] = b[o] + sum over (c, i, j) of w[o, c, i, j] * padded x[n, c, r*sh + i, q*sw + j]."""
    (sh, sw), (ph, pw) = stride, padding
    x = np.pad(np.asarray(x, dtype=np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    n_images, _, height, width = x.shape
    out_channels, _, kh, kw = w.shape
    out = np.zeros((n_images, out_channels, (height - kh) // sh + 1, (width - kw) // sw + 1))
    for n, o, r, q in np.ndindex(*out.shape):
        out[n, o, r, q] = (x[n, :, r * sh:r * sh + kh, q * sw:q * sw + kw] * w[o]).sum() + (0 if b is None else b[o])
    return out


def loops_conv_grads(x, w, g, stride, padding):
    """(dL/dx, dL/dw, dL/db) for L = sum(g * conv(x, w, b)), one output number at a time."""
    (sh, sw), (ph, pw) = stride, padding
    padded = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    grad_padded, grad_w = np.zeros_like(padded), np.zeros_like(w)
    _, _, kh, kw = w.shape
    for n, o, r, q in np.ndindex(*g.shape):
        rows, cols = slice(r * sh, r * sh + kh), slice(q * sw, q * sw + kw)
        grad_padded[n, :, rows, cols] += g[n, o, r, q] * w[o]
        grad_w[o] += g[n, o, r, q] * padded[n, :, rows, cols]
    height, width = padded.shape[2:]
    return grad_padded[:, :, ph:height - ph, pw:width - pw], grad_w, g.sum(axis=(0, 2, 3))


def windows(shape, kernel, stride):
    """Every pooling window: (r, q, rows, cols) for an (N, C, H, W) input."""
    (kh, kw), (sh, sw) = kernel, stride
    out_h, out_w = (shape[2] - kh) // sh + 1, (shape[3] - kw) // sw + 1
    for r in range(out_h):
        for q in range(out_w):
            yield r, q, slice(r * sh, r * sh + kh), slice(q * sw, q * sw + kw)


def loops_pool(x, kernel, stride, reduce):
    (kh, kw), (sh, sw) = kernel, stride
    out = np.empty(x.shape[:2] + ((x.shape[2] - kh) // sh + 1, (x.shape[3] - kw) // sw + 1))
    for r, q, rows, cols in windows(x.shape, kernel, stride):
        out[:, :, r, q] = reduce(x[:, :, rows, cols], axis=(2, 3))
    return out


def loops_max_pool_grad(x, g, kernel, stride):
    """Each window's gradient goes to its FIRST maximum, reading the window row by row."""
    grad = np.zeros_like(x)
    for r, q, rows, cols in windows(x.shape, kernel, stride):
        for n, c in np.ndindex(*x.shape[:2]):
            window = x[n, c, rows, cols]
            i, j = np.unravel_index(np.argmax(window), window.shape)  # argmax: the first maximum
            grad[n, c, rows.start + i, cols.start + j] += g[n, c, r, q]
    return grad


def loops_avg_pool_grad(shape, g, kernel, stride):
    grad = np.zeros(shape)
    for r, q, rows, cols in windows(shape, kernel, stride):
        grad[:, :, rows, cols] += g[:, :, r, q, None, None] / (kernel[0] * kernel[1])
    return grad


def t64(array, requires_grad=False, device="cpu"):
    return tt.tensor(np.asarray(array, dtype=np.float64), dtype="float64", device=device, requires_grad=requires_grad)


def on_device(array, device):
    """A NumPy array as an array of ``device``: what a ``Function``'s backward receives there."""
    return tt.get_backend(device).from_host(np.asarray(array))


def pair(value):
    return (value, value) if isinstance(value, int) else value


# (kernel, stride) of the pooling checks on a 6x8 input: the windows tile it; they overlap;
# they leave gaps (stride > kernel, a remainder no window covers); non-square, overlapping in
# one direction only; the default stride on a size the kernel does not divide; 1x1 windows
# (one offset: nothing to compare or add), tiling and with gaps.
POOL_CASES = [((2, 2), (2, 2)), ((3, 3), (1, 1)), ((2, 2), (3, 3)), ((2, 3), (1, 2)), ((3, 3), (3, 3)),
              ((1, 1), (1, 1)), ((1, 1), (2, 3))]

# Windows of more than 256 elements (the offsets no longer fit in a byte), 256 exactly and 257:
# (input shape, kernel, stride).
LARGE_POOL_CASES = [((1, 2, 17, 18), (17, 17), (1, 1)), ((1, 1, 16, 17), (16, 16), (1, 1)),
                    ((1, 2, 2, 259), (1, 257), (1, 1)), ((1, 2, 259, 2), (257, 1), (1, 1))]


def large_pool_input(shape, kernel):
    """Distinct values whose window maxima lie at late offsets (past 255) of the first windows."""
    x = RNG.permutation(int(np.prod(shape))).reshape(shape) / 100.0
    x[..., kernel[0] - 1, kernel[1] - 1] += 1000.0  # the last offset of window (0, 0)
    x[..., kernel[0] - 1, kernel[1]] += 2000.0  # window (0, 1): its last offset too
    return x


# -- the loop convolution of the lesson ---------------------------------------------------------------

@check(points=2, hint="conv2d_loops (the lesson cell of section 1): pad H and W by padding with np.pad (batch and "
                      "channel axes unpadded), H_out = (H + 2 * padding - kH) // stride + 1 (the same across), a "
                      "zero array of (N, O, H_out, W_out) in x's dtype, and out[n, o, r, q] = (window * weight[o]).sum() "
                      "+ bias[o] (no bias: nothing added) for the window x[n, :, r*stride : r*stride + kH, "
                      "q*stride : q*stride + kW] of the padded x")
def test_conv2d_loops(student):
    conv2d_loops = lesson_function(student, "conv2d_loops")
    x = np.arange(1.0, 10.0).reshape(1, 1, 3, 3)
    w = np.array([[[[1.0, 0.0], [0.0, 1.0]]]])
    expect_equal(conv2d_loops(x, w), np.array([[[[6.0, 8.0], [12.0, 14.0]]]]),
                 "conv2d_loops of the lesson's worked example (3x3 image, 2x2 filter)")
    for x_shape, w_shape, stride, padding in [((2, 2, 5, 6), (3, 2, 3, 2), 1, 0), ((1, 2, 7, 6), (2, 2, 3, 3), 2, 1),
                                              ((2, 3, 4, 5), (2, 3, 2, 3), 1, 2), ((1, 2, 8, 7), (3, 2, 2, 2), 3, 0),
                                              ((1, 2, 3, 2), (2, 2, 3, 2), 1, 0), ((2, 1, 4, 3), (2, 1, 1, 1), 2, 1)]:
        x, w, b = RNG.standard_normal(x_shape), RNG.standard_normal(w_shape), RNG.standard_normal(w_shape[0])
        where = f"x {x_shape}, weight {w_shape}, stride={stride}, padding={padding}"
        expect_close(conv2d_loops(x, w, b, stride, padding), loops_conv(x, w, b, pair(stride), pair(padding)),
                     f"conv2d_loops with a bias, {where}", atol=1e-10)
        expect_close(conv2d_loops(x, w, stride=stride, padding=padding),
                     loops_conv(x, w, None, pair(stride), pair(padding)),
                     f"conv2d_loops without a bias (bias=None), {where}", atol=1e-10)
    x, w = RNG.standard_normal((1, 2, 5, 4)).astype(np.float32), RNG.standard_normal((2, 2, 3, 3)).astype(np.float32)
    expect_close(conv2d_loops(x, w, padding=1), loops_conv(x, w, None, (1, 1), (1, 1)),
                 "conv2d_loops of float32 x and weight, padding=1 (a float32 result)", rtol=1e-5, atol=1e-5,
                 dtype=np.float32)


# -- im2col and col2im ------------------------------------------------------------------------------

@check(points=2, hint="im2col: (N, C*kH*kW, H_out*W_out); column l = r * W_out + q holds the window at (r, q) "
                      "listed in (c, i, j) order (transpose the window axes in front of the position axes before "
                      "the reshape); keep every stride-th window on each axis separately; write into out and "
                      "return it when given")
def test_im2col(student):
    x = np.arange(2 * 3 * 5 * 7, dtype=np.float32).reshape(2, 3, 5, 7)
    for (kh, kw), (sh, sw) in [((2, 3), (1, 2)), ((3, 2), (2, 1)), ((1, 1), (1, 1)), ((5, 7), (1, 1))]:
        out_h, out_w = (5 - kh) // sh + 1, (7 - kw) // sw + 1
        expected = np.empty((2, 3 * kh * kw, out_h * out_w), dtype=np.float32)
        for n, r, q in np.ndindex(2, out_h, out_w):
            expected[n, :, r * out_w + q] = x[n, :, r * sh:r * sh + kh, q * sw:q * sw + kw].reshape(-1)
        cols = student.im2col(np, x, (kh, kw), (sh, sw))
        expect_close(cols, expected, f"im2col of a float32 (2, 3, 5, 7) image, kernel {(kh, kw)}, stride {(sh, sw)}",
                     rtol=0, atol=0, dtype=np.float32)
    buffer = np.full((2, 3 * 2 * 3, 4 * 3), -1.0, dtype=np.float32)
    result = student.im2col(np, x, (2, 3), (1, 2), out=buffer)
    assert result is buffer, f"im2col(..., out=buffer): expected buffer itself back, got {type(result).__name__} " \
                             f"of shape {getattr(result, 'shape', None)}"
    expect_equal(buffer, student.im2col(np, x, (2, 3), (1, 2)), "the buffer after im2col(..., out=buffer)")


@check(points=2, hint="col2im: for each kernel offset (i, j) ADD (+=, windows overlap) the block cols[:, (c, i, j), :] "
                      "reshaped to (N, C, H_out, W_out) into image[:, :, i : i + s*(H_out-1)+1 : s, j : ...]; pixels "
                      "no window covers stay 0; a new image has the dtype of cols; with out= add into out and return it")
def test_col2im(student):
    counts = student.col2im(np, np.ones((1, 4, 6)), (1, 1, 3, 4), (2, 2), (1, 1))
    expect_equal(counts, np.array([[[[1.0, 2, 2, 1], [2, 4, 4, 2], [1, 2, 2, 1]]]]),
                 "col2im of ones, 3x4 image, 2x2 windows (each pixel: one per window it is in)")
    for shape, kernel, stride in [((2, 3, 7, 6), (3, 2), (2, 3)), ((1, 2, 5, 5), (2, 3), (1, 1))]:
        (kh, kw), (sh, sw) = kernel, stride
        out_h, out_w = (shape[2] - kh) // sh + 1, (shape[3] - kw) // sw + 1
        cols = RNG.standard_normal((shape[0], shape[1] * kh * kw, out_h * out_w))
        expected = np.zeros(shape)
        for n, r, q in np.ndindex(shape[0], out_h, out_w):
            window = cols[n, :, r * out_w + q].reshape(shape[1], kh, kw)
            expected[n, :, r * sh:r * sh + kh, q * sw:q * sw + kw] += window
        where = f"shape {shape}, kernel {kernel}, stride {stride}"
        expect_close(student.col2im(np, cols, shape, kernel, stride), expected, f"col2im, {where}", atol=1e-12)
        out = np.zeros(shape)
        result = student.col2im(np, cols, shape, kernel, stride, out=out)
        assert result is out, f"col2im(..., out=out), {where}: expected out itself back, got " \
                              f"{type(result).__name__} of shape {getattr(result, 'shape', None)}"
        expect_close(out, expected, f"out after col2im(..., out=out), {where}", atol=1e-12)
    cols = RNG.standard_normal((1, 2 * 2 * 2, 6)).astype(np.float32)
    expected = np.zeros((1, 2, 3, 4))
    for r, q in np.ndindex(2, 3):
        expected[0, :, r:r + 2, q:q + 2] += cols[0, :, r * 3 + q].reshape(2, 2, 2)
    expect_close(student.col2im(np, cols, (1, 2, 3, 4), (2, 2), (1, 1)), expected,
                 "col2im of float32 columns (a float32 image)", rtol=1e-6, atol=1e-6, dtype=np.float32)


# -- the convolution as one Function ----------------------------------------------------------------

# (x shape, weight shape, stride, padding): odd, non-square, every stride and padding pair.
CONV_CASES = [
    ((2, 3, 5, 4), (4, 3, 3, 3), (1, 1), (1, 1)),
    ((1, 2, 6, 5), (3, 2, 3, 2), (2, 1), (0, 2)),
    ((2, 1, 5, 5), (2, 1, 5, 5), (2, 2), (2, 2)),
    ((1, 2, 7, 6), (2, 2, 2, 3), (3, 2), (1, 0)),
    ((2, 3, 4, 3), (5, 3, 1, 1), (1, 1), (0, 0)),
    ((1, 2, 4, 5), (3, 2, 2, 3), (1, 2), (0, 1)),
]
# A layer as wide as the CNN milestone's (32 channels, 3x3, padding 1): the rules hold at every width.
WIDE_X, WIDE_WEIGHT = (2, 32, 5, 3), (32, 32, 3, 3)
# The convolution runs on the CPU and on the strict test device, which stands in for a GPU (its arrays refuse
# to become NumPy arrays). The library hands NumPy layers to its kernels (tinytrain.kernels.convolution), so the
# reference's recipe itself runs only off the CPU: every rule of the recipe is checked on both.
DEVICES = {"cpu": "", "strict": ", on the strict device"}
CROP = ("with padding 0, `ph:-ph` is `0:-0`, which is `0:0`: an empty slice; cut the padding off with "
        "`ph:H - ph` (H the padded height; `pw:W - pw` across)")


def expect_input_gradient_shape(got_shape, expected_shape, padding, what):
    """The input gradient's shape; one that came out empty along an axis without padding names the likely cause."""
    if tuple(got_shape) == tuple(expected_shape):
        return
    cause = any(got_shape[axis] == 0 != expected_shape[axis] and pad == 0 for axis, pad in zip((2, 3), padding))
    raise AssertionError(f"{what}: expected an input gradient of shape {tuple(expected_shape)}, got shape "
                         f"{tuple(got_shape)}" + (f": {CROP}" if cause else ""))


@check(points=2, hint="Conv2dFunction.forward: pad H by padding[0] and W by padding[1] whenever either is non-zero, "
                      "im2col with the stride pair, weight.reshape(O, -1) @ cols gives (N, O, L), add "
                      "bias.reshape(O, 1) when there is one, reshape to (N, O, H_out, W_out); the result's dtype is "
                      "NumPy's promotion of x's and the weight's (float32 stays float32); all through xp, so that it "
                      "runs on the strict device too",
       after=("test_im2col",))
def test_conv_forward(student):
    for device, on in DEVICES.items():
        for x_shape, w_shape, stride, padding in CONV_CASES:
            x, w, b = RNG.standard_normal(x_shape), RNG.standard_normal(w_shape), RNG.standard_normal(w_shape[0])
            where = f"x {x_shape}, weight {w_shape}, stride {stride}, padding {padding}{on}"
            got = student.Conv2dFunction.apply(t64(x, device=device), t64(w, device=device), t64(b, device=device),
                                               stride=stride, padding=padding)
            expect_close(got, loops_conv(x, w, b, stride, padding), f"Conv2dFunction with a bias, {where}",
                         atol=1e-10)
            got = student.Conv2dFunction.apply(t64(x, device=device), t64(w, device=device), stride=stride,
                                               padding=padding)
            expect_close(got, loops_conv(x, w, None, stride, padding), f"Conv2dFunction without a bias, {where}",
                         atol=1e-10)
        x, w = RNG.standard_normal(WIDE_X), RNG.standard_normal(WIDE_WEIGHT) / 17
        b = RNG.standard_normal(WIDE_WEIGHT[0])
        got = student.Conv2dFunction.apply(t64(x, device=device), t64(w, device=device), t64(b, device=device),
                                           stride=(1, 1), padding=(1, 1))
        expect_close(got, loops_conv(x, w, b, (1, 1), (1, 1)),
                     f"Conv2dFunction with a bias, x {WIDE_X}, weight {WIDE_WEIGHT}, stride (1, 1), padding (1, 1)"
                     f"{on}", atol=1e-10)
        x, w = RNG.standard_normal((1, 2, 4, 4)), RNG.standard_normal((3, 2, 3, 3))
        for x_dtype, w_dtype, dtype in [("float32", "float32", np.float32), ("float64", "float32", np.float64),
                                        ("float32", "float64", np.float64)]:
            got = student.Conv2dFunction.apply(tt.tensor(x, dtype=x_dtype, device=device),
                                               tt.tensor(w, dtype=w_dtype, device=device), stride=(1, 1),
                                               padding=(1, 1))
            expect_close(got, loops_conv(x.astype(x_dtype), w.astype(w_dtype), None, (1, 1), (1, 1)),
                         f"Conv2dFunction of a {x_dtype} input and a {w_dtype} weight{on}", rtol=1e-5, atol=1e-5,
                         dtype=dtype)


@check(points=2, hint="Conv2dFunction.backward: with g = grad as (N, O, L): grad_weight = sum over n of "
                      "g[n] @ cols[n].T reshaped to the weight's shape; grad_cols = W_rows.T @ g, col2im into the "
                      "padded shape, then cut the padding off with ph:H - ph (with padding 0, ph:-ph is 0:0, an empty "
                      "slice); grad_bias = g.sum over (0, 2); return one gradient per input",
       after=("test_conv_forward",))
def test_conv_backward_gradcheck(student):
    for device, on in DEVICES.items():
        for x_shape, w_shape, stride, padding in [((2, 2, 4, 3), (3, 2, 2, 2), (1, 1), (1, 0)),
                                                  ((1, 2, 5, 4), (2, 2, 3, 2), (2, 1), (1, 2))]:
            x, w, b = (t64(RNG.standard_normal(s), requires_grad=True, device=device)
                       for s in (x_shape, w_shape, w_shape[:1]))
            where = f"x {x_shape}, weight {w_shape}, stride {stride}, padding {padding}{on}"
            # gradcheck reads the gradient element by element: one of the wrong shape would fail it with an IndexError
            student.Conv2dFunction.apply(x, w, b, stride=stride, padding=padding).sum().backward()
            expect_input_gradient_shape(x.grad.shape, x_shape, padding, f"Conv2dFunction, {where}")
            expect_gradcheck(lambda x, w, b: student.Conv2dFunction.apply(x, w, b, stride=stride, padding=padding),
                             [x, w, b], f"Conv2dFunction with a bias, {where}")
            expect_gradcheck(lambda x, w: student.Conv2dFunction.apply(x, w, stride=stride, padding=padding),
                             [x, w], f"Conv2dFunction without a bias, {where}")


@check(points=1, hint="Conv2dFunction.backward: compute grad_weight only if inputs[1].requires_grad and grad_x only "
                      "if inputs[0].requires_grad (None otherwise), and the bias's gradient whenever the bias requires grad, "
                      "even with the weight frozen; grad_x has the UNPADDED input's shape; pixels in "
                      "several windows (stride < kernel) get the sum; return one gradient per input (two without "
                      "a bias, three with one)",
       after=("test_conv_forward", "test_col2im"))
def test_conv_backward_against_loops(student):
    for device, on in DEVICES.items():
        check_backward_against_loops(student, device, on)


def check_backward_against_loops(student, device, on):
    """test_conv_backward_against_loops on one device (``on`` says which, in the messages)."""
    def t(array, requires_grad=False):
        return t64(array, requires_grad, device)

    for (x_shape, w_shape, stride, padding), frozen in zip(CONV_CASES, ["x", "weight", None, "x", "weight", None]):
        x, w = RNG.standard_normal(x_shape), RNG.standard_normal(w_shape)
        xt, wt = t(x, requires_grad=frozen != "x"), t(w, requires_grad=frozen != "weight")
        out = student.Conv2dFunction.apply(xt, wt, stride=stride, padding=padding)
        g = RNG.standard_normal(out.shape)
        out.backward(t(g))
        grad_x, grad_w, _ = loops_conv_grads(x, w, g, stride, padding)
        where = f"x {x_shape}, weight {w_shape}, stride {stride}, padding {padding}{on}"
        if frozen != "x":
            expect_input_gradient_shape(xt.grad.shape, x_shape, padding, where)
            expect_close(xt.grad, grad_x, f"input gradient, {where}", atol=1e-10)
        else:
            assert xt.grad is None, f"{where}, x without requires_grad: expected no gradient, got {xt.grad}"
        if frozen != "weight":
            expect_close(wt.grad, grad_w, f"weight gradient, {where}", atol=1e-10)
        else:
            assert wt.grad is None, f"{where}, weight without requires_grad: expected no gradient, got {wt.grad}"
    x, w, b = RNG.standard_normal((2, 2, 5, 4)), RNG.standard_normal((3, 2, 3, 3)), RNG.standard_normal(3)
    xt, wt, bt = t(x, requires_grad=True), t(w), t(b, requires_grad=True)  # a frozen weight, a trained bias
    out = student.Conv2dFunction.apply(xt, wt, bt, stride=(1, 1), padding=(1, 1))
    g = RNG.standard_normal(out.shape)
    out.backward(t(g))
    where = f"x (2, 2, 5, 4), weight (3, 2, 3, 3) without requires_grad, bias (3,) with it, padding (1, 1){on}"
    expect_close(bt.grad, g.sum(axis=(0, 2, 3)), f"bias gradient, {where}", atol=1e-10)
    expect_close(xt.grad, loops_conv_grads(x, w, g, (1, 1), (1, 1))[0], f"input gradient, {where}", atol=1e-10)
    assert wt.grad is None, f"{where}: expected no weight gradient, got {wt.grad}"
    x, w, b = RNG.standard_normal(WIDE_X), RNG.standard_normal(WIDE_WEIGHT) / 17, RNG.standard_normal(WIDE_WEIGHT[0])
    for frozen in ("x", "weight", None):
        xt, wt = t(x, requires_grad=frozen != "x"), t(w, requires_grad=frozen != "weight")
        bt = t(b, requires_grad=True)
        out = student.Conv2dFunction.apply(xt, wt, bt, stride=(1, 1), padding=(1, 1))
        g = RNG.standard_normal(out.shape)
        where = (f"x {WIDE_X}, weight {WIDE_WEIGHT}, bias (32,), padding (1, 1), {frozen or 'nothing'} without "
                 f"requires_grad{on}")
        # what backward itself returns (on a graph of its own): None for an input that needs no gradient
        returned = student.Conv2dFunction.apply(xt, wt, bt, stride=(1, 1), padding=(1, 1))._ctx.backward(
            on_device(g, device))
        for index, name in enumerate(("x", "weight")):
            if frozen == name:
                assert returned[index] is None, f"{where}: Conv2dFunction.backward returned a {name} gradient " \
                                                f"nobody needs (expected None)"
        out.backward(t(g))
        grad_x, grad_w, grad_b = loops_conv_grads(x, w, g, (1, 1), (1, 1))
        expect_close(bt.grad, grad_b, f"bias gradient, {where}", atol=1e-10)
        for name, leaf, expected in (("x", xt, grad_x), ("weight", wt, grad_w)):
            if frozen == name:
                assert leaf.grad is None, f"{where}: expected no {name} gradient, got {leaf.grad}"
            else:
                expect_close(leaf.grad, expected, f"{name} gradient, {where}", atol=1e-10)
    frozen_bias = student.Conv2dFunction.apply(t(x, requires_grad=True), t(w, requires_grad=True), t(b),
                                               stride=(1, 1), padding=(1, 1))
    returned = frozen_bias._ctx.backward(on_device(RNG.standard_normal(frozen_bias.shape), device))
    assert returned[2] is None, f"x {WIDE_X}, weight {WIDE_WEIGHT}, bias (32,) without requires_grad{on}: " \
                                f"Conv2dFunction.backward returned a bias gradient nobody needs (expected None)"
    for x_shape, w_shape, padding in [((1, 2, 4, 4), (3, 2, 3, 3), (0, 0)), ((1, 32, 4, 4), WIDE_WEIGHT, (1, 1))]:
        x, w, b = (t(RNG.standard_normal(s), requires_grad=True) for s in (x_shape, w_shape, w_shape[:1]))
        for inputs in ([x, w], [x, w, b]):
            out = student.Conv2dFunction.apply(*inputs, stride=(1, 1), padding=padding)
            grads = out._ctx.backward(on_device(np.ones(out.shape), device))
            expect_equal(len(grads), len(inputs), f"the number of gradients Conv2dFunction.backward returns for "
                                                  f"{len(inputs)} inputs ({'with' if len(inputs) == 3 else 'without'} "
                                                  f"a bias), weight {w_shape}{on}")
    x, w, b = (tt.tensor(RNG.standard_normal(s), requires_grad=True, device=device)
               for s in ((2, 3, 6, 6), (4, 3, 3, 3), (4,)))
    grads = student.Conv2dFunction.apply(x, w, b, stride=(1, 1), padding=(1, 1))._ctx.backward(
        on_device(np.ones((2, 4, 6, 6), np.float32), device))
    expect_equal([str(g.dtype) for g in grads], ["float32"] * 3, "the dtypes of the gradients Conv2dFunction.backward "
                 "returns for float32 x (2, 3, 6, 6), weight (4, 3, 3, 3), bias (4,) and grad (a float64 accumulator "
                 f"makes every layer below compute in float64){on}")


# -- conv2d and Conv2d ------------------------------------------------------------------------------

@check(points=1, hint="conv2d: after the checks, Conv2dFunction.apply(x, weight, [bias,] stride=, padding=) with the "
                      "pairs; leave the bias out of apply when it is None; an input exactly the kernel's size (once "
                      "padded, each axis by its own padding) is fine: one output position",
       after=("test_conv_forward",))
def test_conv2d_functional(student):
    x, w, b = RNG.standard_normal((2, 3, 6, 5)), RNG.standard_normal((4, 3, 3, 2)), RNG.standard_normal(4)
    for stride, padding in [(1, 0), (2, 1), ((1, 2), (2, 0)), (1, (0, 1))]:
        expect_close(student.conv2d(t64(x), t64(w), t64(b), stride, padding),
                     loops_conv(x, w, b, pair(stride), pair(padding)),
                     f"conv2d(x {x.shape}, weight {w.shape}, bias, stride={stride}, padding={padding})", atol=1e-10)
    expect_close(student.conv2d(t64(x), t64(w), stride=2), loops_conv(x, w, None, (2, 2)),
                 "conv2d without a bias, stride=2", atol=1e-10)
    expect_close(student.conv2d(t64(x), t64(w), b=t64(b), padding=1), loops_conv(x, w, b, (1, 1), (1, 1)),
                 "conv2d with the bias given as b=, padding=1", atol=1e-10)
    for shape, padding in [((1, 3, 2, 1), 1), ((1, 3, 3, 2), 0), ((2, 3, 1, 5), (1, 0)), ((1, 3, 3, 1), (0, 1))]:
        small = RNG.standard_normal(shape)  # smaller than the 3x2 kernel, or exactly its size, once padded
        expect_close(student.conv2d(t64(small), t64(w), t64(b), padding=padding),
                     loops_conv(small, w, b, (1, 1), pair(padding)),
                     f"conv2d of an input {shape} with padding={padding} and a 3x2 kernel (padded, it is at least "
                     "the kernel's size)", atol=1e-10)
    layer = student.Conv2d(3, 4, (3, 2), stride=(2, 1), padding=(1, 1))
    expect_close(layer(tt.tensor(x, dtype="float32")),
                 loops_conv(x.astype(np.float32), layer.weight.numpy(), layer.bias.numpy(), (2, 1), (1, 1)),
                 "Conv2d(3, 4, (3, 2), stride=(2, 1), padding=(1, 1)) of a float32 input", rtol=1e-5, atol=1e-5,
                 dtype=np.float32)


@check(points=2, hint="conv2d raises ValueError naming the shapes (str(x.shape), str(weight.shape)) for a non-4-D "
                      "input or weight, a channel mismatch (and say both channel counts), a bias that is not (O,) (name "
                      "the shape it must have, e.g. (4,)), and an input smaller than the kernel once padded (name the "
                      "padded size HxW and the kernel kHxkW); a weight or bias on another device than x: the "
                      "RuntimeError of x._operand")
def test_conv2d_errors_name_the_shapes(student):
    x, w = tt.randn(2, 3, 5, 5), tt.randn(4, 3, 3, 3)
    cases = [
        ((tt.randn(3, 5, 5), w), {}, ["(3, 5, 5)"]),
        ((tt.randn(2, 3, 5), w), {}, ["(2, 3, 5)"]),
        ((x, tt.randn(4, 3, 3)), {}, ["(4, 3, 3)"]),
        ((tt.randn(2, 2, 5, 5), w), {}, ["(2, 2, 5, 5)", "(4, 3, 3, 3)"]),
        ((x, w, tt.randn(4, 1)), {}, ["(4, 1)", "(4,)"]),
        ((x, w, tt.randn(3)), {}, ["(3,)", "(4,)"]),
        ((tt.randn(1, 3, 2, 5), w), {}, ["(1, 3, 2, 5)", "2x5", "3x3"]),
        ((tt.randn(1, 3, 5, 1), w), {"padding": (2, 0)}, ["(1, 3, 5, 1)", "9x1", "3x3"]),
        ((tt.randn(1, 3, 3, 5), tt.randn(2, 3, 4, 2)), {}, ["(1, 3, 3, 5)", "3x5", "4x2"]),
        ((tt.randn(1, 3, 1, 6), tt.randn(2, 3, 4, 4)), {"padding": 1}, ["(1, 3, 1, 6)", "3x8", "4x4"]),
        ((tt.randn(1, 3, 6, 1), tt.randn(2, 3, 4, 4)), {"padding": 1}, ["(1, 3, 6, 1)", "8x3", "4x4"]),
    ]
    for args, kwargs, words in cases:
        shapes = ", ".join(str(a.shape) for a in args)
        expect_raises(ValueError, lambda: student.conv2d(*args, **kwargs),
                      f"conv2d of tensors with shapes {shapes}" + (f", {kwargs}" if kwargs else ""), mentions=words)
    x, w = tt.randn(2, 6, 11, 12), tt.randn(5, 3, 9, 9)
    error = expect_raises(ValueError, lambda: student.conv2d(x, w), "conv2d of an input (2, 6, 11, 12) with 6 channels "
                          "and a weight (5, 3, 9, 9) for 3", mentions=("(2, 6, 11, 12)", "(5, 3, 9, 9)", "channel"))
    rest = str(error).replace("(2, 6, 11, 12)", "").replace("(5, 3, 9, 9)", "")
    said = re.findall(r"(?<![\w.])\d+(?![\w.])", rest)
    assert "6" in said and "3" in said, "conv2d of an input (2, 6, 11, 12) and a weight (5, 3, 9, 9): expected the " \
        f"message to say both channel counts, 6 and 3, besides the shapes; it says {said} in {str(error)!r}"
    on_device = [tt.randn(1, 2, 4, 4, device="strict"), tt.randn(3, 2, 3, 3, device="strict"), tt.randn(3, device="strict")]
    for index, what in [(1, "weight"), (2, "bias")]:
        args = list(on_device)
        args[index] = tt.randn(*args[index].shape)  # on the host
        expect_raises(RuntimeError, lambda: student.conv2d(*args),
                      f"conv2d of an input on the strict device with a {what} on the cpu")


@check(points=2, hint="Conv2d.__init__: weight (out, in, kH, kW) and bias (out,) from U(-1/sqrt(fan_in), "
                      "1/sqrt(fan_in)) with fan_in = in_channels * kH * kW (both of them), via _uniform_parameter; "
                      "bias=False stores None")
def test_conv2d_layer_init(student):
    tt.manual_seed(0)
    layer = student.Conv2d(2, 300, (3, 2))
    expect_equal(layer.weight.shape, (300, 2, 3, 2), "Conv2d(2, 300, (3, 2)).weight.shape")
    expect_equal(layer.bias.shape, (300,), "Conv2d(2, 300, (3, 2)).bias.shape")
    expect_equal(layer.weight.dtype, np.dtype(np.float32), "Conv2d(...).weight.dtype")
    expect_equal((layer.weight.requires_grad, layer.bias.requires_grad), (True, True),
                 "(weight.requires_grad, bias.requires_grad)")
    expect_equal([name for name, _ in layer.named_parameters()], ["weight", "bias"], "Conv2d's named_parameters()")
    bound = 1 / np.sqrt(2 * 3 * 2)
    for name, values in [("weight", layer.weight.numpy()), ("bias", layer.bias.numpy())]:
        top = np.abs(values).max()
        assert 0.9 * bound < top <= bound, f"Conv2d(2, 300, (3, 2)).{name}: expected the largest |value| just " \
                                           f"below 1/sqrt(2*3*2) = {bound:.4f}, got {top:.4f}"
        assert abs(values.mean()) < 0.2 * bound, f"Conv2d(2, 300, (3, 2)).{name}: expected values uniform around " \
                                                 f"0, got mean {values.mean():.4f}"
    plain = student.Conv2d(3, 4, 3, bias=False)
    assert plain.bias is None, f"Conv2d(3, 4, 3, bias=False).bias: expected None, got {plain.bias!r}"
    expect_equal(len(plain.parameters()), 1, "len(Conv2d(3, 4, 3, bias=False).parameters())")
    expect_equal(plain.weight.shape, (4, 3, 3, 3), "Conv2d(3, 4, 3).weight.shape")
    tt.manual_seed(5)
    first = student.Conv2d(3, 2, 3).weight.numpy()
    tt.manual_seed(5)
    expect_equal(student.Conv2d(3, 2, 3).weight.numpy(), first,
                 "Conv2d(3, 2, 3).weight after tt.manual_seed(5), twice (initialise from the seeded generator)")


# -- pooling ----------------------------------------------------------------------------------------

@check(points=2, hint="MaxPool2dFunction.forward: start from a copy of the first offset's slice (not zeros: values "
                      "may be negative), xp.maximum with every other offset's slice; use window_slices, which "
                      "handles overlapping windows and gaps; keep the dtype; a 1x1 window has one offset, and a "
                      "window may have more than 256 (the winner's offset must fit its array); a window holding NaN "
                      "gives NaN")
def test_max_pool_forward(student):
    x = RNG.standard_normal((2, 3, 6, 8)) - 1.0  # mostly negative
    for kernel, stride in POOL_CASES:
        expect_equal(student.MaxPool2dFunction.apply(t64(x), kernel=kernel, stride=stride),
                     loops_pool(x, kernel, stride, np.max), f"max pooling of (2, 3, 6, 8), kernel {kernel}, stride {stride}")
    for shape, kernel, stride in LARGE_POOL_CASES:
        x_large = large_pool_input(shape, kernel)
        expect_equal(student.MaxPool2dFunction.apply(t64(x_large), kernel=kernel, stride=stride),
                     loops_pool(x_large, kernel, stride, np.max),
                     f"max pooling of {shape}, kernel {kernel} ({kernel[0] * kernel[1]} offsets), stride {stride}")
    expect_close(student.max_pool2d(tt.tensor(x, dtype="float32"), 2), loops_pool(x.astype(np.float32), (2, 2), (2, 2),
                 np.max), "max_pool2d of a float32 input, kernel 2", rtol=0, atol=0, dtype=np.float32)
    for kernel, stride in ((2, 2), (3, 1)):  # tiled: the slices are views of x itself; overlapping
        xt = t64(x)
        student.max_pool2d(xt, kernel, stride)
        student.avg_pool2d(xt, kernel, stride)
        expect_equal(xt.numpy(), x, f"the input after max_pool2d and avg_pool2d(x, {kernel}, {stride}) (start from a "
                     "COPY of the first slice: the slices are views of x)")
    expect_equal(student.MaxPool2d(3, 2)(t64(x)), loops_pool(x, (3, 3), (2, 2), np.max), "MaxPool2d(3, 2)")
    holes = np.array([[[[1.0, np.nan, 5.0, 4.0], [0.0, 2.0, 3.0, np.nan]]]])
    expect_close(student.max_pool2d(t64(holes), 2), np.array([[[[np.nan, np.nan]]]]), rtol=0, atol=0, what=
                 f"max_pool2d of {holes[0, 0].tolist()}, kernel 2: a window holding NaN gives NaN (xp.maximum "
                 "passes NaN on; a comparison with NaN is False, so where(candidate > best, ...) drops it)")


@check(points=2, hint="max pooling sends each window's gradient to its FIRST maximum, row by row: in forward, an "
                      "offset takes over only if STRICTLY greater (>, not >=), remember the winning offset per "
                      "window; in backward give grad where winner == k, 0 elsewhere",
       after=("test_max_pool_forward",))
def test_max_pool_backward_ties(student):
    x = np.zeros((1, 2, 6, 8))
    x[0, 1, ::2, ::3] = 1.0  # windows of zeros and windows with repeated ones: ties everywhere
    x[0, 0, 3:, :] = -1.0
    for kernel, stride in POOL_CASES:
        xt = t64(x, requires_grad=True)
        out = student.MaxPool2dFunction.apply(xt, kernel=kernel, stride=stride)
        g = RNG.standard_normal(out.shape)
        out.backward(t64(g))
        expect_close(xt.grad, loops_max_pool_grad(x, g, kernel, stride),
                     f"max pooling's gradient with ties, kernel {kernel}, stride {stride} (the first maximum takes "
                     "it all)", atol=1e-12)
    window = np.array([[[[1.0, 3.0], [3.0, 0.0]]]])  # tied maxima at (0, 1) and (1, 0): row by row, (0, 1) is first
    xt = t64(window, requires_grad=True)
    student.max_pool2d(xt, 2).backward(t64(np.full((1, 1, 1, 1), 10.0)))
    expect_equal(xt.grad, np.array([[[[0.0, 10.0], [0.0, 0.0]]]]), "max pooling's gradient of the window "
                 "[[1, 3], [3, 0]] for an upstream 10: the first maximum reading row by row, (0, 1), takes it all")


@check(points=1, hint="MaxPool2dFunction.backward: on the tiled path assign EVERY element of each slice (the array is "
                      "uninitialised: xp.multiply(grad, winner == k, out=slice)); otherwise ADD (+=) into zeros, "
                      "since an element can win several overlapping windows; offsets past 255 too",
       after=("test_max_pool_forward",))
def test_max_pool_backward_values(student):
    for kernel, stride in POOL_CASES:
        for trial in range(2):  # a second round: nothing kept from the first (a cached array) may leak in
            x = RNG.permutation(2 * 3 * 6 * 8).reshape(2, 3, 6, 8) / 10.0  # distinct values
            xt = t64(x, requires_grad=True)
            out = student.max_pool2d(xt, kernel, stride)
            g = RNG.standard_normal(out.shape)
            out.backward(t64(g))
            expect_close(xt.grad, loops_max_pool_grad(x, g, kernel, stride),
                         f"max pooling's gradient, kernel {kernel}, stride {stride}, round {trial + 1}", atol=1e-12)
            del xt, out
    for shape, kernel, stride in LARGE_POOL_CASES:
        x = large_pool_input(shape, kernel)
        xt = t64(x, requires_grad=True)
        out = student.max_pool2d(xt, kernel, stride)
        g = RNG.standard_normal(out.shape)
        out.backward(t64(g))
        expect_close(xt.grad, loops_max_pool_grad(x, g, kernel, stride),
                     f"max pooling's gradient, {shape}, kernel {kernel} ({kernel[0] * kernel[1]} offsets)", atol=1e-12)
    xt = t64(RNG.permutation(2 * 5 * 6).reshape(1, 2, 5, 6) / 7.0, requires_grad=True)
    expect_gradcheck(lambda x: student.max_pool2d(x, (2, 3), (1, 2)), [xt], "max_pool2d(x, (2, 3), (1, 2))")


@check(points=1, hint="AvgPool2dFunction.forward: add up the kH*kW offset slices (start from a copy of the first: a "
                      "1x1 window has only that one) and divide by kH*kW")
def test_avg_pool_forward(student):
    x = RNG.standard_normal((2, 3, 6, 8))
    for kernel, stride in POOL_CASES:
        expect_close(student.AvgPool2dFunction.apply(t64(x), kernel=kernel, stride=stride),
                     loops_pool(x, kernel, stride, np.mean),
                     f"average pooling of (2, 3, 6, 8), kernel {kernel}, stride {stride}", rtol=1e-12, atol=1e-12)
    x_large = RNG.standard_normal((1, 2, 17, 18))
    expect_close(student.avg_pool2d(t64(x_large), 17, 1), loops_pool(x_large, (17, 17), (1, 1), np.mean),
                 "avg_pool2d of (1, 2, 17, 18), kernel 17 (289 offsets), stride 1", rtol=1e-12, atol=1e-12)
    expect_close(student.AvgPool2d(2)(tt.tensor(x, dtype="float32")), loops_pool(x, (2, 2), (2, 2), np.mean),
                 "AvgPool2d(2) of a float32 input", rtol=1e-5, atol=1e-6, dtype=np.float32)


@check(points=2, hint="AvgPool2dFunction.backward: every element of a window gets grad / (kH*kW); use gradient_slices: "
                      "on the tiled path assign each slice, otherwise ADD (+=) since windows overlap; elements in "
                      "no window get 0", after=("test_avg_pool_forward",))
def test_avg_pool_backward(student):
    for kernel, stride in POOL_CASES:
        for trial in range(2):  # a second round: nothing kept from the first (a cached array) may leak in
            xt = t64(RNG.standard_normal((2, 3, 6, 8)), requires_grad=True)
            out = student.avg_pool2d(xt, kernel, stride)
            g = RNG.standard_normal(out.shape)
            out.backward(t64(g))
            expect_close(xt.grad, loops_avg_pool_grad(xt.shape, g, kernel, stride),
                         f"average pooling's gradient, kernel {kernel}, stride {stride}, round {trial + 1}",
                         rtol=1e-12, atol=1e-12)
            del xt, out
    xt = t64(RNG.standard_normal((1, 2, 5, 4)), requires_grad=True)
    expect_gradcheck(lambda x: student.avg_pool2d(x, (3, 2), (1, 2)), [xt], "avg_pool2d(x, (3, 2), (1, 2))")


# -- everything together ------------------------------------------------------------------------------

@check(points=1, hint="a Conv2d -> BatchNorm2d -> ReLU -> MaxPool2d block: the convolution's output feeds the "
                      "per-channel statistics over (N, H, W); every piece must work in float32 and pass gradients on",
       after=("test_conv2d_functional", "test_max_pool_forward"))
def test_conv_batchnorm_block(student):
    tt.manual_seed(0)
    conv, norm, pool = student.Conv2d(2, 3, 3, padding=1), student.BatchNorm2d(3), student.MaxPool2d(2)
    block = tt.nn.Sequential(conv, norm, tt.nn.ReLU(), pool)
    x = RNG.standard_normal((4, 2, 6, 4)).astype(np.float32)
    y = loops_conv(x, conv.weight.numpy(), conv.bias.numpy(), (1, 1), (1, 1))
    mean, var = y.mean(axis=(0, 2, 3), keepdims=True), y.var(axis=(0, 2, 3), keepdims=True)
    expected = loops_pool(np.maximum((y - mean) / np.sqrt(var + 1e-5), 0), (2, 2), (2, 2), np.max)
    out = block(tt.tensor(x))
    expect_close(out, expected, "Conv2d -> BatchNorm2d -> ReLU -> MaxPool2d of a float32 (4, 2, 6, 4) batch, training "
                 "mode", rtol=1e-4, atol=1e-4, dtype=np.float32)
    expect_close(norm.running_mean, 0.1 * mean.ravel(), "BatchNorm2d's running_mean after one batch", rtol=1e-4,
                 atol=1e-5)
    expect_close(norm.running_var, 0.9 + 0.1 * y.var(axis=(0, 2, 3), ddof=1),
                 "BatchNorm2d's running_var after one batch (unbiased variance)", rtol=1e-4)
    out.sum().backward()
    expect_equal(conv.weight.grad.shape if conv.weight.grad is not None else None, (3, 2, 3, 3),
                 "the conv weight's gradient shape after backward through the block")
    assert np.abs(conv.weight.grad.numpy()).sum() > 0, "the conv weight's gradient: expected non-zero values, got zeros"
    block.eval()
    running_mean, running_var = norm.running_mean.numpy().reshape(1, 3, 1, 1), norm.running_var.numpy().reshape(1, 3, 1, 1)
    expected = loops_pool(np.maximum((y - running_mean) / np.sqrt(running_var + 1e-5), 0), (2, 2), (2, 2), np.max)
    expect_close(block(tt.tensor(x)), expected, "the block in evaluation mode (running statistics)", rtol=1e-4,
                 atol=1e-4)
    expect_raises(ValueError, lambda: norm(tt.randn(4, 3, 5)), "BatchNorm2d of a 3-D input (4, 3, 5)")


@check(points=1, hint="all array math goes through the xp you are given (self.xp in a Function): make new arrays with "
                      "xp.zeros / xp.empty, never np.zeros -- the same code must run on the strict device",
       after=("test_conv2d_functional", "test_max_pool_forward", "test_avg_pool_forward"))
def test_runs_on_another_device(student):
    x, w, b = RNG.standard_normal((2, 2, 5, 4)), RNG.standard_normal((3, 2, 3, 2)), RNG.standard_normal(3)
    results = []
    for device in ("cpu", "strict"):
        xt, wt, bt = (tt.tensor(a, dtype="float64", device=device, requires_grad=True) for a in (x, w, b))
        y = student.conv2d(xt, wt, bt, stride=(1, 2), padding=1)  # (2, 3, 5, 3)
        overlapping = student.max_pool2d(y, 2, 1).sum() + student.avg_pool2d(y, 2, 1).sum()
        tiled = (student.max_pool2d(y, (5, 1)) * 2.0).sum() + (student.avg_pool2d(y, (1, 3)) * 3.0).sum()
        (overlapping + tiled).backward()
        expect_equal(y.device, xt.device, f"the device of conv2d's result for an input on {device}")
        results.append([a.numpy() for a in (y, xt.grad, wt.grad, bt.grad)])
    for name, cpu, strict in zip(["conv2d's result", "the input gradient", "the weight gradient", "the bias gradient"],
                                 *results):
        expect_close(strict, cpu, f"{name} on the strict device (expected: the same as on the cpu)", atol=1e-12)
    xt, wt, bt = (tt.tensor(a, dtype="float64", device="strict", requires_grad=True) for a in (x, w, b))
    reads = host_reads()
    y = student.conv2d(xt, wt, bt, stride=(1, 2), padding=1)
    (student.max_pool2d(y, (5, 1)).sum() + student.max_pool2d(y, 2, 1).sum() + student.avg_pool2d(y, 2, 1).sum()) \
        .backward(tt.tensor(1.0, dtype="float64", device="strict"))
    expect_equal(host_reads() - reads, 0, "host reads in conv2d, max_pool2d and avg_pool2d, forward and backward, on "
                 "the strict device (each read waits for a GPU: no float(), .item() or if on a device array)")
