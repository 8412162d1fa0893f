"""Optimizers (``tinytrain.optim``): SGD, Adam and AdamW.

Trajectories are compared, step by step, with the published update rules
(PyTorch's documentation) computed here independently in float64 NumPy, and with
PyTorch itself when it is installed. Also: state_dict round trips (bit-identical
resumes), the ``lr`` property, parameters without gradients, in-place updates in
the parameter's dtype, and every error.
"""
from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinytrain as tt
from tinytrain.optim import SGD, Adam, AdamW

SHAPES = [(3, 4), (5,), ()]
STEPS = 6


# -- independent float64 references (torch.optim documentation) -------------------

def reference(kind: str, theta0: list, grads: list, lrs: list, **settings) -> list:
    """Parameters after each step of ``kind`` ("sgd", "adam", "adamw").

    ``grads[t][i]`` is parameter i's gradient at step t, or None (skipped);
    ``lrs[t]`` the learning rate of step t.
    """
    theta = [np.array(t, dtype=np.float64) for t in theta0]
    state = [dict() for _ in theta]
    trajectory = []
    for lr, step_grads in zip(lrs, grads):
        for i, g in enumerate(step_grads):
            if g is None:
                continue
            g = np.asarray(g, dtype=np.float64)
            s = state[i]
            if kind == "sgd":
                momentum, wd = settings.get("momentum", 0.0), settings.get("weight_decay", 0.0)
                g = g + wd * theta[i]
                if momentum:
                    s["b"] = g.copy() if "b" not in s else momentum * s["b"] + g
                    g = g + momentum * s["b"] if settings.get("nesterov", False) else s["b"]
                theta[i] = theta[i] - lr * g
            else:
                beta1, beta2 = settings.get("betas", (0.9, 0.999))
                eps = settings.get("eps", 1e-8)
                wd = settings.get("weight_decay", 0.0 if kind == "adam" else 0.01)
                if kind == "adamw":
                    theta[i] = theta[i] * (1 - lr * wd)
                else:
                    g = g + wd * theta[i]
                t = s["t"] = s.get("t", 0) + 1
                s["m"] = beta1 * s.get("m", 0.0) + (1 - beta1) * g
                s["v"] = beta2 * s.get("v", 0.0) + (1 - beta2) * g * g
                m_hat = s["m"] / (1 - beta1**t)
                v_hat = s["v"] / (1 - beta2**t)
                theta[i] = theta[i] - lr * m_hat / (np.sqrt(v_hat) + eps)
        trajectory.append([t.copy() for t in theta])
    return trajectory


# -- helpers ----------------------------------------------------------------------------

OPTIMIZERS = {"sgd": SGD, "adam": Adam, "adamw": AdamW}

CONFIGS = [
    ("sgd", dict(lr=0.1)),
    ("sgd", dict(lr=0.1, momentum=0.9)),
    ("sgd", dict(lr=0.05, momentum=0.9, nesterov=True)),
    ("sgd", dict(lr=0.1, weight_decay=0.1)),
    ("sgd", dict(lr=0.1, momentum=0.5, weight_decay=0.05)),
    ("sgd", dict(lr=0.1, momentum=0.8, nesterov=True, weight_decay=0.01)),
    ("adam", dict(lr=0.01)),
    ("adam", dict(lr=0.1, betas=(0.8, 0.99), eps=1e-6)),
    ("adam", dict(lr=0.01, weight_decay=0.1)),
    ("adamw", dict(lr=0.01)),
    ("adamw", dict(lr=0.1, betas=(0.5, 0.9), weight_decay=0.5)),
]
CONFIG_IDS = [f"{kind}-{'-'.join(f'{k}={v}' for k, v in settings.items())}" for kind, settings in CONFIGS]


def initial_values(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for shape in SHAPES]


def gradient_sequence(steps: int = STEPS, seed: int = 1) -> list[list[np.ndarray]]:
    """Gradients of size about 1, exactly representable in float32 (so the references see the same input)."""
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(shape).astype(np.float32) for shape in SHAPES] for _ in range(steps)]


def make_params(values: list[np.ndarray], device: str, dtype: str = "float32") -> list[tt.Tensor]:
    return [tt.tensor(v, dtype=dtype, device=device, requires_grad=True) for v in values]


def set_grads(params: list[tt.Tensor], grads: list[np.ndarray | None]) -> None:
    for p, g in zip(params, grads):
        p.grad = None if g is None else tt.tensor(g, dtype=p.dtype, device=p.device)


def run(optimizer, params, grads, lrs=None):
    """Step ``optimizer`` through ``grads``; the parameters (host copies) after each step."""
    trajectory = []
    for t, step_grads in enumerate(grads):
        if lrs is not None:
            optimizer.lr = lrs[t]
        set_grads(params, step_grads)
        optimizer.step()
        trajectory.append([p.numpy() for p in params])
    return trajectory


def assert_trajectories_close(got, expected, rtol=1e-5, atol=1e-6):
    assert len(got) == len(expected)
    for step, (got_params, expected_params) in enumerate(zip(got, expected), 1):
        for i, (a, b) in enumerate(zip(got_params, expected_params)):
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"step {step}, parameter {i}")


def is_plain(obj) -> bool:
    """Only what a restricted checkpoint unpickler accepts: host arrays, numbers, strings, lists, dicts."""
    if isinstance(obj, dict):
        return all(isinstance(k, str) and is_plain(v) for k, v in obj.items())
    if isinstance(obj, list):
        return all(is_plain(v) for v in obj)
    if isinstance(obj, np.ndarray):
        return type(obj) is np.ndarray and obj.dtype.kind in "biuf"
    return obj is None or type(obj) in (bool, int, float, str)


# -- trajectories -------------------------------------------------------------------------

@pytest.mark.parametrize("kind, settings", CONFIGS, ids=CONFIG_IDS)
def test_trajectory_matches_the_published_rule(device, kind, settings):
    values, grads = initial_values(), gradient_sequence()
    params = make_params(values, device)
    got = run(OPTIMIZERS[kind](params, **settings), params, grads)
    expected = reference(kind, values, grads, [settings["lr"]] * STEPS, **settings)
    assert_trajectories_close(got, expected)


@pytest.mark.parametrize("kind, settings", CONFIGS, ids=CONFIG_IDS)
def test_float64_parameters_are_updated_in_float64(device, kind, settings):
    values, grads = initial_values(), gradient_sequence()
    params = make_params(values, device, dtype="float64")
    optimizer = OPTIMIZERS[kind](params, **settings)
    got = run(optimizer, params, grads)
    assert all(p.dtype == np.float64 for p in params)
    assert all(value.dtype == np.float64 for state in optimizer.state for value in state.values()
               if hasattr(value, "dtype"))
    expected = reference(kind, values, grads, [settings["lr"]] * STEPS, **settings)
    assert_trajectories_close(got, expected, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("kind, settings", CONFIGS, ids=CONFIG_IDS)
def test_trajectory_matches_pytorch(device, kind, settings):
    torch = pytest.importorskip("torch")
    values, grads = initial_values(), gradient_sequence()
    params = make_params(values, device)
    got = run(OPTIMIZERS[kind](params, **settings), params, grads)
    assert_trajectories_close(got, torch_trajectory(torch, kind, values, grads, lambda ps: ps, settings))


def torch_trajectory(torch, kind, values, grads, groups, settings):
    """PyTorch's parameters after each step of ``kind`` on ``groups(its parameters)`` with ``grads``."""
    torch_params = [torch.tensor(v, requires_grad=True) for v in values]
    torch_class = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[kind]
    torch_optimizer = torch_class(groups(torch_params), **settings)
    trajectory = []
    for step_grads in grads:
        for p, g in zip(torch_params, step_grads):
            p.grad = torch.tensor(g)
        torch_optimizer.step()
        trajectory.append([p.detach().numpy().copy() for p in torch_params])
    return trajectory


@given(
    lr=st.floats(1e-4, 1.0),
    momentum=st.floats(0.0, 0.99),
    nesterov=st.booleans(),
    weight_decay=st.sampled_from([0.0, 1e-4, 0.1]),
)
def test_sgd_matches_the_rule_for_any_hyperparameters(device, lr, momentum, nesterov, weight_decay):
    settings = dict(lr=lr, momentum=momentum, nesterov=nesterov and momentum > 0, weight_decay=weight_decay)
    values, grads = initial_values(2), gradient_sequence(5, 3)
    params = make_params(values, device)
    got = run(SGD(params, **settings), params, grads)
    assert_trajectories_close(got, reference("sgd", values, grads, [lr] * 5, **settings), rtol=1e-5, atol=1e-5)


@given(
    kind=st.sampled_from(["adam", "adamw"]),
    lr=st.floats(1e-4, 0.5),
    beta1=st.floats(0.0, 0.99),
    beta2=st.floats(0.5, 0.9999),
    eps=st.sampled_from([1e-8, 1e-6, 1e-3]),
    weight_decay=st.sampled_from([0.0, 0.01, 0.3]),
)
def test_adam_family_matches_the_rule_for_any_hyperparameters(device, kind, lr, beta1, beta2, eps, weight_decay):
    settings = dict(lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
    values, grads = initial_values(4), gradient_sequence(5, 5)
    params = make_params(values, device)
    got = run(OPTIMIZERS[kind](params, **settings), params, grads)
    assert_trajectories_close(got, reference(kind, values, grads, [lr] * 5, **settings), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw"])
def test_trains_a_linear_regression_with_autograd(device, kind):
    rng = np.random.default_rng(0)
    x = tt.tensor(rng.standard_normal((64, 3)), device=device)
    y = x @ tt.tensor([[1.5], [-2.0], [0.5]], device=device) + 0.3
    w = tt.zeros(3, 1, device=device, requires_grad=True)
    b = tt.zeros(1, device=device, requires_grad=True)
    settings = {"sgd": dict(lr=0.1, momentum=0.9), "adam": dict(lr=0.05), "adamw": dict(lr=0.05)}[kind]
    optimizer = OPTIMIZERS[kind]([w, b], **settings)
    losses = []
    for _ in range(200):
        optimizer.zero_grad()
        loss = ((x @ w + b - y) ** 2).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 1e-3 * losses[0], losses[::20]


# -- the state of the optimizer ---------------------------------------------------------------

@pytest.mark.parametrize("kind, settings", CONFIGS, ids=CONFIG_IDS)
def test_updates_in_place_and_keeps_dtype_and_grad(device, kind, settings):
    values, grads = initial_values(), gradient_sequence(3)
    params = make_params(values, device)
    arrays = [p.data for p in params]
    optimizer = OPTIMIZERS[kind](params, **settings)
    set_grads(params, grads[0])
    optimizer.step()
    buffers = [{k: v for k, v in state.items() if hasattr(v, "shape")} for state in optimizer.state]
    for step_grads in grads[1:]:
        set_grads(params, step_grads)
        optimizer.step()
    for p, array, state, before, g in zip(params, arrays, optimizer.state, buffers, grads[-1]):
        assert p.data is array, "the parameter's array must be updated in place"
        assert p.dtype == np.float32
        for key, buffer in before.items():
            assert state[key] is buffer, f"state {key!r} must be updated in place"
            assert buffer.dtype == np.float32 and p._backend.is_array(buffer)
        np.testing.assert_array_equal(p.grad.numpy(), g)  # step() leaves gradients alone


@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw"])
def test_float16_parameters_stay_float16(device, kind):
    params = make_params(initial_values(), device, dtype="float16")
    optimizer = OPTIMIZERS[kind](params, lr=0.01, **({"momentum": 0.9} if kind == "sgd" else {}))
    run(optimizer, params, gradient_sequence(2))
    assert all(p.dtype == np.float16 for p in params)
    assert all(v.dtype == np.float16 for state in optimizer.state for v in state.values() if hasattr(v, "dtype"))
    assert all(np.isfinite(p.numpy()).all() for p in params)


def test_state_memory_is_0x_1x_2x_the_parameters(device):
    params = make_params(initial_values(), device)
    set_grads(params, gradient_sequence(1)[0])
    param_count = sum(p.size for p in params)
    for optimizer, multiple in ((SGD(params, lr=0.1), 0), (SGD(params, lr=0.1, momentum=0.9), 1),
                                (Adam(params), 2), (AdamW(params), 2)):
        optimizer.step()
        count = sum(v.size for state in optimizer.state for v in state.values() if hasattr(v, "size"))
        assert count == multiple * param_count, (optimizer, count)


@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw"])
def test_parameters_without_grad_are_skipped(device, kind):
    settings = {"sgd": dict(lr=0.1, momentum=0.9, weight_decay=0.1), "adam": dict(lr=0.1, weight_decay=0.1),
                "adamw": dict(lr=0.1)}[kind]
    values, grads = initial_values(), gradient_sequence()
    grads = [[g if i == 0 or t >= 3 else None for i, g in enumerate(step)] for t, step in enumerate(grads)]
    params = make_params(values, device)
    optimizer = OPTIMIZERS[kind](params, **settings)
    for step_grads in grads[:3]:
        set_grads(params, step_grads)
        optimizer.step()
    for p, v in zip(params[1:], values[1:]):
        np.testing.assert_array_equal(p.numpy(), v)  # untouched, even by weight decay
    assert optimizer.state[1] == {} and optimizer.state[2] == {}
    got = run(optimizer, params, grads[3:])
    expected = reference(kind, values, grads, [settings["lr"]] * STEPS, **settings)
    assert_trajectories_close(got, expected[3:])
    if kind != "sgd":
        assert [state["step"] for state in optimizer.state] == [6, 3, 3]  # step counts are per parameter


def test_zero_grad_sets_grads_to_none(device):
    params = make_params(initial_values(), device)
    set_grads(params, gradient_sequence(1)[0])
    optimizer = SGD(params, lr=0.1)
    optimizer.zero_grad()
    assert all(p.grad is None for p in params)
    before = [p.numpy() for p in params]
    optimizer.step()  # nothing to do
    assert all(np.array_equal(p.numpy(), b) for p, b in zip(params, before))


def test_gradients_accumulate_until_zero_grad(device):
    w = tt.tensor([1.0, 2.0], device=device, requires_grad=True)
    optimizer = SGD([w], lr=0.1)
    (w * 3.0).sum().backward()
    (w * 3.0).sum().backward()
    optimizer.step()
    np.testing.assert_allclose(w.numpy(), [1.0 - 0.6, 2.0 - 0.6], rtol=1e-6)
    optimizer.zero_grad()
    (w * 3.0).sum().backward()
    optimizer.step()
    np.testing.assert_allclose(w.numpy(), [1.0 - 0.9, 2.0 - 0.9], rtol=1e-6)


# -- lr ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, settings", CONFIGS, ids=CONFIG_IDS)
def test_lr_setter_changes_the_next_step(device, kind, settings):
    values, grads = initial_values(), gradient_sequence()
    params = make_params(values, device)
    optimizer = OPTIMIZERS[kind](params, **settings)
    lrs = [settings["lr"]] * 2 + [settings["lr"] * 0.3] * 2 + [settings["lr"] * 2.0] * 2
    got = run(optimizer, params, grads, lrs=lrs)
    assert optimizer.lr == lrs[-1]
    assert_trajectories_close(got, reference(kind, values, grads, lrs, **settings))


def test_hyperparameters_are_python_floats(device):
    params = make_params(initial_values(), device)
    sgd = SGD(params, lr=np.float64(0.1), momentum=np.float32(0.5), weight_decay=np.float64(0.01))
    adam = Adam([{"params": params[:1], "eps": np.float32(1e-3)}, {"params": params[1:]}], lr=np.float64(0.1),
                betas=[np.float64(0.9), 0.99], eps=np.float64(1e-6))
    sgd.lr = np.float64(0.2)
    (sgd_group,), (first, second) = sgd.param_groups, adam.param_groups
    for value in (sgd.lr, sgd_group["lr"], sgd_group["momentum"], sgd_group["weight_decay"], adam.lr,
                  *first["betas"], first["eps"], second["eps"], first["weight_decay"], first["lr_scale"]):
        assert type(value) is float, type(value)
    assert first["betas"] == adam.defaults["betas"] == (0.9, 0.99)
    run(adam, params, gradient_sequence(2))
    assert all(p.dtype == np.float32 for p in params)


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, float("nan"), float("inf")])
def test_lr_setter_refuses_bad_values(bad):
    optimizer = Adam(make_params(initial_values(), "cpu"), lr=0.01)
    with pytest.raises(ValueError, match=r"lr") as error:
        optimizer.lr = bad
    assert repr(float(bad)) in str(error.value)
    assert optimizer.lr == 0.01


@pytest.mark.parametrize("bad", ["0.1", None, [0.1], True])
def test_lr_must_be_a_number(bad):
    optimizer = SGD(make_params(initial_values(), "cpu"), lr=0.01)
    with pytest.raises(TypeError, match="lr"):
        optimizer.lr = bad


# -- state_dict ---------------------------------------------------------------------------------

def column_major(params: list[tt.Tensor]) -> list[tt.Tensor]:
    """The same parameters, each stored column-major (as ``Linear`` stores its weight)."""
    for p in params:
        p.data = p._backend.xp.array(p.data, order="F")
    return params


@pytest.mark.parametrize("kind, settings", CONFIGS, ids=CONFIG_IDS)
def test_state_and_scratch_take_the_parameters_memory_order(device, kind, settings):
    """A buffer in another order than its parameter would make every in-place update up to 40x
    slower: state and scratch arrays follow each parameter's order, and the values are the rule's."""
    from tinytrain.backend import memory_order

    values, grads = initial_values(), gradient_sequence()
    params = column_major(make_params(values, device))
    optimizer = OPTIMIZERS[kind](params, **settings)
    got = run(optimizer, params, grads)
    assert_trajectories_close(got, reference(kind, values, grads, [settings["lr"]] * STEPS, **settings))
    xp = params[0]._backend.xp
    for param, state in zip(params, optimizer.state):
        order = memory_order(param.data)
        assert all(memory_order(v) == order for v in state.values() if hasattr(v, "shape")), kind
        assert memory_order(optimizer.scratch_like(param.data, xp)) == order
    assert memory_order(params[0].data) == "F"  # the matrix; vectors are both orders at once
    row_major = tt.zeros(*SHAPES[0], device=device)
    assert memory_order(optimizer.scratch_like(row_major.data, xp)) == "C"


@pytest.mark.parametrize("row_major_first", [True, False])
def test_loaded_state_takes_the_parameters_memory_order(device, row_major_first):
    from tinytrain.backend import memory_order

    values, grads = initial_values(), gradient_sequence()
    source, target = make_params(values, device), column_major(make_params(values, device))
    if not row_major_first:
        source, target = target, source
    optimizer = Adam(source, lr=0.1)
    run(optimizer, source, grads[:2])
    for copy in (True, False):
        resumed = Adam(target, lr=0.1)
        resumed.load_state_dict(optimizer.state_dict(), copy=copy)
        for param, state, saved in zip(target, resumed.state, optimizer.state):
            assert memory_order(state["exp_avg"]) == memory_order(state["exp_avg_sq"]) == memory_order(param.data)
            host = param._backend.to_host
            np.testing.assert_array_equal(host(state["exp_avg"]), host(saved["exp_avg"]))


@pytest.mark.parametrize("kind, settings", CONFIGS, ids=CONFIG_IDS)
def test_state_dict_round_trip_is_bit_identical(device, kind, settings):
    values, grads = initial_values(), gradient_sequence()
    grads[1][2] = None  # a parameter skipped on one step, so step counts differ per parameter
    straight = make_params(values, device)
    run(OPTIMIZERS[kind](straight, **settings), straight, grads)

    first = make_params(values, device)
    optimizer = OPTIMIZERS[kind](first, **settings)
    run(optimizer, first, grads[:3])
    saved = pickle.loads(pickle.dumps(optimizer.state_dict()))
    assert is_plain(saved), saved
    resumed = [tt.tensor(p.numpy(), device=device, requires_grad=True) for p in first]
    fresh = OPTIMIZERS[kind](resumed, lr=123.0)  # hyperparameters come back from the state dict
    fresh.load_state_dict(saved)
    assert fresh.lr == settings["lr"]
    run(fresh, resumed, grads[3:])
    for a, b in zip(resumed, straight):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_state_dict_contents(device):
    params = make_params(initial_values(), device)
    optimizer = Adam(params, lr=0.01, betas=(0.8, 0.9))
    run(optimizer, params, gradient_sequence(2))
    saved = optimizer.state_dict()
    assert saved["optimizer"] == "Adam" and saved["lr"] == 0.01
    assert saved["param_groups"] == [{"params": [0, 1, 2], "lr": 0.01, "betas": [0.8, 0.9], "eps": 1e-8,
                                      "weight_decay": 0.0, "lr_scale": 1.0}]
    assert len(saved["state"]) == len(params)
    for state, p in zip(saved["state"], params):
        assert state["step"] == 2 and type(state["step"]) is int
        assert type(state["exp_avg"]) is np.ndarray and state["exp_avg"].shape == p.shape
        assert state["exp_avg"].dtype == np.float32
    sgd = SGD(params, lr=0.5, momentum=0.9, nesterov=True)
    assert sgd.state_dict() == {
        "optimizer": "SGD",
        "lr": 0.5,
        "param_groups": [{"params": [0, 1, 2], "lr": 0.5, "momentum": 0.9, "nesterov": True, "weight_decay": 0.0,
                          "lr_scale": 1.0}],
        "state": [{}, {}, {}],
    }


def test_state_dict_is_a_snapshot_and_load_copies(device):
    params = make_params(initial_values(), device)
    optimizer = SGD(params, lr=0.1, momentum=0.9)
    run(optimizer, params, gradient_sequence(2))
    saved = optimizer.state_dict()
    kept = [s["momentum_buffer"].copy() for s in saved["state"]]
    run(optimizer, params, gradient_sequence(2, seed=7))
    assert all(np.array_equal(s["momentum_buffer"], k) for s, k in zip(saved["state"], kept))

    other = SGD(make_params(initial_values(), device), lr=0.1, momentum=0.9)
    other.load_state_dict(saved)
    for s in saved["state"]:
        s["momentum_buffer"][...] = 99.0  # changing the dict afterwards must not reach the optimizer
    run(other, other.params, gradient_sequence(1))
    assert all(np.array_equal(s["momentum_buffer"], np.full_like(k, 99.0)) for s, k in zip(saved["state"], kept))
    assert all(np.abs(p.numpy()).max() < 50 for p in other.params)


def test_state_dict_without_copy_holds_the_same_values(device):
    params = make_params(initial_values(), device)
    optimizer = Adam(params, lr=0.1)
    run(optimizer, params, gradient_sequence(2))
    copied, shared = optimizer.state_dict(), optimizer.state_dict(copy=False)
    assert is_plain(shared)
    for a, b in zip(copied["state"], shared["state"]):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    if device == "cpu":  # host buffers are handed out as they are
        assert shared["state"][0]["exp_avg"] is optimizer.state[0]["exp_avg"]


def test_load_state_dict_without_copy_resumes_the_same(device):
    params = make_params(initial_values(), device)
    optimizer = SGD(params, lr=0.1, momentum=0.9)
    run(optimizer, params, gradient_sequence(2))
    saved = pickle.loads(pickle.dumps(optimizer.state_dict()))  # as read from a checkpoint
    saved["state"][1]["momentum_buffer"].flags.writeable = False  # a read-only buffer must still be copied
    twin_params = [tt.tensor(p.numpy(), device=device, requires_grad=True) for p in params]
    twin = SGD(twin_params, lr=0.5, momentum=0.0)
    twin.load_state_dict(saved, copy=False)
    run(optimizer, params, gradient_sequence(3, seed=4))
    run(twin, twin_params, gradient_sequence(3, seed=4))
    for a, b in zip(params, twin_params):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    if device == "cpu":
        assert twin.state[0]["momentum_buffer"] is saved["state"][0]["momentum_buffer"]
        assert twin.state[1]["momentum_buffer"] is not saved["state"][1]["momentum_buffer"]


@pytest.mark.parametrize("kind", ["SGD", "Adam"])
def test_loaded_state_of_a_parameter_not_yet_updated_starts_fresh(device, kind):
    make = {"SGD": lambda ps: SGD(ps, lr=0.1, momentum=0.9), "Adam": lambda ps: Adam(ps, lr=0.1)}[kind]
    first_only = [[g[0]] + [None] * (len(SHAPES) - 1) for g in gradient_sequence(2)]
    params = make_params(initial_values(), device)
    optimizer = make(params)
    run(optimizer, params, first_only)  # only parameter 0 has state
    twin_params = [tt.tensor(p.numpy(), device=device, requires_grad=True) for p in params]
    twin = make(twin_params)
    twin.load_state_dict(optimizer.state_dict())
    assert twin.state[1] == {}
    run(optimizer, params, gradient_sequence(2, seed=5))  # now every parameter
    run(twin, twin_params, gradient_sequence(2, seed=5))
    for a, b in zip(params, twin_params):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_load_state_dict_moves_to_the_parameters_device_and_dtype(device):
    source = make_params(initial_values(), "cpu")
    optimizer = Adam(source, lr=0.01)
    run(optimizer, source, gradient_sequence(2))
    saved = optimizer.state_dict()

    target = make_params(initial_values(), device, dtype="float64")
    loaded = Adam(target)
    loaded.load_state_dict(saved)
    for p, state, original in zip(target, loaded.state, saved["state"]):
        for key in ("exp_avg", "exp_avg_sq"):
            assert p._backend.is_array(state[key]) and state[key].dtype == np.float64
            np.testing.assert_array_equal(p._backend.to_host(state[key]), original[key].astype(np.float64))
    run(loaded, target, gradient_sequence(1))
    assert all(p.dtype == np.float64 for p in target)


def test_load_state_dict_refuses_a_mismatch_and_changes_nothing():
    params = make_params(initial_values(), "cpu")
    adam = Adam(params, lr=0.01)
    run(adam, params, gradient_sequence(1))
    before = adam.state_dict()

    with pytest.raises(ValueError, match="SGD.*Adam"):
        adam.load_state_dict(SGD(params, lr=0.1).state_dict())
    with pytest.raises(ValueError, match="2 parameters.*3"):
        adam.load_state_dict(Adam(params[:2]).state_dict())
    wrong_shape = adam.state_dict()
    wrong_shape["state"][1]["exp_avg"] = np.zeros(7, dtype=np.float32)
    with pytest.raises(ValueError, match=r"exp_avg.*\(7,\).*\(5,\)"):
        adam.load_state_dict(wrong_shape)
    bad_value = adam.state_dict()
    bad_value["param_groups"][0]["lr"] = -1.0
    bad_value["state"][0]["step"] = 100
    with pytest.raises(ValueError, match="-1.0"):
        adam.load_state_dict(bad_value)
    bad_rate = adam.state_dict()
    bad_rate["lr"] = float("nan")
    with pytest.raises(ValueError, match="nan"):
        adam.load_state_dict(bad_rate)
    with pytest.raises(ValueError, match="state dict"):
        adam.load_state_dict({"weights": []})
    foreign = adam.state_dict()
    foreign["param_groups"][0]["momentum"] = 0.9
    with pytest.raises(ValueError, match="momentum"):
        adam.load_state_dict(foreign)
    not_a_dict = adam.state_dict()
    not_a_dict["state"][2] = [1, 2]
    with pytest.raises(ValueError, match="parameter 2"):
        adam.load_state_dict(not_a_dict)

    after = adam.state_dict()
    assert after["param_groups"] == before["param_groups"] and after["lr"] == before["lr"]
    for a, b in zip(after["state"], before["state"]):
        assert a["step"] == b["step"] and np.array_equal(a["exp_avg"], b["exp_avg"])


MISSING = object()
BAD_STATES = [  # (optimizer, parameter index, key, bad value or MISSING, error, what the message must say)
    ("adam", 1, "exp_avg", MISSING, ValueError, r"state of parameter 1 lacks 'exp_avg'"),
    ("adam", 2, "exp_avg_sq", MISSING, ValueError, r"state of parameter 2 lacks 'exp_avg_sq'"),
    ("adam", 0, "step", MISSING, ValueError, r"state of parameter 0 lacks 'step'"),
    ("adam", 0, "step", "3", TypeError, r"state\[0\]\['step'\] must be a whole number, got .*='3' of type str"),
    ("adam", 1, "step", -1, ValueError, r"state\[1\]\['step'\] must be a whole number >= 0, got .*=-1"),
    ("adam", 2, "step", 2.0, TypeError, r"state\[2\]\['step'\].*=2.0 of type float"),
    ("adam", 0, "step", True, TypeError, r"state\[0\]\['step'\].*=True of type bool"),
    ("adam", 1, "exp_avg", [0.0] * 5, TypeError, r"state\[1\]\['exp_avg'\] must be a NumPy array.*of type list"),
    ("adam", 1, "exp_avg", np.zeros(7, np.float32), ValueError,
     r"state\[1\]\['exp_avg'\] has shape \(7,\), the parameter has shape \(5,\)"),
    ("adam", 0, "exp_avg_sq", np.zeros((3, 4), np.complex64), TypeError,
     r"state\[0\]\['exp_avg_sq'\] holds complex64 values.*float32"),
    ("adam", 0, "exp_avg", np.full((3, 4), "x"), TypeError, r"state\[0\]\['exp_avg'\] holds <U1 values"),
    ("adam", 0, "exp_avg", np.zeros((3, 4), bool), TypeError, r"state\[0\]\['exp_avg'\] holds bool values"),
    ("adam", 1, "exp_avg_sq", np.array([0.5, 0.1, -0.25, 0.0, 1.0], np.float32), ValueError,
     r"state\[1\]\['exp_avg_sq'\] must hold numbers >= 0.*-0.25 at index \(2,\)"),
    ("adam", 1, "exp_avg_sq", np.array([0.5, np.nan, 0.2, 0.0, 1.0], np.float32), ValueError,
     r"state\[1\]\['exp_avg_sq'\] must hold numbers >= 0.*nan at index \(1,\)"),
    ("adam", 2, "momentum_buffer", np.zeros((), np.float32), ValueError,
     r"state of parameter 2 has an unknown key 'momentum_buffer'.*step, exp_avg, exp_avg_sq"),
    ("sgd", 0, "momentum_buffer", MISSING, ValueError, None),  # not an error: an empty state starts fresh
    ("sgd", 0, "momentum_buffer", [[0.0] * 4] * 3, TypeError, r"state\[0\]\['momentum_buffer'\].*list"),
    ("sgd", 2, "step", 3, ValueError, r"state of parameter 2 has an unknown key 'step'.*momentum_buffer"),
]


def trained(kind):
    params = make_params(initial_values(), "cpu")
    optimizer = Adam(params, lr=0.01) if kind == "adam" else SGD(params, lr=0.1, momentum=0.9)
    run(optimizer, params, gradient_sequence(2))
    return optimizer, params


@pytest.mark.parametrize("kind, index, key, value, error, message", BAD_STATES)
def test_load_state_dict_refuses_bad_parameter_state_and_changes_nothing(kind, index, key, value, error, message):
    """The load itself raises, naming the parameter, the key and the value (else the next step() would fail, or
    go wrong), and the optimizer keeps its own state, stepping on as if nothing had been loaded."""
    optimizer, params = trained(kind)
    twin, twin_params = trained(kind)
    bad = optimizer.state_dict()
    bad["lr"] = 0.5  # must not be applied either
    if value is MISSING:
        del bad["state"][index][key]
    else:
        bad["state"][index][key] = value
    if message is None:  # SGD's only key gone: the state is empty, which loads (a parameter not yet updated)
        optimizer.load_state_dict(bad)
        assert optimizer.state[index] == {} and optimizer.lr == 0.5
        return
    with pytest.raises(error, match=message):
        optimizer.load_state_dict(bad)
    assert optimizer.lr == twin.lr
    run(optimizer, params, gradient_sequence(2, seed=3))
    run(twin, twin_params, gradient_sequence(2, seed=3))
    for a, b in zip(params + [s.get("step") for s in optimizer.state],
                    twin_params + [s.get("step") for s in twin.state]):
        np.testing.assert_array_equal(a.numpy() if isinstance(a, tt.Tensor) else a,
                                      b.numpy() if isinstance(b, tt.Tensor) else b)


def test_loaded_step_count_becomes_an_int():
    optimizer, params = trained("adam")
    saved = optimizer.state_dict()
    saved["state"][0]["step"] = np.int64(2)
    optimizer.load_state_dict(saved)
    assert type(optimizer.state[0]["step"]) is int and optimizer.state[0]["step"] == 2


def test_a_step_that_raises_changes_nothing(device, other_device):
    """A gradient that cannot be used (on another device, of a non-floating dtype, not a tensor) is found before
    any parameter or state changes: the step counters, moments and earlier parameters stay as they were."""
    for bad_grad, error, message in (
            (lambda p: tt.tensor(np.ones(p.shape, np.float32), device=other_device), RuntimeError,
             "parameter 2 is on .*, its gradient on"),
            (lambda p: tt.tensor(np.ones(p.shape, np.int64), device=device), TypeError,
             "gradient of parameter 2 has dtype int64"),
            (lambda p: np.ones(p.shape, np.float32), TypeError, "gradient of parameter 2 must be a Tensor.*ndarray"),
            (lambda p: tt.ones(4, device=device), ValueError, r"parameter 2 has shape \(\) and a gradient of shape \(4,\)")):
        params = make_params(initial_values(), device)
        optimizer = Adam(params, lr=0.01)
        run(optimizer, params, gradient_sequence(1))
        before = [p.numpy() for p in params], optimizer.state_dict()
        set_grads(params, gradient_sequence(1, seed=5)[0])
        params[2].grad = bad_grad(params[2])
        with pytest.raises(error, match=message):
            optimizer.step()
        after = optimizer.state_dict()
        for a, b in zip(before[0], params):
            np.testing.assert_array_equal(a, b.numpy())
        for a, b in zip(before[1]["state"], after["state"]):
            assert a["step"] == b["step"] == 1
            np.testing.assert_array_equal(a["exp_avg"], b["exp_avg"])
            np.testing.assert_array_equal(a["exp_avg_sq"], b["exp_avg_sq"])


# -- parameter groups ---------------------------------------------------------------------------

GROUP_CONFIGS = [  # (kind, constructor settings, the second group's own settings)
    ("sgd", dict(lr=0.1, momentum=0.9), dict(lr=0.02, momentum=0.0, weight_decay=0.1)),
    ("sgd", dict(lr=0.05, momentum=0.5, nesterov=True), dict(momentum=0.8)),
    ("adam", dict(lr=0.01), dict(lr=0.1, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    ("adamw", dict(lr=0.01, weight_decay=0.1), dict(weight_decay=0.0)),
    ("adamw", dict(lr=0.1, betas=(0.9, 0.99)), dict(lr=0.01, weight_decay=0.5)),
]


def grouped_reference(kind, values, grads, lrs, settings, own):
    """The trajectory of [p0] with ``settings`` and [p1, p2] with ``own`` over them, each by ``reference``."""
    rates = [lr * own.get("lr", settings["lr"]) / settings["lr"] for lr in lrs]  # the second group's lr_scale
    first = reference(kind, values[:1], [g[:1] for g in grads], lrs, **settings)
    second = reference(kind, values[1:], [g[1:] for g in grads], rates, **{**settings, **own})
    return [a + b for a, b in zip(first, second)]


@pytest.mark.parametrize("kind, settings, own", GROUP_CONFIGS)
def test_each_group_steps_with_its_own_hyperparameters(device, kind, settings, own):
    values, grads = initial_values(), gradient_sequence()
    params = make_params(values, device)
    optimizer = OPTIMIZERS[kind]([{"params": params[:1]}, {"params": params[1:], **own}], **settings)
    lrs = [settings["lr"]] * 2 + [settings["lr"] * 0.3] * 2 + [settings["lr"] * 2.0] * 2  # a schedule sets lr
    got = run(optimizer, params, grads, lrs=lrs)
    assert_trajectories_close(got, grouped_reference(kind, values, grads, lrs, settings, own))


@pytest.mark.parametrize("kind, settings, own", GROUP_CONFIGS)
def test_groups_match_pytorch(kind, settings, own):
    torch = pytest.importorskip("torch")
    values, grads = initial_values(), gradient_sequence()
    params = make_params(values, "cpu")
    def groups(ps):
        return [{"params": ps[:1]}, {"params": ps[1:], **own}]

    got = run(OPTIMIZERS[kind](groups(params), **settings), params, grads)
    assert_trajectories_close(got, torch_trajectory(torch, kind, values, grads, groups, settings))


def test_lr_sets_every_group_keeping_the_ratio_of_a_group_with_its_own_rate():
    params = make_params(initial_values(), "cpu")
    optimizer = AdamW([{"params": params[:1]}, {"params": params[1:2], "lr": 1e-4}, {"params": params[2:]}], lr=1e-3)
    assert [group["lr_scale"] for group in optimizer.param_groups] == [1.0, 1e-4 / 1e-3, 1.0]
    for rate in (0.37, 3e-5, 1e-3):
        optimizer.lr = rate
        first, second, third = (group["lr"] for group in optimizer.param_groups)
        assert first == third == optimizer.lr == rate  # exactly: the schedule's value itself
        assert math.isclose(second, rate / 10, rel_tol=1e-15)
    with pytest.raises(ValueError, match="lr"):
        optimizer.lr = -1.0
    assert [group["lr"] for group in optimizer.param_groups][::2] == [1e-3, 1e-3]


def test_a_changed_group_setting_applies_at_the_next_step(device):
    values, grads = initial_values(), gradient_sequence(2)
    params = make_params(values, device)
    optimizer = SGD(params, lr=0.1)
    optimizer.param_groups[0]["weight_decay"] = 0.5  # as with PyTorch: the groups hold the live values
    got = run(optimizer, params, grads)
    assert_trajectories_close(got, reference("sgd", values, grads, [0.1, 0.1], lr=0.1, weight_decay=0.5))


@pytest.mark.parametrize("kind, settings, own", GROUP_CONFIGS)
def test_state_dict_round_trip_with_groups_is_bit_identical(device, kind, settings, own):
    values, grads = initial_values(), gradient_sequence()
    lrs = [settings["lr"] * f for f in (1.0, 0.5, 0.25, 0.125, 0.1, 0.05)]

    def groups(params, **changed):
        return [{"params": params[:1]}, {"params": params[1:], **own, **changed}]

    straight = make_params(values, device)
    run(OPTIMIZERS[kind](groups(straight), **settings), straight, grads, lrs)
    first = make_params(values, device)
    optimizer = OPTIMIZERS[kind](groups(first), **settings)
    run(optimizer, first, grads[:3], lrs[:3])
    saved = pickle.loads(pickle.dumps(optimizer.state_dict()))
    assert is_plain(saved), saved
    resumed = [tt.tensor(p.numpy(), device=device, requires_grad=True) for p in first]
    fresh = OPTIMIZERS[kind](groups(resumed, lr=7.0), lr=123.0)  # every rate and setting comes back from the state
    fresh.load_state_dict(saved)
    assert fresh.lr == optimizer.lr
    assert [{k: v for k, v in g.items() if k != "params"} for g in fresh.param_groups] == \
        [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    run(fresh, resumed, grads[3:], lrs[3:])
    for a, b in zip(resumed, straight):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_load_state_dict_refuses_other_groups_and_changes_nothing():
    params = make_params(initial_values(), "cpu")
    optimizer = Adam([{"params": params[:1], "weight_decay": 0.1}, {"params": params[1:]}], lr=0.01)
    run(optimizer, params, gradient_sequence(1))
    before = optimizer.state_dict()
    with pytest.raises(ValueError, match="1 parameter groups, this optimizer has 2"):
        optimizer.load_state_dict(Adam(params, lr=0.01).state_dict())
    other_split = Adam([{"params": params[:2]}, {"params": params[2:]}], lr=0.01).state_dict()
    with pytest.raises(ValueError, match=r"group 0 .* holds parameters \[0, 1\], this optimizer's holds \[0\]"):
        optimizer.load_state_dict(other_split)
    bad_scale = optimizer.state_dict()
    bad_scale["param_groups"][1]["lr_scale"] = 0.0
    with pytest.raises(ValueError, match="lr_scale"):
        optimizer.load_state_dict(bad_scale)
    bad_setting = optimizer.state_dict()
    bad_setting["param_groups"][1]["eps"] = -1.0
    with pytest.raises(ValueError, match="eps.*-1.0"):
        optimizer.load_state_dict(bad_setting)
    after = optimizer.state_dict()
    assert after["param_groups"] == before["param_groups"] and after["lr"] == before["lr"]


def test_a_state_dict_saved_before_groups_loads_as_one_group():
    values, grads = initial_values(), gradient_sequence()
    straight = make_params(values, "cpu")
    run(SGD(straight, lr=0.1, momentum=0.9), straight, grads)
    first = make_params(values, "cpu")
    optimizer = SGD(first, lr=0.1, momentum=0.9)
    run(optimizer, first, grads[:3])
    saved = optimizer.state_dict()
    old = {"optimizer": "SGD", "hyperparameters": {"lr": 0.1, "momentum": 0.9, "nesterov": False,
                                                   "weight_decay": 0.0}, "state": saved["state"]}
    resumed = [tt.tensor(p.numpy(), requires_grad=True) for p in first]
    fresh = SGD(resumed, lr=5.0)
    fresh.load_state_dict(old)
    assert fresh.lr == 0.1 and fresh.param_groups[0]["momentum"] == 0.9
    run(fresh, resumed, grads[3:])
    for a, b in zip(resumed, straight):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    with pytest.raises(ValueError, match="1 parameter groups, this optimizer has 2"):
        SGD([{"params": resumed[:1]}, {"params": resumed[1:]}], lr=0.1, momentum=0.9).load_state_dict(old)


def test_weight_decay_groups_decay_the_matrices_only():
    tt.manual_seed(0)
    model = tt.nn.Sequential(tt.nn.Linear(4, 3), tt.nn.LayerNorm(3), tt.nn.Linear(3, 2, bias=False))
    decay, keep = tt.optim.weight_decay_groups(model.parameters(), 0.1)
    assert decay["weight_decay"] == 0.1 and keep["weight_decay"] == 0.0
    assert [p.shape for p in decay["params"]] == [(3, 4), (2, 3)]
    assert [p.shape for p in keep["params"]] == [(3,), (3,), (3,)]  # a bias, LayerNorm's gain and shift
    optimizer = AdamW(tt.optim.weight_decay_groups(model.parameters(), 0.1), lr=1e-3, betas=(0.9, 0.99))
    before = [p.numpy() for p in model.parameters()]
    for p in model.parameters():
        p.grad = tt.zeros(*p.shape)  # only the decay acts
    optimizer.step()
    for p, old in zip(model.parameters(), before):
        np.testing.assert_allclose(p.numpy(), old * (1 - 1e-4) if p.ndim >= 2 else old, rtol=1e-6)
    with pytest.raises(ValueError, match="weight_decay.*-0.1"):
        tt.optim.weight_decay_groups(model.parameters(), -0.1)
    with pytest.raises(TypeError, match=r"params\[0\] is a ndarray"):
        tt.optim.weight_decay_groups([np.zeros((2, 2))], 0.1)


def test_bad_parameter_groups_are_refused(device):
    w, v = (tt.zeros(*shape, device=device, requires_grad=True) for shape in ((2, 2), (2,)))
    with pytest.raises(ValueError, match=r"params\[1\] is a parameter group with keys \['lr', 'parms'\].*needs 'params'"):
        Adam([{"params": [w]}, {"parms": [v], "lr": 0.1}])
    with pytest.raises(ValueError, match=r"keys \['momentum', 'params'\].*may set betas, eps, lr, weight_decay"):
        Adam([{"params": [w], "momentum": 0.9}])
    with pytest.raises(ValueError, match=r"params\[1\]\['params'\]\[0\] \(shape \(2, 2\)\) appears more than once.*"
                                         r"params\[0\]\['params'\]\[0\]"):
        Adam([{"params": [w]}, {"params": [w, v]}])
    with pytest.raises(ValueError, match=r"params\[1\] \(a parameter group\): lr must be .*> 0, got lr=-0.1"):
        Adam([{"params": [w]}, {"params": [v], "lr": -0.1}])
    with pytest.raises(ValueError, match=r"params\[0\] \(a parameter group\): nesterov=True needs momentum > 0"):
        SGD([{"params": [w], "nesterov": True}], lr=0.1)
    with pytest.raises(ValueError, match=r"params\[0\]\['params'\]\[0\] .*does not require grad"):
        Adam([{"params": [tt.zeros(2, device=device)]}])
    with pytest.raises(TypeError, match=r"params\[0\]\['params'\] must be an iterable of tensors, got a single"):
        Adam([{"params": w}])
    with pytest.raises(ValueError, match="empty parameter list"):
        Adam([{"params": []}, {"params": [], "lr": 0.1}])
    optimizer = Adam([{"params": [w]}, {"params": []}])  # an empty group is allowed, as in PyTorch
    assert optimizer.params == [w] and len(optimizer.param_groups) == 2


# -- parameters and hyperparameters that are refused -----------------------------------------

@pytest.mark.parametrize(
    "make, value",
    [
        (lambda p: SGD(p, lr=0.0), "0.0"),
        (lambda p: SGD(p, lr=-0.5), "-0.5"),
        (lambda p: SGD(p, lr=0.1, momentum=-0.9), "-0.9"),
        (lambda p: SGD(p, lr=0.1, weight_decay=-1e-4), "-0.0001"),
        (lambda p: SGD(p, lr=0.1, nesterov=True), "momentum=0.0"),
        (lambda p: Adam(p, lr=-1e-3), "-0.001"),
        (lambda p: Adam(p, betas=(1.0, 0.999)), "1.0"),
        (lambda p: Adam(p, betas=(0.9, -0.1)), "-0.1"),
        (lambda p: Adam(p, betas=(0.9, float("nan"))), "nan"),
        (lambda p: Adam(p, betas=(0.9,)), "(0.9,)"),
        (lambda p: Adam(p, eps=0.0), "0.0"),
        (lambda p: Adam(p, weight_decay=-0.1), "-0.1"),
        (lambda p: AdamW(p, weight_decay=-0.01), "-0.01"),
        (lambda p: AdamW(p, lr=float("nan")), "nan"),
        (lambda p: AdamW(p, betas=(0.9, 1.5)), "1.5"),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_bad_hyperparameters_raise_value_error_naming_the_value(make, value):
    with pytest.raises(ValueError) as error:
        make(make_params(initial_values(), "cpu"))
    assert value in str(error.value), str(error.value)


def test_params_may_be_any_iterable(device):
    params = make_params(initial_values(), device)
    optimizer = Adam(p for p in params)  # a generator, walked once
    assert optimizer.params == params
    set_grads(params, gradient_sequence(1)[0])
    optimizer.step()
    assert all(state["step"] == 1 for state in optimizer.state)
    assert len(SGD(tuple(params), lr=0.1).params) == 3


def test_bad_parameter_lists_are_refused(device):
    w = tt.zeros(3, device=device, requires_grad=True)
    with pytest.raises(ValueError, match="empty"):
        SGD([], lr=0.1)
    with pytest.raises(ValueError, match="empty"):
        Adam(p for p in [])
    with pytest.raises(ValueError, match=r"params\[1\].*\(2,\).*require grad"):
        Adam([w, tt.zeros(2, device=device)])
    with pytest.raises(ValueError, match="more than once"):
        Adam([w, w])
    with pytest.raises(ValueError, match="leaf"):
        Adam([w * 2.0])
    with pytest.raises(TypeError, match="single Tensor"):
        Adam(w)
    with pytest.raises(TypeError, match=r"params\[0\] is a ndarray"):
        Adam([np.zeros(3)])
    with pytest.raises(TypeError, match="mixes tensors and parameter groups"):
        Adam([w, {"params": [tt.zeros(2, device=device, requires_grad=True)]}])
    with pytest.raises(TypeError, match="got a dict; pass \\[group\\]"):
        Adam({"params": [w]})
    with pytest.raises(TypeError, match="iterable"):
        Adam(3)


def test_gradient_of_the_wrong_shape_is_refused(device):
    w = tt.zeros(3, device=device, requires_grad=True)
    w.grad = tt.ones(1, device=device)
    with pytest.raises(ValueError, match=r"\(3,\).*\(1,\)"):
        SGD([w], lr=0.1).step()


def test_repr_names_the_hyperparameters():
    text = repr(AdamW(make_params(initial_values(), "cpu")))
    assert text.startswith("AdamW(3 parameters, lr=0.001") and "weight_decay=0.01" in text
    params = make_params(initial_values(), "cpu")
    grouped = AdamW([{"params": params[:1]}, {"params": params[1:], "weight_decay": 0.0}])
    assert repr(grouped).startswith("AdamW(3 parameters in 2 groups, lr=0.001")
    assert math.isclose(grouped.defaults["weight_decay"], 0.01)


def test_public_names():
    assert tt.SGD is tt.optim.SGD is SGD
    assert tt.Adam is tt.optim.Adam and tt.AdamW is tt.optim.AdamW
