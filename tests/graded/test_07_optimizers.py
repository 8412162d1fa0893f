"""Graded checks for Module 07 (optimizers), run against the student's own code.

Each update rule is stepped a few times on fixed gradients and compared with an
independent float64 NumPy computation of PyTorch's rule. The optimizers come from
the ``student`` fixture; tensors come from the package.
"""
import numpy as np

import tinytrain as tt
from tinytrain.testing.strict import float64_promotions, host_reads
from tinytrain.course.checks import check, expect_close, expect_equal

START = np.array([1.0, -2.0, 0.5, 3.0], dtype=np.float32)
GRADS = np.array(
    [[0.5, -1.0, 2.0, 1e-3], [0.4, 0.8, -2.0, 1e-3], [-0.1, 0.6, 1.5, 5.0], [0.3, -0.2, 0.0, -4.0]],
    dtype=np.float32,
)

PAUSED = np.concatenate([GRADS[:2], np.zeros((1, 4), np.float32), GRADS[2:]])  # an all-zero gradient is still a step


def run(optimizer_class, grads=GRADS, start=START, **settings):
    """Step an optimizer of one parameter on the given gradients; (values after each step, param, optimizer)."""
    param = tt.tensor(start, requires_grad=True)
    optimizer = optimizer_class([param], **settings)
    array, values = param.data, []
    for g in grads:
        param.grad = tt.tensor(g)
        optimizer.step()
        assert param.data is array, f"{optimizer_class.__name__}({settings}).step(): expected the parameter's array " \
                                    "updated in place (param -= ...), got a new array in param.data"
        expect_equal(param.grad.numpy(), g, f"{optimizer_class.__name__}({settings}): param.grad after step() "
                                            "(the gradient belongs to the parameter: never change it)")
        values.append(param.numpy().copy())
    return np.array(values), param, optimizer


def expect_state_in_place(optimizer_class, keys, **settings):
    """The arrays ``state[key]`` stay the same objects from the first step on (updated in place, not rebound)."""
    param = tt.tensor(START, requires_grad=True)
    optimizer = optimizer_class([param], **settings)
    first = None
    for g in GRADS:
        param.grad = tt.tensor(g)
        optimizer.step()
        state = optimizer.state[0]
        first = first or {key: state[key] for key in keys}
        for key in keys:
            assert state[key] is first[key], f"{optimizer_class.__name__}({settings}): expected state[{key!r}] " \
                                             "updated in place (the same array after every step), got a new array"


def numpy_sgd(lr, momentum=0.0, nesterov=False, weight_decay=0.0, grads=GRADS, start=START):
    theta, buf, values = start.astype(np.float64), None, []
    for g in grads.astype(np.float64):
        g = g + weight_decay * theta
        if momentum:
            buf = g.copy() if buf is None else momentum * buf + g
            d = g + momentum * buf if nesterov else buf
        else:
            d = g
        theta = theta - lr * d
        values.append(theta)
    return np.array(values)


def numpy_adam(lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled=False, grads=GRADS, start=START):
    (b1, b2), theta = betas, start.astype(np.float64)
    m, v, values = np.zeros_like(theta), np.zeros_like(theta), []
    for t, g in enumerate(grads.astype(np.float64), start=1):
        if decoupled:
            theta = theta * (1 - lr * weight_decay)
        else:
            g = g + weight_decay * theta
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        theta = theta - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
        values.append(theta)
    return np.array(values)


# -- SGD ------------------------------------------------------------------------------------

@check(points=1, hint="plain SGD: param -= lr * grad, in place on the parameter's array")
def test_sgd_plain(student):
    values, _, _ = run(student.SGD, lr=0.1)  # which also checks that the parameter's array is updated in place
    expect_close(values, numpy_sgd(0.1), "SGD(lr=0.1): the parameter after each step", rtol=1e-5, atol=1e-6)


@check(points=2, hint="momentum: buf = momentum * buf + g (a plain sum, the first step gives buf = g, kept in "
                      "state['momentum_buffer'] and updated in place); the step is lr * buf, or lr * (g + momentum * "
                      "buf) with Nesterov")
def test_sgd_momentum_and_nesterov(student):
    values, _, optimizer = run(student.SGD, lr=0.1, momentum=0.9)
    expect_close(values, numpy_sgd(0.1, momentum=0.9), "SGD(lr=0.1, momentum=0.9): the parameter after each step",
                 atol=1e-5)
    expected_buffer = GRADS[0].astype(np.float64)
    for g in GRADS[1:]:
        expected_buffer = 0.9 * expected_buffer + g
    buffer = optimizer.state[0]["momentum_buffer"]
    expect_close(buffer, expected_buffer, "SGD(lr=0.1, momentum=0.9): state['momentum_buffer'] after 4 steps",
                 atol=1e-5)
    values, _, _ = run(student.SGD, lr=0.05, momentum=0.8, nesterov=True)
    expect_close(values, numpy_sgd(0.05, momentum=0.8, nesterov=True),
                 "SGD(lr=0.05, momentum=0.8, nesterov=True): the parameter after each step", atol=1e-5)
    values, _, _ = run(student.SGD, grads=PAUSED, lr=0.1, momentum=0.9)
    expect_close(values, numpy_sgd(0.1, momentum=0.9, grads=PAUSED), "SGD(lr=0.1, momentum=0.9): the parameter "
                 "after each step, the 3rd gradient all zeros (a zero gradient is still a step: the buffer decays "
                 "and keeps moving the weight)", atol=1e-5)
    for nesterov in (False, True):
        expect_state_in_place(student.SGD, ["momentum_buffer"], lr=0.1, momentum=0.9, nesterov=nesterov)


@check(points=1, hint="weight decay adds weight_decay * param to the gradient (in a new array: the parameter's "
                      ".grad must not change) before momentum")
def test_sgd_weight_decay(student):
    values, _, _ = run(student.SGD, lr=0.1, weight_decay=0.1)
    expect_close(values, numpy_sgd(0.1, weight_decay=0.1), "SGD(lr=0.1, weight_decay=0.1): the parameter after "
                 "each step", atol=1e-5)
    values, _, _ = run(student.SGD, lr=0.1, momentum=0.9, weight_decay=0.01)
    expect_close(values, numpy_sgd(0.1, momentum=0.9, weight_decay=0.01),
                 "SGD(lr=0.1, momentum=0.9, weight_decay=0.01): the parameter after each step", atol=1e-5)
    values, _, _ = run(student.SGD, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1)
    expect_close(values, numpy_sgd(0.1, momentum=0.9, nesterov=True, weight_decay=0.1),
                 "SGD(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1): the parameter after each step (Nesterov's "
                 "g + momentum * buf uses the decayed g)", atol=1e-5)


# -- Adam and AdamW --------------------------------------------------------------------------

@check(points=2, hint="Adam: state['step'] += 1; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2 (both in place); "
                      "param -= lr * m_hat / (sqrt(v_hat) + eps) with m_hat = m / (1 - b1^t), v_hat = v / (1 - b2^t)")
def test_adam_steps(student):
    values, _, optimizer = run(student.Adam, lr=0.01)
    expect_close(values, numpy_adam(0.01), "Adam(lr=0.01): the parameter after each step", atol=1e-6)
    values, _, _ = run(student.Adam, grads=PAUSED, lr=0.1)
    expect_close(values, numpy_adam(0.1, grads=PAUSED), "Adam(lr=0.1): the parameter after each step, the 3rd "
                 "gradient all zeros (a zero gradient is still a step: t counts it, the moments decay)", atol=1e-5)
    param = tt.tensor(START, dtype="float64", requires_grad=True)
    wide = student.Adam([param], lr=0.01)
    for g in GRADS.astype(np.float64):
        param.grad = tt.tensor(g, dtype="float64")
        wide.step()
    expect_close(param.numpy(), numpy_adam(0.01)[-1], "Adam(lr=0.01) of a float64 parameter after 4 steps "
                 "(computed in the parameter's dtype)", rtol=1e-12, atol=1e-14, dtype="float64")
    values, _, _ = run(student.Adam, lr=0.05, betas=(0.8, 0.9), eps=1e-3)
    expect_close(values, numpy_adam(0.05, betas=(0.8, 0.9), eps=1e-3),
                 "Adam(lr=0.05, betas=(0.8, 0.9), eps=1e-3): the parameter after each step", atol=1e-6)
    state = optimizer.state[0]
    expect_equal(state["step"], len(GRADS), f"Adam(lr=0.01): state['step'] after {len(GRADS)} steps")
    m, v = np.zeros(4), np.zeros(4)
    for g in GRADS.astype(np.float64):
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
    expect_close(state["exp_avg"], m, "Adam(lr=0.01): state['exp_avg'] (m) after 4 steps", rtol=1e-5, atol=1e-9,
                 dtype="float32")
    expect_close(state["exp_avg_sq"], v, "Adam(lr=0.01): state['exp_avg_sq'] (v) after 4 steps", rtol=1e-4,
                 dtype="float32")
    expect_state_in_place(student.Adam, ["exp_avg", "exp_avg_sq"], lr=0.01)


@check(points=1, hint="bias correction: divide m by (1 - b1^t) and v by (1 - b2^t) with t the parameter's own step "
                      "number (state['step'], starting at 1), so the first step moves every weight by about lr, "
                      "whatever its gradient's scale")
def test_adam_bias_correction(student):
    grads = np.array([[1e-4, -10.0, 1e3, -0.5]], dtype=np.float32)
    values, _, _ = run(student.Adam, grads=grads, lr=0.01)
    g = grads[0].astype(np.float64)  # corrected m = g and v = g^2: the step is lr * g / (|g| + eps)
    expect_close(values[0], START - 0.01 * g / (np.abs(g) + 1e-8),
                 f"Adam(lr=0.01): the first step from {START.tolist()} with gradient {grads[0].tolist()}",
                 rtol=1e-6, atol=1e-7)
    grads = np.tile(np.array([[2.0, -2.0, 1e-2, 5.0]], dtype=np.float32), (3, 1))  # a constant gradient
    values, _, _ = run(student.Adam, grads=grads, lr=0.1)
    expect_close(np.diff(np.vstack([START, values]), axis=0), -0.1 * np.sign(grads),
                 f"Adam(lr=0.1): the change of each of 3 steps with the constant gradient {grads[0].tolist()}",
                 atol=1e-5)
    early, late = tt.tensor([1.0], requires_grad=True), tt.tensor([1.0], requires_grad=True)
    optimizer = student.Adam([early, late], lr=0.1)
    for grads_now in ([1.0, None], [1.0, 1.0]):  # `late` gets its first gradient on the optimizer's second step
        for p, g in zip((early, late), grads_now):
            p.grad = None if g is None else tt.tensor([g])
        optimizer.step()
    expect_close(late, [0.9], "a parameter's value after its first Adam step (lr=0.1, gradient 1), taken on the "
                 "optimizer's second step: its own t is 1 (the step count is kept per parameter), so it moves by lr",
                 rtol=1e-6)


@check(points=1, hint="Adam's L2 weight decay is already added to the gradient by update(); adam_update must use "
                      "the gradient it is given")
def test_adam_with_l2_weight_decay(student):
    values, _, _ = run(student.Adam, lr=0.01, weight_decay=0.1)
    expect_close(values, numpy_adam(0.01, weight_decay=0.1), "Adam(lr=0.01, weight_decay=0.1): the parameter after "
                 "each step", atol=1e-6)


@check(points=2, hint="AdamW: first shrink the parameter in place, param *= 1 - lr * weight_decay, then call "
                      "adam_update with the gradient alone (the decay must not go through m and v)")
def test_adamw_decoupled_weight_decay(student):
    values, _, optimizer = run(student.AdamW, lr=0.01, weight_decay=0.5)
    expect_close(values, numpy_adam(0.01, weight_decay=0.5, decoupled=True),
                 "AdamW(lr=0.01, weight_decay=0.5): the parameter after each step", atol=1e-6)
    expect_equal(optimizer.state[0]["step"], len(GRADS), f"AdamW: state['step'] after {len(GRADS)} steps")
    zeros = np.zeros((2, 4), dtype=np.float32)  # no gradient: only the decay acts
    values, _, _ = run(student.AdamW, grads=zeros, lr=0.1, weight_decay=0.5)
    expect_close(values, [START * 0.95, START * 0.95**2],
                 "AdamW(lr=0.1, weight_decay=0.5) with zero gradients: the parameter after each step", atol=1e-6)
    values, _, _ = run(student.AdamW, lr=0.01, weight_decay=0.0)
    expect_close(values, numpy_adam(0.01), "AdamW(lr=0.01, weight_decay=0.0): the parameter after each step "
                 "(plain Adam)", atol=1e-6)


# -- parameter groups ------------------------------------------------------------------------

def run_groups(optimizer_class, own, **settings):
    """Step two parameters, START in a group with the constructor's settings and -START / 2 in one with ``own``;
    the values of each after the last step."""
    first, second = tt.tensor(START, requires_grad=True), tt.tensor(-START / 2, requires_grad=True)
    optimizer = optimizer_class([{"params": [first]}, {"params": [second], **own}], **settings)
    for g in GRADS:
        first.grad, second.grad = tt.tensor(g), tt.tensor(g[::-1].copy())
        optimizer.step()
    return first.numpy(), second.numpy()


@check(points=2, hint="read every hyperparameter from the group that step() hands to update (group['lr'], "
                      "group['momentum'], group['nesterov'], group['betas'], group['eps'], group['weight_decay']), "
                      "never from self: each parameter group has its own values (and each parameter its own "
                      "state, Adam's step count included)",
       after=("test_sgd_plain", "test_sgd_momentum_and_nesterov", "test_sgd_weight_decay", "test_adam_steps",
              "test_adam_bias_correction", "test_adam_with_l2_weight_decay", "test_adamw_decoupled_weight_decay"))
def test_each_parameter_group_steps_with_its_own_hyperparameters(student):
    cases = (
        (student.SGD, {"lr": 0.1, "momentum": 0.9}, {"lr": 0.05, "momentum": 0.5, "nesterov": True,
                                                     "weight_decay": 0.1}, numpy_sgd),
        (student.SGD, {"lr": 0.05, "momentum": 0.8, "nesterov": True, "weight_decay": 0.01},
         {"momentum": 0.0, "nesterov": False, "weight_decay": 0.0}, numpy_sgd),
        (student.Adam, {"lr": 0.01}, {"lr": 0.05, "betas": (0.8, 0.9), "eps": 1e-3, "weight_decay": 0.1}, numpy_adam),
        (student.Adam, {"lr": 0.05, "betas": (0.5, 0.8), "eps": 1e-2}, {"lr": 0.01, "betas": (0.9, 0.999),
                                                                        "eps": 1e-8}, numpy_adam),
        (student.AdamW, {"lr": 0.01, "weight_decay": 0.5}, {"lr": 0.1, "weight_decay": 0.0},
         lambda **s: numpy_adam(decoupled=True, **s)),
        (student.AdamW, {"lr": 0.1, "weight_decay": 0.0, "betas": (0.8, 0.99)}, {"lr": 0.02, "weight_decay": 0.3},
         lambda **s: numpy_adam(decoupled=True, **s)),
    )
    for optimizer_class, settings, own, rule in cases:
        first, second = run_groups(optimizer_class, own, **settings)
        name = f"{optimizer_class.__name__}([{{'params': [a]}}, {{'params': [b], **{own}}}], **{settings})"
        expect_close(first, rule(**settings)[-1], f"{name}: a, in the group with the constructor's settings, after "
                     f"{len(GRADS)} steps", atol=1e-5)
        expect_close(second, rule(**{**settings, **own}, grads=GRADS[:, ::-1], start=-START / 2)[-1],
                     f"{name}: b, in the group with its own settings, after {len(GRADS)} steps", atol=1e-5)


# -- state and devices -----------------------------------------------------------------------

@check(points=1, hint="update() keeps exactly the state init_state() made (SGD: momentum_buffer, or nothing; Adam: "
                      "step, exp_avg, exp_avg_sq): section 9 counts every array in it",
       after=("test_sgd_plain", "test_sgd_momentum_and_nesterov", "test_adam_steps"))
def test_state_holds_only_its_own_entries(student):
    for optimizer_class, settings, keys in ((student.SGD, {"lr": 0.1}, set()),
                                            (student.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True},
                                             {"momentum_buffer"}),
                                            (student.Adam, {"lr": 0.01, "weight_decay": 0.1},
                                             {"step", "exp_avg", "exp_avg_sq"}),
                                            (student.AdamW, {"lr": 0.01}, {"step", "exp_avg", "exp_avg_sq"})):
        _, _, optimizer = run(optimizer_class, **settings)
        got = set(optimizer.state[0])
        assert got == keys, f"{optimizer_class.__name__}({settings}): expected state {sorted(keys)}, got {sorted(got)}"


@check(points=1, hint="update() computes with the xp it is given (NumPy on the CPU, CuPy on a GPU), keeps "
                      "every array on the parameter's device and reads nothing back from it; every number in it is a "
                      "Python float (a NumPy float64 scalar makes float32 arrays float64)")
def test_optimizers_run_on_another_device(student):
    for optimizer_class, settings in ((student.SGD, {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}),
                                      (student.Adam, {"lr": 0.01, "weight_decay": 0.01}),
                                      (student.AdamW, {"lr": 0.01})):
        values = {}
        for device in ("cpu", "strict"):
            param = tt.tensor(START, requires_grad=True, device=device)
            optimizer = optimizer_class([param], **settings)
            for g in GRADS:
                param.grad = tt.tensor(g, device=device)
                reads, promotions = host_reads(), float64_promotions()
                try:
                    optimizer.step()
                except TypeError as error:
                    raise AssertionError(f"{optimizer_class.__name__}({settings}).step() on the {device!r} device: "
                                         f"expected it to compute with xp, got TypeError: {error}") from None
                expect_equal(host_reads() - reads, 0, f"host reads in {optimizer_class.__name__}({settings}).step() "
                             f"on the {device!r} device (the bias corrections are Python numbers: ** and math.sqrt)")
                expect_equal(float64_promotions() - promotions, 0, f"float32 arrays made float64 in "
                             f"{optimizer_class.__name__}({settings}).step() on the {device!r} device, or computed "
                             "in float64 in place (a NumPy float64 scalar, e.g. from np.sqrt or np.power of a "
                             "number, promotes them)")
            values[device] = param.numpy()
        expect_close(values["strict"], values["cpu"], f"{optimizer_class.__name__}({settings}) on the strict device "
                     "(compared with the cpu)", rtol=1e-6)


@check(points=2, hint="keep all per-parameter state (step, momentum buffers, moments) in the `state` dict that "
                      "step() hands to update(), so state_dict() / load_state_dict() can save and restore it")
def test_state_dict_round_trip_continues_exactly(student):
    for optimizer_class, settings in ((student.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
                                      (student.Adam, {"lr": 0.01}),
                                      (student.AdamW, {"lr": 0.01, "weight_decay": 0.1})):
        straight, param, optimizer = run(optimizer_class, **settings)
        half, _, first = run(optimizer_class, grads=GRADS[:2], **settings)
        saved = first.state_dict()
        resumed = tt.tensor(half[-1], requires_grad=True)
        second = optimizer_class([resumed], **{**settings, "lr": 123.0})  # load_state_dict restores lr
        second.load_state_dict(saved)
        for g in GRADS[2:]:
            resumed.grad = tt.tensor(g)
            second.step()
        expect_equal(resumed.numpy(), straight[-1], f"{optimizer_class.__name__}({settings}): the parameter after 2 "
                     "steps, state_dict/load_state_dict into a new optimizer and 2 more steps (as 4 steps straight)")
        resumed_state = second.state_dict()["state"][0]
        for key, value in optimizer.state_dict()["state"][0].items():
            expect_equal(resumed_state.get(key), value, f"{optimizer_class.__name__}({settings}): state[{key!r}] "
                         "of the resumed run (as 4 steps straight)")
