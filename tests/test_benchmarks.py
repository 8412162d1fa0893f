"""The benchmark scripts measure what they say: the sides compute the same thing, the epoch is the milestone's."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tinytrain.course import milestones
from tinytrain.course.inventory import installed_modules

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import cnn_epoch  # noqa: E402
import conv_layer  # noqa: E402
import gpt_milestone  # noqa: E402
import gpt_step  # noqa: E402
import mlp_step  # noqa: E402
import student_library  # noqa: E402
from _timing import torch_or_none  # noqa: E402


@pytest.mark.parametrize("index", [0, 2])  # the first layer (no input gradient) and one that needs it
def test_conv_layer_sides_compute_the_same_convolution(index) -> None:
    sides = ["tinytrain", "numpy"] + (["torch"] if torch_or_none() is not None else [])
    values = {}
    for side in sides:
        forward, backward = conv_layer.SIDES[side](index)
        values[side] = (forward(), backward())
    for side in sides[1:]:
        np.testing.assert_allclose(values[side], values["tinytrain"], rtol=1e-4, atol=1e-5, err_msg=side)


def test_conv_layer_first_layers_of_each_dataset_skip_the_input_gradient() -> None:
    needs = [conv_layer.layer_data(index)[3] for index in range(len(conv_layer.LAYERS))]
    assert needs == [False, True, True, True, False, True, True, True, True, True]


def test_mlp_step_sides_compute_the_same_losses_and_the_column_major_numpy_keeps_its_order() -> None:
    """The column-major NumPy step is the framework-free twin of tinytrain's array work: same losses, and
    weights, gradients and momentum buffers stay column-major (a row-major gradient would slow its update).
    The framework_free side is tinytrain's own array work: bit for bit the same losses as its step."""
    sides = ["tinytrain", "framework_free", "numpy", "numpy_column_major"]
    sides += ["torch"] if torch_or_none() is not None else []
    steps = {side: mlp_step.build(side) for side in sides}
    losses = {side: [step() for _ in range(3)] for side, step in steps.items()}
    for side in sides[1:]:
        np.testing.assert_allclose(losses[side], losses["tinytrain"], rtol=1e-4, atol=1e-5, err_msg=side)
    assert losses["framework_free"] == losses["tinytrain"]
    step = steps["numpy_column_major"]
    cells = dict(zip(step.__code__.co_freevars, (cell.cell_contents for cell in step.__closure__)))
    for weight, buffer in zip(cells["params"][::2], cells["buffers"][::2]):
        assert weight.flags.f_contiguous and not weight.flags.c_contiguous and buffer.flags.f_contiguous


def test_gpt_evaluation_batch_is_the_milestones_loss_on_64_windows_and_pytorch_agrees() -> None:
    """The evaluation step is the mean cross-entropy over every position of 64 windows, computed the way the
    milestone's loss computes it from the logits, and PyTorch's side gets the same number."""
    import tinytrain as tt

    loss = gpt_step.tinytrain_eval()()
    model = gpt_step.tinytrain_model(gpt_step.CONTEXT)
    ids = gpt_step.token_ids(gpt_step.EVAL_BATCH, gpt_step.CONTEXT)
    assert ids.shape == (64, gpt_step.CONTEXT + 1)
    with tt.no_grad():
        logits = model(tt.tensor(ids[:, :-1]))
        targets = tt.tensor(ids[:, 1:]).reshape(-1)
        expected = tt.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets)
    assert loss == pytest.approx(expected.item(), rel=1e-6)
    if torch_or_none() is not None:
        assert gpt_step.torch_eval()() == pytest.approx(loss, rel=1e-4)


def test_cnn_epoch_runs_the_milestone_on_data_of_the_datasets_shape(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    real_loader = milestones.load_dataset
    loader = cnn_epoch.synthetic("cifar10", 0.002)
    train, test = loader("cifar10", True, ""), loader("cifar10", False, "")
    assert train.images.shape == (100, 3, 32, 32) and len(test) == 20 and len(train.classes) == 10
    found = cnn_epoch.epoch_seconds("mnist", 0.002)  # 120 training images: two steps of 64 and a validation pass
    assert found["fraction"] == 0.002 and found["batch_size"] == 64
    assert found["epoch_seconds"] == pytest.approx(found["measured_seconds"] / 0.002)
    assert milestones.load_dataset is real_loader  # the real datasets are back for whatever runs next


@pytest.mark.parametrize("steps", [2, 150, 2000])  # a warm-up of 1 step, of half the steps, the recipe's 100
def test_gpt_milestone_pytorch_side_follows_the_milestones_schedule(steps) -> None:
    import tinytrain as tt

    schedule = tt.CosineSchedule(max_lr=gpt_milestone.LR, min_lr=gpt_milestone.MIN_LR, total_epochs=steps,
                                 warmup_epochs=gpt_milestone.warmup_steps(steps))
    for step in (0, 1, 99, 100, 101, steps // 2, steps - 1, steps, steps + 1):  # past the end: min_lr
        assert gpt_milestone.learning_rate(step, steps) == pytest.approx(schedule.get_lr(step), rel=1e-12), step
    assert gpt_milestone.warmup_steps(2000) == 100


def _fake_threadpoolctl(monkeypatch, libraries: list[dict]) -> None:
    module = type(sys)("threadpoolctl")
    module.threadpool_info = lambda: libraries
    monkeypatch.setitem(sys.modules, "threadpoolctl", module)


def test_run_records_the_blas_kernels_and_who_chose_them(monkeypatch) -> None:
    """The kernels move the CNN figures by 5-10%: the report names them, and OPENBLAS_CORETYPE when it chose them."""
    import run

    openblas = {"user_api": "blas", "internal_api": "openblas", "version": "0.3.31", "architecture": "SkylakeX"}
    openmp = {"user_api": "openmp", "internal_api": "openmp", "version": None}
    _fake_threadpoolctl(monkeypatch, [openmp, openblas])
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    assert run.blas() == "openblas 0.3.31, SkylakeX kernels"
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Zen")
    assert run.blas() == "openblas 0.3.31, SkylakeX kernels (OPENBLAS_CORETYPE=Zen)"
    _fake_threadpoolctl(monkeypatch, [{**openblas, "internal_api": "mkl", "architecture": None}])
    assert run.blas() == "mkl 0.3.31"  # OPENBLAS_CORETYPE means nothing to another BLAS
    machine = {"cpu": "a CPU", "cpus": 2, "python": "3.11.7", "numpy": np.__version__,
               "blas": "openblas 0.3.31, SkylakeX kernels"}  # run.machine() without lscpu and PyTorch's import
    report = {"machine": machine, "command": "c"}
    monkeypatch.setattr(run, "rows", lambda report: [])
    monkeypatch.setattr(run, "spread_note", lambda results: "")
    report.update(mlp_step={}, gpt={"train": {}, "eval": {}, "token": {}}, autograd={}, cnn=None)
    assert "NumPy " + np.__version__ + " (BLAS: openblas 0.3.31, SkylakeX kernels)" in run.markdown(report)


def test_run_names_numpys_blas_without_threadpoolctl(monkeypatch) -> None:
    import run

    monkeypatch.setitem(sys.modules, "threadpoolctl", None)  # not installed: the import fails
    found = run.blas()
    assert found.endswith("(kernels: pip install threadpoolctl to see them)") or found.startswith("unknown")
    if np.lib.NumpyVersion(np.__version__) >= "1.26.0":
        assert np.show_config(mode="dicts")["Build Dependencies"]["blas"]["name"] in found


def test_the_student_library_holds_every_students_code_and_the_steps_run_on_it(tmp_path) -> None:
    library = student_library.student_library(tmp_path)
    modules = installed_modules(library / "tinytrain")
    assert sorted(modules) == sorted(path.stem for path in student_library.SOLUTIONS.glob("[0-9][0-9]_*.py"))
    for module in modules.values():
        assert module.targets and module.exported == module.targets, f"{module.name}: {module.targets}"
    probe = ("import json, sys; sys.path.insert(0, sys.argv[1]); import _timing, student_library; "
             "step = student_library.build(sys.argv[2], 'mlp'); import tinytrain; "
             "print(json.dumps([tinytrain.__file__] + [step() for _ in range(3)]))")
    ran = subprocess.run([sys.executable, "-c", probe, str(Path(student_library.__file__).parent), str(library)],
                         capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    where, *losses = json.loads(ran.stdout)
    assert Path(where).is_relative_to(library)
    reference = mlp_step.build("tinytrain")
    np.testing.assert_allclose(losses, [reference() for _ in range(3)], rtol=1e-4, atol=1e-5)
