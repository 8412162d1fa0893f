"""Module 08 (training): a student's solutions, written from the lesson alone."""


class CosineSchedule:
    def get_lr(self, epoch):
        warmup, total = self.warmup_epochs, self.total_epochs
        if epoch < warmup:
            return self.max_lr * (epoch + 1) / (warmup + 1)
        if epoch >= total:
            return self.min_lr
        progress = (epoch - warmup) / (total - warmup)
        return self.min_lr + (self.max_lr - self.min_lr) / 2 * (1 + math.cos(math.pi * progress))


class CosineWarmRestarts:
    def get_lr(self, epoch):
        start, length = 0, self.first_cycle
        while epoch >= start + length:  # walk to the cycle that contains the epoch
            start += length
            length *= self.cycle_mult
        t = epoch - start
        return self.min_lr + (self.max_lr - self.min_lr) / 2 * (1 + math.cos(math.pi * t / length))


def clip_grad_norm(parameters, max_norm=1.0, error_if_nonfinite=False):
    partial = {}  # device -> sum of squares, still on that device
    for grad in grads:
        squares = (grad.data * grad.data).sum()
        partial[grad.device] = squares if grad.device not in partial else partial[grad.device] + squares
    norm = math.sqrt(sum(float(value) for value in partial.values()))
    if not math.isfinite(norm):
        if error_if_nonfinite:
            raise FloatingPointError(
                f"the global gradient norm is {norm} (over {len(grads)} gradients): some gradient overflowed; "
                "the gradients were left unclipped"
            )
        return norm
    if norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for grad in grads:
            grad.data *= scale
    return norm


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


class Trainer:
    def _clip_and_step(self, parameters, loss, norms):
        if not math.isfinite(loss):
            return self._skip(f"the window's loss is {loss}")
        if self.grad_clip_norm is not None:
            norm = clip_grad_norm(parameters, self.grad_clip_norm)
            if not math.isfinite(norm):
                return self._skip(f"the gradient norm is {norm}")
            norms.append(norm)
        self.optimizer.step()
        self.step += 1
        return True

    def _accumulate(self, window, parameters):
        for parameter in parameters:
            parameter.grad = None
        n = sum(len(inputs) for inputs, _ in window)
        total = None  # the window's summed loss, kept on the device
        for inputs, targets in window:
            loss, is_mean = self._batch_loss(inputs, targets)
            n_b = len(inputs)
            (loss * (n_b / n if is_mean else 1 / n)).backward()
            summed = loss.detach() * n_b if is_mean else loss.detach()
            total = summed if total is None else total + summed
        return float(total.item())

    def evaluate(self, dataloader):
        loss_sum = correct = None
        samples, classifier = 0, True
        with no_grad():
            for batch in dataloader:
                inputs, targets = _pair(batch)
                outputs = self.model(inputs)
                loss, is_mean = self._reduce(self.loss_fn(outputs, targets))
                n = len(inputs)
                summed = loss * n if is_mean else loss
                loss_sum = summed if loss_sum is None else loss_sum + summed
                samples += n
                hits = _correct(outputs, targets) if classifier else None
                if hits is None:
                    classifier = False
                else:
                    correct = hits if correct is None else correct + hits
        if samples == 0:
            raise ValueError("evaluate: the data loader yielded no batches")
        mean_loss = float(loss_sum.item()) / samples
        accuracy = float(correct.item()) / samples if classifier and correct is not None else math.nan
        return mean_loss, accuracy


def memory_report(model, optimizer):
    report = {
        "parameters": _array_bytes(parameters),
        "gradients": _array_bytes([p.grad for p in parameters if p.grad is not None]),
        "optimizer_state": _array_bytes(optimizer.state_dict()),
    }


class ModelCheckpoint:
    def _prune(self, current):
        keep = set(sorted(epochs)[-self.keep_last:])
        if self.every is not None:
            keep.update(epoch for epoch in epochs if epoch % self.every == 0)


class EarlyStopping:
    def on_epoch_end(self, trainer, logs):
        if _improves(value, self.best, self.mode, self.min_delta):
            self.best, self.best_epoch, self.wait = value, trainer.epoch, 0
            if self.restore_best:
                self._best_weights = trainer.model.state_dict()
        else:
            self.wait += 1
            if self.wait >= self.patience:
                self.stopped_epoch = trainer.epoch
                trainer.stop_training = True
