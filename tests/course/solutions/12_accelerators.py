"""Module 12 (accelerators): a student's solutions, written from the lesson alone."""


def matmul_cost(m, k, n, itemsize=4):
    flops = 2 * m * k * n
    nbytes = itemsize * (m * k + k * n + m * n)
    return flops, nbytes


def roofline_seconds(flops, nbytes, peak_flops, bandwidth, launch_seconds=0.0):
    return launch_seconds + max(flops / peak_flops, nbytes / bandwidth)


class DrawCounter:
    def next_seed(self):
        seed = draw_seed(self.seed, self.draws)
        self.draws += 1
        return seed

    def state(self):
        return {"generator": GENERATOR, "seed": self.seed, "draws": self.draws}

    def load_state(self, state):
        valid = (
            isinstance(state, dict)
            and set(state) == {"generator", "seed", "draws"}
            and state["generator"] == GENERATOR
            and all(type(state[key]) is int and state[key] >= 0 for key in ("seed", "draws"))
        )
        if not valid:
            raise ValueError(
                f"load_state expects the state of a {GENERATOR!r} stream, "
                f"{{'generator': {GENERATOR!r}, 'seed': int >= 0, 'draws': int >= 0}}; got {state!r}"
            )
        self.seed = state["seed"] % 2**64  # as DrawCounter(seed) keeps it
        self.draws = int(state["draws"])


def scatter_add(cupyx, target, index, values):
    dtype = np.dtype(target.dtype)
    if dtype == np.int64:
        if isinstance(values, (int, float, bool, np.generic)):
            values = np.int64(values)  # a number: its int64 bits, as a uint64 scalar below
        cupyx.scatter_add(target.view(np.uint64), index, values.astype(np.int64).view(np.uint64))
    elif dtype in SCATTER_ADD_DTYPES:
        cupyx.scatter_add(target, index, values)
    else:
        supported = ", ".join(str(d) for d in SCATTER_ADD_DTYPES)
        raise TypeError(f"scatter_add on a GPU supports {supported} and int64 (as uint64), not {dtype}")


class CupyBackend:
    def from_host(self, array):
        self.make_current()
        return self._cupy.asarray(array)

    def to_host(self, array):
        if not self.is_array(array):
            if isinstance(array, self._cupy.ndarray):
                got = f"an array of {array.device!r}"
            else:
                got = type(array).__name__
            raise TypeError(f"to_host of {self.device!r} takes an array of that device, got {got}")
        return self._cupy.asnumpy(array, order="A")
