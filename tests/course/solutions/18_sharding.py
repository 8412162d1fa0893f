"""Module 18 (sharding): a student's solutions, written from the lesson alone."""


def zero_memory(num_parameters, world_size, stage, state_arrays=2):
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0 (DataParallel), 1, 2 or 3, got {stage!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size!r}")
    psi, ranks, k = float(num_parameters), float(world_size), state_arrays
    if stage == 0:
        parameters, gradients, optimizer_state = 4 * psi, 4 * psi, 4 * k * psi
    else:
        optimizer_state = 4 * (k + 1) * psi / ranks  # the float32 master shard and its k state arrays
        gradients = 4 * psi + 4 * psi / ranks if stage == 1 else 4 * psi / ranks
        parameters = 0.0 if stage == 3 else 4 * psi
    return {"parameters": float(parameters), "gradients": float(gradients),
            "optimizer_state": float(optimizer_state),
            "total": float(parameters + gradients + optimizer_state)}


class Bucket:
    def flatten(self, arrays):
        if len(arrays) != len(self.params):
            raise ValueError(f"flatten: {len(arrays)} arrays for a bucket of {len(self.params)} parameters")
        vector = np.zeros(self.padded, dtype=self.dtype)
        offset = 0
        for array, size in zip(arrays, self.sizes):
            if array is not None:
                # reshape(-1) reads in C (row by row) order whatever the memory order
                vector[offset:offset + size] = np.asarray(array).reshape(-1)
            offset += size
        return vector

    def unflatten(self, vector):
        parts, offset = [], 0
        for shape, size in zip(self.shapes, self.sizes):
            parts.append(vector[offset:offset + size].reshape(shape))
            offset += size
        return parts


def reduce_scatter(bucket, comm):
    arrays = [None if param.grad is None else param.grad._backend.to_host(param.grad.data)
              for param in bucket.params]
    send = bucket.flatten(arrays)  # a new vector in the bucket's dtype (float32 for float16 gradients)
    receive = np.empty(bucket.shard_size, dtype=bucket.dtype)
    comm.Reduce_scatter_block(send, receive)  # the sum over the ranks, this rank's block
    receive /= comm.Get_size()
    return receive


def all_gather(bucket, shard, comm):
    shard = np.ascontiguousarray(shard)
    receive = np.empty(bucket.padded, dtype=shard.dtype)
    raw = f"u{shard.itemsize}"  # a gather only moves bytes
    comm.Allgather(shard.view(raw), receive.view(raw))
    return receive


def global_norm_and_flags(gradients, flags, comm):
    squares = 0.0
    for grad in gradients:
        if grad is None:
            continue
        backend = grad._backend
        flat = grad.data.ravel(order="K")
        total = float(backend.to_host(backend.xp.vdot(flat, flat)))
        if math.isinf(total):  # float32 squares overflow above about 1.8e19: again in float64
            wide = flat.astype(np.float64)
            total = float(backend.to_host(backend.xp.vdot(wide, wide)))
        squares += total
    send = np.array([squares, *flags], dtype=np.float64)
    receive = np.empty_like(send)
    comm.Allreduce(send, receive)
    return math.sqrt(float(receive[0])), [float(value) for value in receive[1:]]


class ZeRO:
    def gather_parameters(self, buckets):
        for bucket in buckets:
            shard = self.state_backend.to_host(bucket.master.data)
            if self.compute_dtype is not None:
                shard = shard.astype(self.compute_dtype)
            full = all_gather(bucket, shard, self.comm)
            for param, part in zip(bucket.params, bucket.unflatten(full)):
                if self.orders[id(param)] == "F":
                    part = np.asfortranarray(part)
                param.data = self.backend.from_host(part)

    def reduce_gradients(self, buckets):
        for bucket in buckets:
            shard = self.state_backend.from_host(reduce_scatter(bucket, self.comm))
            master = bucket.master
            if bucket.accumulating and master.grad is not None:
                master.grad.data += shard  # another micro-batch of the same step
            else:
                master.grad = Tensor._make(shard, self.state_backend)
            bucket.accumulating = True
            if self.stage >= 2:
                for param in bucket.params:
                    param.grad = None

    def take_step(self, trainer, parameters, loss, norms):
        try:
            self.check_model(parameters)
            self.reduce_gradients([bucket for bucket in self.buckets if not bucket.accumulating])
            masters = [bucket.master for bucket in self.buckets]
            scaler = None if self.precision is None else getattr(self.precision, "scaler", None)
            overflow = False
            if self.precision is not None:
                self.precision.restore_masters()
                if scaler is not None:
                    overflow = scaler.unscale_(masters)
            gradients = [master.grad for master in masters if master.grad is not None]
            flags = [0.0 if math.isfinite(loss) else 1.0, 1.0 if overflow else 0.0]
            norm, (bad_ranks, overflowed_ranks) = global_norm_and_flags(gradients, flags, self.comm)
            if scaler is not None:
                self.precision.update_scale(overflowed_ranks > 0)
            self.nonfinite_ranks = round(bad_ranks)
            if not trainer._plugins_allow(loss, self.nonfinite_ranks, overflowed_ranks == 0):
                return False
            if trainer.grad_clip_norm is not None:
                if not math.isfinite(norm):
                    return trainer._skip(f"the gradient norm is {norm}")
                norms.append(norm)
                if norm > trainer.grad_clip_norm:
                    scale = trainer.grad_clip_norm / (norm + 1e-6)
                    for grad in gradients:
                        grad.data *= scale
            self.optimizer.step()
            trainer.step += 1
            return True
        finally:
            for bucket in self.buckets:
                bucket.accumulating = False
            if self.stage == 3:
                self.release_model_parameters()
