"""Module 09 (training): a student's solutions, written from the lesson alone."""


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
        wide = grad.data.astype("float64")  # float32 squares overflow above 1.8e19
        squares = (wide * wide).sum()
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
