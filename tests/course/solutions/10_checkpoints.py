"""Module 10 (checkpoints): a student's solutions, written from the lesson alone."""


def to_plain(value, where="state"):
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [to_plain(item, f"{where}[{index}]") for index, item in enumerate(value)]
    if isinstance(value, dict):
        plain = {}
        for key, item in value.items():
            if not isinstance(key, (str, int, np.integer)):
                raise CheckpointError(
                    f"{where} has a key {key!r} of type {type(key).__name__}: "
                    "checkpoint dicts need str or int keys"
                )
            plain[to_plain(key, where)] = to_plain(item, f"{where}[{key!r}]")
        return plain
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise CheckpointError(f"{where} is an array of dtype {value.dtype}, which holds Python objects: "
                                  "not plain data")
        return np.asarray(value)
    if isinstance(value, Tensor):
        return value.numpy()
    backend = backend_of_array(value)
    if backend is not None:
        return np.array(backend.to_host(value), copy=True)
    raise CheckpointError(
        f"{where} is a {type(value).__module__}.{type(value).__qualname__}, which is not plain data "
        "(None, bool, int, float, str, list, tuple, dict, NumPy array, tensor or device array)"
    )


def atomic_write(path, write):
    try:
        with open(temporary, "xb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            temporary.unlink(missing_ok=True)
        except OSError:
            pass
        raise


class SafeUnpickler:
    def find_class(self, module, name):
        found = self.allowed.get((module, name))
        if found is None:
            raise CheckpointError(
                f"refusing to load {module}.{name}: a checkpoint holds plain data and NumPy arrays only, "
                "and this file would call or build something else"
            )
        return found


def capture_rng_state():
    backends = {}
    for backend in loaded_backends():
        try:
            state = backend.rng_state()
        except NotImplementedError as error:
            state = None
            reason = f" ({error})" if str(error) else ""
        else:
            reason = ""
        if state is None:
            warnings.warn(
                f"cannot save the random state of device {backend.device!r}{reason}: "
                "a run resumed from this checkpoint will not be bit-identical",
                RuntimeWarning, stacklevel=2,
            )
            continue
        backends[backend.device] = state
    return {"python": random.getstate(), "numpy": np.random.get_state(legacy=False), "backends": backends}


def restore_rng_state(state):
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    np.random.set_state(state["numpy"])
    for device, backend_state in state["backends"].items():
        try:
            backend = get_backend(device)
        except (ValueError, ImportError, RuntimeError) as error:
            warnings.warn(f"cannot restore the random state of device {device!r} here: {error}",
                          RuntimeWarning, stacklevel=2)
            continue
        backend.set_rng_state(backend_state)


class ModelCheckpoint:
    def _prune(self, current):
        keep = set(sorted(epochs)[-self.keep_last:])
        if self.every is not None:
            keep.update(epoch for epoch in epochs if epoch % self.every == 0)


class EarlyStopping:
    def on_epoch_end(self, trainer, logs):
        if _improves(value, self.best, self.mode, self.min_delta):
            self.best, self.best_epoch, self.wait = value, logs["epoch"], 0
            if self.restore_best:
                self._best_weights = trainer.model.state_dict()
        else:
            self.wait += 1
            if self.wait >= self.patience:
                self.stopped_epoch = logs["epoch"]
                trainer.stop_training = True
