"""Graded checks for Module 10 (checkpoints), run against the student's own code.

Checkpoint files (plain data, atomic writes, the safe unpickler, random states),
the trainer's complete state (``Resumable``, laid in front of the package's
``Trainer``) and the callbacks' decisions come from the ``student`` fixture.
The checks pin down what the shortcuts get wrong: a value lost on the way to
plain data, a half-written file, an unpickler that runs code, a generator left
out, and a resumed run that is not bit-identical.
"""
import os
import pickle
import random
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

import tinytrain as tt
from tinytrain import nn, optim
from tinytrain.course.checks import check
from tinytrain.data import DataLoader, TensorDataset

RNG = np.random.default_rng(0)
X = RNG.standard_normal((256, 6)).astype(np.float32)
Y = RNG.integers(0, 3, 256)
TOY = TensorDataset(X[:100], Y[:100])


# -- checkpoint files ---------------------------------------------------------------------------

@check(points=1, hint="to_plain: keep None/bool/int/float/str (exact types), NumPy scalars -> .item(), tensors and "
                      "device arrays -> host NumPy arrays, tuples -> lists, recurse into dicts (str/int keys) and "
                      "lists; anything else raises CheckpointError naming the path, e.g. ['model']['layer']")
def test_to_plain(student):
    plain = student.to_plain({"w": tt.ones(2, 2), "step": np.int64(3), "betas": (0.9, 0.999), "ok": True,
                              "nested": {0: [np.float32(0.5), None, "text"]}, "strict": tt.ones(3, device="strict"),
                              "array": np.arange(3)})
    assert isinstance(plain["w"], np.ndarray) and plain["w"].shape == (2, 2)
    assert plain["step"] == 3 and type(plain["step"]) is int and plain["betas"] == [0.9, 0.999]
    assert plain["nested"] == {0: [0.5, None, "text"]} and type(plain["nested"][0][0]) is float
    assert type(plain["strict"]) is np.ndarray and plain["strict"].tolist() == [1.0, 1.0, 1.0], \
        "device arrays come to the host"
    assert plain["ok"] is True and np.array_equal(plain["array"], np.arange(3))
    pickle.loads(pickle.dumps(plain))  # plain data pickles without naming any class of ours
    for bad, where in (({"model": {"layer": object()}}, "['model']['layer']"),
                       ({"a": [1, {2, 3}]}, "['a'][1]"),
                       ({"a": np.array([object()], dtype=object)}, "['a']")):
        with pytest.raises(student.CheckpointError) as error:
            student.to_plain(bad)
        assert where in str(error.value), error.value


@check(points=1, hint="atomic_write: write into the temporary file, flush and os.fsync it, then os.replace it over "
                      "the target; on any exception (even KeyboardInterrupt) delete the temporary file and re-raise")
def test_atomic_write(student, tmp_path):
    target = tmp_path / "state.bin"
    student.atomic_write(target, lambda f: f.write(b"old"))
    assert target.read_bytes() == b"old"

    def crash_halfway(file):
        file.write(b"new, but only ha")
        raise KeyboardInterrupt("the machine went away")

    with pytest.raises(KeyboardInterrupt):
        student.atomic_write(target, crash_halfway)
    assert target.read_bytes() == b"old", "an interrupted write must leave the old file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.bin"], "and no temporary file behind"
    student.atomic_write(target, lambda f: f.write(b"new"))
    assert target.read_bytes() == b"new" and sorted(p.name for p in tmp_path.iterdir()) == ["state.bin"]
    student.atomic_write(tmp_path / "other.bin", lambda f: f.write(b"x"))
    assert (tmp_path / "other.bin").read_bytes() == b"x"


class Payload:
    def __init__(self, folder):
        self.folder = folder

    def __reduce__(self):  # what a malicious file does: "call os.mkdir(...)" while loading
        return (os.mkdir, (str(self.folder / "pwned"),))


@check(points=2, hint="SafeUnpickler.find_class: return only what self.allowed maps (module, name) to, and raise "
                      "CheckpointError naming module.name for anything else, before anything runs")
def test_safe_unpickler(student, tmp_path):
    evil = pickle.dumps({"model": Payload(tmp_path)})
    with pytest.raises(student.CheckpointError) as error:
        student.SafeUnpickler(__import__("io").BytesIO(evil)).load()
    assert "mkdir" in str(error.value), error.value
    assert not (tmp_path / "pwned").exists(), "nothing from the file may run"
    (tmp_path / "evil.ckpt").write_bytes(evil)
    with pytest.raises(student.CheckpointError):
        student.read_checkpoint(tmp_path / "evil.ckpt")
    assert not (tmp_path / "pwned").exists()
    for name in (b"cbuiltins\neval\n", b"cos\nsystem\n"):
        with pytest.raises(student.CheckpointError):
            student.SafeUnpickler(__import__("io").BytesIO(b"\x80\x02" + name + b".")).load()
    data = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "i": np.arange(3), "b": np.array([True, False]),
            "n": [1, 2.5, "x", None, {"k": (1, 2)}]}
    for protocol in (4, 5):
        loaded = student.SafeUnpickler(__import__("io").BytesIO(pickle.dumps(data, protocol=protocol))).load()
        assert all(np.array_equal(loaded[k], data[k]) and loaded[k].dtype == data[k].dtype for k in ("w", "i", "b"))
        assert loaded["n"] == [1, 2.5, "x", None, {"k": (1, 2)}], protocol


@check(points=1, hint="capture_rng_state must save Python's random, NumPy's global generator and every loaded "
                      "backend's rng_state(); restore_rng_state sets them all back (the file turns Python's "
                      "state tuples into lists: convert them back)")
def test_rng_state_round_trip(student, tmp_path):
    tt.manual_seed(1)
    tt.randn(3, device="strict")  # the strict backend is loaded, so its generator counts too
    student.write_checkpoint(tmp_path / "rng.ckpt", {"rng": student.capture_rng_state()})
    expected = (random.random(), np.random.rand(), tt.randn(4).numpy(), tt.randn(4, device="strict").numpy())
    tt.manual_seed(123)  # scramble everything
    random.random(), np.random.rand()
    student.restore_rng_state(student.read_checkpoint(tmp_path / "rng.ckpt")["rng"])
    again = (random.random(), np.random.rand(), tt.randn(4).numpy(), tt.randn(4, device="strict").numpy())
    assert expected[:2] == again[:2], "Python's and NumPy's generators"
    assert np.array_equal(expected[2], again[2]) and np.array_equal(expected[3], again[3]), "tinytrain's generators"


@check(points=1, hint="capture_rng_state leaves out (with a RuntimeWarning) a backend whose rng_state() raises "
                      "NotImplementedError; restore_rng_state skips (with a RuntimeWarning) a device get_backend "
                      "cannot create here, and restores the rest")
def test_rng_states_of_devices_that_cannot_take_part(student):
    import tinytrain.backend as registry

    class NoState(registry.NumpyBackend):
        kind = "nostate"

        def rng_state(self):
            raise NotImplementedError("this device cannot report its generator's state")

    tt.register_backend("nostate", NoState)
    try:
        tt.get_backend("nostate")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            state = student.capture_rng_state()
        assert "nostate:0" not in state["backends"] and "cpu" in state["backends"], sorted(state["backends"])
        assert any(issubclass(w.category, RuntimeWarning) for w in caught), "capture_rng_state: no RuntimeWarning"
    finally:
        for name in [name for name in registry._BACKENDS if name.startswith("nostate")]:
            del registry._BACKENDS[name]
        del registry._FACTORIES["nostate"]
    tt.manual_seed(5)
    state = student.capture_rng_state()
    expected = tt.randn(3).numpy()
    state["backends"]["tpu:0"] = {"saved": "on a machine with a TPU"}
    tt.manual_seed(6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        student.restore_rng_state(state)
    assert any(issubclass(w.category, RuntimeWarning) for w in caught), "restore_rng_state: no RuntimeWarning for tpu:0"
    np.testing.assert_array_equal(tt.randn(3).numpy(), expected, err_msg="the CPU's generator is restored all the same")


def student_trainer(student):
    """The package's Trainer, saving and loading with the student's ``Resumable``."""
    if issubclass(tt.Trainer, student.Resumable):  # the package's own (installed) code is graded
        return tt.Trainer
    return type("Trainer", (student.Resumable, tt.Trainer), {})


def resumable_run(student):
    Trainer = student_trainer(student)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))
    trainer = Trainer(model, optim.Adam(model.parameters(), lr=0.01), nn.CrossEntropyLoss(),
                      scheduler=tt.CosineSchedule(0.01, 0.001, total_epochs=4), grad_clip_norm=5.0)
    return trainer, DataLoader(TOY, batch_size=16, shuffle=True)


@check(points=3, hint="exact resume needs the checkpoint to hold everything: to_plain must keep every value, and "
                      "capture/restore_rng_state every generator (Python, NumPy, each tinytrain backend) so dropout "
                      "masks and shuffles continue exactly")
def test_exact_resume(student, tmp_path):
    tt.manual_seed(0)
    straight, loader = resumable_run(student)
    straight.fit(loader, epochs=4, progress=False)

    tt.manual_seed(0)
    first_half, loader = resumable_run(student)
    first_half.fit(loader, epochs=2, progress=False)
    first_half.save_checkpoint(tmp_path / "half.ckpt")
    del first_half, loader

    tt.manual_seed(999)  # a different start: everything must come from the file
    random.seed(999), np.random.seed(999)
    resumed, loader = resumable_run(student)
    resumed.load_checkpoint(tmp_path / "half.ckpt")
    assert resumed.epoch == 2
    resumed.fit(loader, epochs=4, progress=False)
    for a, b in zip(straight.model.parameters(), resumed.model.parameters()):
        assert np.array_equal(a.numpy(), b.numpy()), "resumed weights must be bit-identical to the straight run"
    for key in ("train_loss", "learning_rates", "grad_norm"):
        assert resumed.history[key] == straight.history[key], key
    assert resumed.step == straight.step and resumed.epoch == 4


# -- callbacks ---------------------------------------------------------------------------------

@check(points=1, hint="ModelCheckpoint keeps the keep_last newest epoch files (up to the current epoch) plus every "
                      "epoch divisible by `every` (when every is set); it deletes only the others")
def test_model_checkpoint_keeps_the_right_files(student, tmp_path):
    def fake_trainer(epoch):
        return SimpleNamespace(epoch=epoch, save_checkpoint=lambda path: open(path, "wb").close())

    for keep_last, every, expected in ((2, 3, [3, 6, 7]), (1, None, [7]), (3, 2, [2, 4, 5, 6, 7]), (10, None,
                                                                                                  [1, 2, 3, 4, 5, 6, 7])):
        directory = tmp_path / f"run-{keep_last}-{every}"
        callback = student.ModelCheckpoint(directory, keep_last=keep_last, every=every)
        callback.on_fit_begin(None)
        (directory / "epoch-0009.pkl").write_bytes(b"")  # a later epoch from an interrupted run: not touched
        for epoch in range(1, 8):
            callback.on_checkpoint(fake_trainer(epoch), {})
        assert sorted(callback.epoch_files()) == expected + [9], (keep_last, every, sorted(callback.epoch_files()))


@check(points=1, hint="EarlyStopping: on an improvement store best/best_epoch and reset wait to 0; otherwise "
                      "wait += 1 and once wait >= patience set trainer.stop_training = True and stopped_epoch")
def test_early_stopping(student):
    def run(callback, values, monitor="eval_loss"):
        trainer = SimpleNamespace(epoch=0, stop_training=False, model=nn.Linear(2, 1))
        for value in values:
            trainer.epoch += 1
            callback.on_epoch_end(trainer, {monitor: value})
            if trainer.stop_training:
                break
        return trainer

    patient = student.EarlyStopping(patience=3)
    trainer = run(patient, [1.0, 0.8, 0.85, 0.9, 0.7, 0.75, 0.76, 0.77, 0.1])
    assert trainer.epoch == 8 and patient.stopped_epoch == 8, "reset the count on an improvement (epoch 5)"
    assert patient.best == 0.7 and patient.best_epoch == 5
    accuracy = student.EarlyStopping(monitor="eval_accuracy", patience=1)  # mode "auto": higher is better
    assert run(accuracy, [0.5, 0.6, 0.7, 0.8], "eval_accuracy").epoch == 4 and accuracy.stopped_epoch is None
    demanding = student.EarlyStopping(patience=2, min_delta=0.15)  # only drops of more than 0.15 count
    assert run(demanding, [1.0, 0.8, 0.7, 0.66]).epoch == 4 and demanding.best == 0.8
