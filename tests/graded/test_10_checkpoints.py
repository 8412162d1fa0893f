"""Graded checks for Module 10 (checkpoints), run against the student's own code.

Checkpoint files (plain data, atomic writes, the safe unpickler, random states),
the trainer's complete state (``Resumable``, laid in front of the package's
``Trainer``) and the callbacks' decisions come from the ``student`` fixture.
The checks pin down what the shortcuts get wrong: a value lost on the way to
plain data, a half-written file, an unpickler that runs code, a generator left
out, and a resumed run that is not bit-identical.
"""
import io
import os
import pickle
import random
import re
import stat
import warnings
from types import SimpleNamespace

import numpy as np

import tinytrain as tt
from tinytrain import nn, optim
from tinytrain.course.checks import check, expect_equal, expect_raises
from tinytrain.data import DataLoader, TensorDataset

RNG = np.random.default_rng(0)
X = RNG.standard_normal((256, 6)).astype(np.float32)
Y = RNG.integers(0, 3, 256)
TOY = TensorDataset(X[:100], Y[:100])


def files_in(folder):
    return sorted(p.name for p in folder.iterdir())


# -- checkpoint files ---------------------------------------------------------------------------

@check(points=1, hint="to_plain: keep None/bool/int/float/str (exact types), NumPy scalars (np.float64 and np.str_ "
                      "too, subclasses of float and str) -> .item(), tensors and "
                      "device arrays -> host NumPy arrays, tuples -> lists, recurse into dicts (str/int keys) and "
                      "lists; anything else raises CheckpointError naming the path, e.g. ['model']['layer']")
def test_to_plain(student, monkeypatch):
    state = {"w": tt.ones(2, 2), "step": np.int64(3), "betas": (0.9, 0.999), "ok": True,
             "nested": {0: [np.float32(0.5), None, "text"]}, "strict": tt.ones(3, device="strict"),
             "array": np.arange(3), "device_array": tt.tensor([1.0, 2.0], device="strict").data}
    plain = student.to_plain(state)
    expect_equal((type(state["betas"]).__name__, type(state["w"]).__name__, type(state["nested"][0][0]).__name__),
                 ("tuple", "Tensor", "float32"), "the types of the state's 'betas', 'w' and nested value after "
                 "to_plain(state) (the state itself is left as it was)")
    shapes = {key: (type(plain[key]).__name__, np.shape(plain[key]))
              for key in ("w", "strict", "array", "device_array")}
    expect_equal(shapes, {"w": ("ndarray", (2, 2)), "strict": ("ndarray", (3,)), "array": ("ndarray", (3,)),
                          "device_array": ("ndarray", (2,))},
                 "to_plain of a tensor, a tensor on 'strict', a NumPy array and a raw 'strict' device array: "
                 "(type, shape) -- all NumPy arrays on the host")
    expect_equal(plain["device_array"], np.array([1.0, 2.0], np.float32), "to_plain of a 'strict' device array")
    expect_equal(plain["strict"], np.ones(3, np.float32), "to_plain of a tensor on 'strict'")
    expect_equal((plain["step"], type(plain["step"]).__name__), (3, "int"), "to_plain(np.int64(3)): (value, type)")
    expect_equal(plain["betas"], [0.9, 0.999], "to_plain of the tuple (0.9, 0.999)")
    expect_equal(plain["nested"], {0: [0.5, None, "text"]}, "to_plain of {0: [np.float32(0.5), None, 'text']}")
    expect_equal(type(plain["nested"][0][0]).__name__, "float", "the type of to_plain(np.float32(0.5))")
    expect_equal((plain["ok"], type(plain["ok"]).__name__), (True, "bool"), "to_plain(True): (value, type)")
    subclasses = student.to_plain({"f": np.float64(0.25), "s": np.str_("x"), "b": np.bool_(False)})
    expect_equal({key: (value, type(value).__name__) for key, value in subclasses.items()},
                 {"f": (0.25, "float"), "s": ("x", "str"), "b": (False, "bool")},
                 "to_plain of np.float64(0.25), np.str_('x') and np.bool_(False): (value, type) -- np.float64 and "
                 "np.str_ are subclasses of float and str, but their pickles name NumPy classes")
    expect_equal(plain["array"], np.arange(3), "to_plain(np.arange(3))")
    pickle.loads(pickle.dumps(plain))  # plain data pickles without naming any class of ours
    for bad, where in (({"model": {"layer": object()}}, "['model']['layer']"),
                       ({"a": [1, {2, 3}]}, "['a'][1]"),
                       ({"a": np.array([object()], dtype=object)}, "['a']")):
        expect_raises(student.CheckpointError, lambda: student.to_plain(bad), f"to_plain({bad!r})", mentions=(where,))
    expect_raises(student.CheckpointError, lambda: student.to_plain({"a": {(1, 2): 0.5}}),
                  "to_plain({'a': {(1, 2): 0.5}}), a dict key that is neither str nor int",
                  mentions=("['a']", "(1, 2)"))
    expect_raises(student.CheckpointError, lambda: student.to_plain({"a": {0.5: 1}}),
                  "to_plain({'a': {0.5: 1}}), a float dict key", mentions=("['a']", "0.5"))
    for scalar in (np.complex128(1j), np.datetime64("2026-01-01")):
        expect_raises(student.CheckpointError, lambda: student.to_plain({"c": scalar}),
                      f"to_plain({{'c': {scalar!r}}}) (its .item() is not plain data)", mentions=("['c']",))

    import tinytrain.backend as registry

    monkeypatch.setattr(registry, "_BACKENDS", {})  # a fresh process that has made no tensor yet
    fresh = student.to_plain({"numpy": np.arange(4.0), "n": [np.int32(2)]})
    expect_equal(fresh["numpy"], np.arange(4.0), "to_plain of a NumPy array before any backend is loaded "
                                                 "(a NumPy array is plain data whatever backends exist)")
    expect_equal(fresh["n"], [2], "to_plain([np.int32(2)]) before any backend is loaded")


@check(points=1, hint="atomic_write: write into the given temporary file (open(temporary, 'xb')), flush and os.fsync "
                      "it, then os.replace it over the target; on any exception (even KeyboardInterrupt) delete the "
                      "temporary file if it still exists and re-raise that exception")
def test_atomic_write(student, tmp_path, monkeypatch):
    target = tmp_path / "state.bin"
    written_into = []
    student.atomic_write(target, lambda f: written_into.append(str(f.name)) or f.write(b"old"))
    expect_equal(target.read_bytes(), b"old", "the file after atomic_write of b'old'")
    inodes = []
    student.atomic_write(target, lambda f: inodes.append(os.fstat(f.fileno()).st_ino) or f.write(b"old"))
    assert os.stat(target).st_ino == inodes[0], (
        "atomic_write: expected the target to BE the temporary file, renamed over it with os.replace (one step that "
        "cannot leave it half-written), got another file (a copy of it: a copy empties the target first)")
    assert re.fullmatch(re.escape(str(tmp_path / ".state.bin.")) + "[0-9a-f]{12}\\.tmp", written_into[0]), \
        f"the file atomic_write(.../state.bin) writes into: expected the given temporary file, " \
        f"{tmp_path}/.state.bin.<12 hex digits>.tmp (a later save removes those a killed process left), " \
        f"got {written_into[0]}"

    def crash_halfway(file):
        file.write(b"new, but only ha")
        raise KeyboardInterrupt("the machine went away")

    expect_raises(KeyboardInterrupt, lambda: student.atomic_write(target, crash_halfway),
                  "atomic_write whose write raises KeyboardInterrupt halfway")
    expect_equal(target.read_bytes(), b"old", "the file after an interrupted write (the old one)")
    expect_equal(files_in(tmp_path), ["state.bin"], "the folder after an interrupted write (no temporary file)")

    def vanish(file):  # the temporary file is gone before the error: the cleanup must not hide the error
        file.write(b"new")
        os.remove(file.name)
        raise ValueError("the disk went away")

    expect_raises(ValueError, lambda: student.atomic_write(target, vanish),
                  "atomic_write whose write raises ValueError after its temporary file was removed (the error of "
                  "write must propagate, not one from deleting the temporary file)", mentions=("disk went away",))
    expect_equal((target.read_bytes(), files_in(tmp_path)), (b"old", ["state.bin"]),
                 "(the file, the folder) after that failed write")

    real_fsync = os.fsync
    synced = []

    def recording_fsync(fd):
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode):  # the directory's fsync (given code) is not recorded
            synced.append((info.st_size, target.read_bytes()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    student.atomic_write(target, lambda f: f.write(b"brand new"))
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert synced, "atomic_write of b'brand new': expected os.fsync of the temporary file, it was never called"
    assert (len(b"brand new"), b"old") in synced, \
        f"os.fsync during atomic_write of b'brand new': expected an fsync of a file holding its 9 bytes while the " \
        f"target still held b'old' (flush, then fsync, then os.replace); got (bytes in the file, the target's " \
        f"contents) at each fsync: {synced}"
    expect_equal((target.read_bytes(), files_in(tmp_path)), (b"brand new", ["state.bin"]),
                 "(the file, the folder) after atomic_write of b'brand new'")
    student.atomic_write(tmp_path / "other.bin", lambda f: f.write(b"x"))
    expect_equal((tmp_path / "other.bin").read_bytes(), b"x", "a new file written by atomic_write")


class Payload:
    def __init__(self, folder):
        self.folder = folder

    def __reduce__(self):  # what a malicious file does: "call os.mkdir(...)" while loading
        return (os.mkdir, (str(self.folder / "pwned"),))


@check(points=2, hint="SafeUnpickler.find_class: return only what self.allowed maps (module, name) to, and raise "
                      "CheckpointError naming module.name for anything else, before anything runs")
def test_safe_unpickler(student, tmp_path):
    evil = pickle.dumps({"model": Payload(tmp_path)})
    expect_raises(student.CheckpointError, lambda: student.SafeUnpickler(io.BytesIO(evil)).load(),
                  "SafeUnpickler of a pickle that calls os.mkdir", mentions=("mkdir",))
    assert not (tmp_path / "pwned").exists(), "nothing from the file may run: expected no folder 'pwned', it was made"
    (tmp_path / "evil.ckpt").write_bytes(evil)
    expect_raises(student.CheckpointError, lambda: student.read_checkpoint(tmp_path / "evil.ckpt"),
                  "read_checkpoint of a file that calls os.mkdir")
    assert not (tmp_path / "pwned").exists(), "read_checkpoint ran code from the file: the folder 'pwned' was made"
    for name, what in ((b"cbuiltins\neval\n", "eval"), (b"cos\nsystem\n", "system"),
                       (b"cnumpy.testing._private.utils\nrunstring\n", "runstring"),  # NumPy has exec, too
                       (b"cnumpy\nsave\n", "save")):  # an allowed module, a name not allowed
        expect_raises(student.CheckpointError, lambda: student.SafeUnpickler(io.BytesIO(b"\x80\x02" + name + b".")).load(),
                      f"SafeUnpickler of a pickle that names {name.decode().split()}", mentions=(what,))
    data = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "i": np.arange(3), "b": np.array([True, False]),
            "n": [1, 2.5, "x", None, {"k": (1, 2)}]}
    for protocol in (4, 5):
        loaded = student.SafeUnpickler(io.BytesIO(pickle.dumps(data, protocol=protocol))).load()
        for key in ("w", "i", "b"):
            expect_equal(loaded[key], data[key], f"array {key!r} through SafeUnpickler (protocol {protocol})")
            expect_equal(loaded[key].dtype, data[key].dtype, f"the dtype of array {key!r} (protocol {protocol})")
        expect_equal(loaded["n"], [1, 2.5, "x", None, {"k": (1, 2)}], f"plain data (protocol {protocol})")
    objects = pickle.dumps(np.array([None, 1.5], dtype=object))
    expect_raises(student.CheckpointError, lambda: student.SafeUnpickler(io.BytesIO(objects)).load(),
                  "SafeUnpickler of an array of dtype object (self.allowed's versions refuse it)", mentions=("object",))


@check(points=1, hint="capture_rng_state must save Python's random, NumPy's global generator and every loaded "
                      "backend's rng_state(); restore_rng_state sets them all back (the file turns Python's "
                      "state tuples into lists: convert them back)",
       after="test_to_plain")
def test_rng_state_round_trip(student, tmp_path):
    tt.manual_seed(1)
    tt.randn(3, device="strict")  # the strict backend is loaded, so its generator counts too
    np.random.standard_normal()  # NumPy's global generator holds a cached Gaussian now
    random.gauss(0.0, 1.0)  # and Python's its gauss_next
    captured = student.capture_rng_state()
    expect_equal({"cpu", "strict:0"} - set(captured["backends"]), set(),
                 "device names missing from capture_rng_state()['backends'] (each saved under backend.device)")
    student.write_checkpoint(tmp_path / "rng.ckpt", {"rng": captured})
    expected = (random.random(), np.random.standard_normal(), np.random.rand(), tt.randn(4).numpy(),
                tt.randn(4, device="strict").numpy(), random.gauss(0.0, 1.0))
    tt.manual_seed(123)  # scramble everything
    random.random(), np.random.rand()
    state = student.read_checkpoint(tmp_path / "rng.ckpt")["rng"]
    try:
        student.restore_rng_state(state)
    except TypeError as error:
        raise AssertionError(f"restore_rng_state of a state read from a file: expected it to restore, got "
                             f"TypeError: {error} (the file holds lists where random.getstate() gave tuples: "
                             f"{type(state['python']).__name__} {type(state['python'][1]).__name__})") from None
    again = (random.random(), np.random.standard_normal(), np.random.rand(), tt.randn(4).numpy(),
             tt.randn(4, device="strict").numpy(), random.gauss(0.0, 1.0))
    expect_equal(again[5], expected[5], "Python's random.gauss() after restoring (its gauss_next too)")
    expect_equal(again[0], expected[0], "Python's random.random() after restoring")
    expect_equal(again[1:3], expected[1:3], "NumPy's global generator after restoring")
    expect_equal(again[3], expected[3], "tt.randn(4) (the CPU's generator) after restoring")
    expect_equal(again[4], expected[4], "tt.randn(4, device='strict') after restoring")


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
        devices = sorted(state["backends"])
        assert "nostate:0" not in devices and "cpu" in devices, \
            f"capture_rng_state's backends: expected 'cpu' and not 'nostate:0' (its rng_state raises), got {devices}"
        categories = [w.category.__name__ for w in caught]
        assert "RuntimeWarning" in categories, \
            f"capture_rng_state with a backend that cannot report its state: expected a RuntimeWarning, got {categories}"
    finally:
        for name in [name for name in registry._BACKENDS if name.startswith("nostate")]:
            del registry._BACKENDS[name]
        del registry._FACTORIES["nostate"]
    registry.register_backend("unplugged", lambda index: (_ for _ in ()).throw(
        RuntimeError("device 'unplugged' needs a driver this machine lacks")))
    try:
        for missing, why in (("tpu:0", "ValueError"), ("unplugged:0", "RuntimeError")):
            tt.manual_seed(5)
            random.seed(5), np.random.seed(5)
            state = student.capture_rng_state()
            expected = (tt.randn(3).numpy(), random.random(), np.random.rand())
            # the device that cannot be created comes first: the others must be restored after it all the same
            state["backends"] = {missing: {"saved": "on another machine"}, **state["backends"]}
            tt.manual_seed(6)
            random.seed(6), np.random.seed(6)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                student.restore_rng_state(state)
            categories = [w.category.__name__ for w in caught]
            assert "RuntimeWarning" in categories, \
                f"restore_rng_state of a state with device {missing!r} (get_backend raises {why}): expected a " \
                f"RuntimeWarning, got {categories}"
            for name, value, want in zip(("tt.randn(3)", "random.random()", "np.random.rand()"),
                                         (tt.randn(3).numpy(), random.random(), np.random.rand()), expected):
                expect_equal(value, want, f"{name} after restoring a state whose first device {missing!r} cannot be "
                                          f"created here ({why}): every other generator is restored all the same")
    finally:
        for name in [name for name in registry._BACKENDS if name.startswith("unplugged")]:
            del registry._BACKENDS[name]
        registry._FACTORIES.pop("unplugged", None)


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
                      "masks and shuffles continue exactly",
       after=("test_to_plain", "test_atomic_write", "test_safe_unpickler", "test_rng_state_round_trip"))
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
    expect_equal(resumed.epoch, 2, "the epoch after load_checkpoint of a checkpoint saved after 2 epochs")
    resumed.fit(loader, epochs=4, progress=False)
    for (name, a), b in zip(straight.model.named_parameters(), resumed.model.parameters()):
        expect_equal(b.numpy(), a.numpy(), f"{name} after resuming at epoch 2 (bit-identical to the straight run)")
    for key in ("train_loss", "learning_rates", "grad_norm"):
        expect_equal(resumed.history[key], straight.history[key], f"history[{key!r}] of the resumed run")
    expect_equal((resumed.step, resumed.epoch), (straight.step, 4), "(step, epoch) of the resumed run")


# -- callbacks ---------------------------------------------------------------------------------

@check(points=1, hint="ModelCheckpoint keeps the keep_last newest epoch files (up to the current epoch) plus every "
                      "epoch divisible by `every` (when every is set); it deletes only the others")
def test_model_checkpoint_keeps_the_right_files(student, tmp_path):
    def fake_trainer(epoch):
        return SimpleNamespace(epoch=epoch, save_checkpoint=lambda path: open(path, "wb").close())

    for keep_last, every, expected in ((2, 3, [3, 6, 7]), (1, None, [7]), (3, 2, [2, 4, 5, 6, 7]),
                                       (10, None, [1, 2, 3, 4, 5, 6, 7])):
        directory = tmp_path / f"run-{keep_last}-{every}"
        callback = student.ModelCheckpoint(directory, keep_last=keep_last, every=every)
        callback.on_fit_begin(fake_trainer(0))
        (directory / "epoch-0009.pkl").write_bytes(b"")  # a later epoch from an interrupted run: not touched
        for epoch in range(1, 8):
            callback.on_checkpoint(fake_trainer(epoch), {})
        expect_equal(sorted(callback.epoch_files()), expected + [9],
                     f"the epoch files left after epochs 1-7 with keep_last={keep_last}, every={every} "
                     f"(and a file of epoch 9 from an earlier run)")
    spaced = student.ModelCheckpoint(tmp_path / "spaced", keep_last=2)  # files every 10 epochs (or steps)
    spaced.on_fit_begin(fake_trainer(0))
    for epoch in (10, 20, 30):
        spaced.on_checkpoint(fake_trainer(epoch), {})
    expect_equal(sorted(spaced.epoch_files()), [20, 30], "the files left after epochs 10, 20, 30 with keep_last=2 "
                                                         "(the two newest files, not epochs 29 and 30)")


def run_early_stopping(callback, values, monitor="eval_loss", model=None):
    """Feed ``values`` to ``callback.on_epoch_end`` epoch by epoch until it stops; the fake trainer."""
    trainer = SimpleNamespace(epoch=0, step=0, stop_training=False, model=nn.Linear(2, 1) if model is None else model)
    for value in values:
        trainer.epoch += 1
        trainer.step += 10
        for p in trainer.model.parameters() + trainer.model.buffers():  # this epoch's state: every value is its number
            p.data[...] = trainer.epoch
        # the Trainer's logs: the epoch's number is both logs["epoch"] and trainer.epoch
        callback.on_epoch_end(trainer, {"epoch": trainer.epoch, "step": trainer.step, monitor: value})
        if trainer.stop_training:
            break
    return trainer


@check(points=1, hint="EarlyStopping: on an improvement store best/best_epoch and reset wait to 0; otherwise "
                      "wait += 1 and once wait >= patience set trainer.stop_training = True and stopped_epoch")
def test_early_stopping(student):
    patient = student.EarlyStopping(patience=3)
    trainer = run_early_stopping(patient, [1.0, 0.8, 0.85, 0.9, 0.7, 0.75, 0.76, 0.77, 0.1])
    expect_equal((trainer.epoch, patient.stopped_epoch, patient.wait), (8, 8, 3),
                 "EarlyStopping(patience=3) on eval_loss 1.0, 0.8, 0.85, 0.9, 0.7, 0.75, 0.76, 0.77, ...: (the epoch "
                 "it stops after, stopped_epoch, wait) -- the count restarts at the improvement of epoch 5")
    expect_equal((patient.best, patient.best_epoch), (0.7, 5), "(best, best_epoch)")
    trainer = run_early_stopping(patient, [0.9, 0.8])  # a second fit with the same callback: wait counts on
    expect_equal((trainer.epoch, patient.wait, patient.stopped_epoch), (1, 4, 1),
                 "the same EarlyStopping(patience=3), already stopped, then fed 0.9, 0.8 (as a second fit would): "
                 "(epochs run, wait, stopped_epoch) -- wait is past patience, so the first epoch without an "
                 "improvement stops it")
    accuracy = student.EarlyStopping(monitor="eval_accuracy", patience=1)  # mode "auto": higher is better
    trainer = run_early_stopping(accuracy, [0.5, 0.6, 0.7, 0.8], "eval_accuracy")
    expect_equal((trainer.epoch, accuracy.stopped_epoch), (4, None),
                 "EarlyStopping(monitor='eval_accuracy', patience=1) on rising accuracies: (epochs run, stopped_epoch)")
    late = student.EarlyStopping(patience=2)  # _improves: a nan never improves, even on best = None
    trainer = run_early_stopping(late, [float("nan"), 1.0, 0.9, 0.8])
    expect_equal((trainer.epoch, late.best, late.best_epoch), (4, 0.8, 4),
                 "EarlyStopping(patience=2) on eval_loss nan, 1.0, 0.9, 0.8: (epochs run, best, best_epoch)")
    demanding = student.EarlyStopping(patience=2, min_delta=0.15)  # only drops of more than 0.15 count
    trainer = run_early_stopping(demanding, [1.0, 0.8, 0.7, 0.66])
    expect_equal((trainer.epoch, demanding.best), (4, 0.8),
                 "EarlyStopping(patience=2, min_delta=0.15) on 1.0, 0.8, 0.7, 0.66: (epochs run, best)")


@check(points=1, hint="EarlyStopping(restore_best=True): on every improvement keep a copy of the weights, "
                      "self._best_weights = trainer.model.state_dict(), which on_fit_end puts back; without "
                      "restore_best keep none",
       after="test_early_stopping")
def test_early_stopping_restores_the_best_weights(student):
    restoring = student.EarlyStopping(patience=2, restore_best=True)
    trainer = run_early_stopping(restoring, [1.0, 0.5, 0.6, 0.4, 0.45, 0.41])
    expect_equal((trainer.epoch, restoring.best_epoch), (6, 4), "(the epoch it stops after, best_epoch)")
    restoring.on_fit_end(trainer)
    expect_equal([p.numpy().tolist() for p in trainer.model.parameters()], [[[4.0, 4.0]], [4.0]],
                 "the weights after on_fit_end of EarlyStopping(restore_best=True): those of the best epoch, 4 "
                 "(every weight of epoch e is e)")
    normed = nn.Sequential(nn.Linear(2, 1), nn.BatchNorm1d(1))
    restoring = student.EarlyStopping(patience=2, restore_best=True)
    trainer = run_early_stopping(restoring, [1.0, 0.5, 0.6, 0.4, 0.45, 0.41], model=normed)
    try:
        restoring.on_fit_end(trainer)
    except Exception as error:  # noqa: BLE001 - the message says what went wrong
        raise AssertionError(f"on_fit_end of EarlyStopping(restore_best=True) for Sequential(Linear, BatchNorm1d): "
                             f"expected the best epoch's state back, got {type(error).__name__}: {error} (keep "
                             f"trainer.model.state_dict(): parameters and buffers)") from None
    state = {name: np.asarray(value.numpy() if isinstance(value, tt.Tensor) else value).tolist()
             for name, value in normed.state_dict().items()}
    expect_equal(state, {name: np.full(np.shape(value), 4).tolist() for name, value in state.items()},
                 "the state of Sequential(Linear, BatchNorm1d) after on_fit_end: parameters AND buffers (running "
                 "statistics) of the best epoch, 4")
    best_weights = restoring.state_dict()["best_weights"]
    assert best_weights is not None, "EarlyStopping(restore_best=True).state_dict()['best_weights']: expected the " \
                                     "best epoch's weights, got None"
    plain = student.EarlyStopping(patience=2)
    trainer = run_early_stopping(plain, [1.0, 0.5, 0.6, 0.7])
    plain.on_fit_end(trainer)
    expect_equal(plain.state_dict()["best_weights"], None,
                 "EarlyStopping(restore_best=False).state_dict()['best_weights'] (no copy of the weights kept)")
    expect_equal([p.numpy().tolist() for p in trainer.model.parameters()], [[[4.0, 4.0]], [4.0]],
                 "without restore_best the weights stay those of the last epoch, 4")
