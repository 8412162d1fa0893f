"""Module 08 (data): a student's solutions, written from the lesson alone."""


class TensorDataset:
    def __init__(self, *arrays):
        if not arrays:
            raise ValueError("TensorDataset needs at least one array")
        arrays = tuple(_host_array(a) for a in arrays)
        for number, a in enumerate(arrays):
            if a.ndim == 0:
                raise ValueError(f"array {number} is a scalar (shape {a.shape}): it has no first dimension")
        lengths = [len(a) for a in arrays]
        if any(n != lengths[0] for n in lengths):
            raise ValueError(f"all arrays must have the same first dimension, got lengths {lengths}")
        self.arrays = arrays

    def __getitem__(self, index):
        if isinstance(index, Tensor):  # an index tensor, maybe on another device: its values, on the host
            index = index.numpy()
        return tuple(a[index] for a in self.arrays)


def batch_indices(order, batch_size, drop_last=False):
    batches = [order[start:start + batch_size] for start in range(0, len(order), batch_size)]
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    return batches


def collate(samples):
    if isinstance(samples[0], (tuple, list)):
        return tuple(np.stack([_host_array(field) for field in fields]) for fields in zip(*samples))
    return np.stack([_host_array(sample) for sample in samples])


class DataLoader:
    def __len__(self):
        n = len(self.dataset)
        if self.drop_last:
            return n // self.batch_size
        return (n + self.batch_size - 1) // self.batch_size

    def _epoch_order(self):
        n = len(self.dataset)
        if self.shuffle:
            return self.generator.permutation(n).astype(np.int64)
        return np.arange(n, dtype=np.int64)

    def _fetch(self, indices):
        if hasattr(self.dataset, "__getitems__"):
            batch = self.dataset.__getitems__(indices)
        else:
            batch = collate([self.dataset[int(i)] for i in indices])
        if isinstance(batch, (tuple, list)):
            return tuple(self._tensor(array) for array in batch)
        return self._tensor(batch)


class TokenWindows:
    def __len__(self):
        last_start = len(self.tokens) - self.context - 1  # the last target is the token after the window
        return last_start // self.stride + 1

    def __getitems__(self, indices):
        starts = np.asarray(indices) * self.stride
        positions = starts.reshape(-1, 1) + np.arange(self.context).reshape(1, -1)
        return self.tokens[positions], self.tokens[positions + 1]
