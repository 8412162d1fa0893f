"""Module 16 (profiling): a student's solutions, written from the lesson alone."""


class EventRecorder:
    def start(self, name, category, shapes=None):
        stack = self.open_events()
        parent = stack[-1] if stack else None
        event = Event(name, category, thread=threading.get_ident(), start_ns=self.clock(), parent=parent,
                      shapes=shapes)
        self.events.append(event)
        stack.append(event)
        return event

    def stop(self, event):
        stack = self.open_events()
        if not stack:
            raise RuntimeError(f"stop: event {event.name!r} is not open: no event is open in this thread")
        if stack[-1] is not event:
            raise RuntimeError(f"stop: event {event.name!r} is not the innermost open event; "
                               f"{stack[-1].name!r} is, and must stop first")
        event.end_ns = self.clock()
        stack.pop()
        if event.parent is not None:
            event.parent.children_ns += event.duration_ns
        return event


def op_flops(name, input_shapes, output_shape, backward=False):
    outputs = math.prod(output_shape)
    if name in _PRODUCTS:
        if name == "Conv2dFunction":
            k = math.prod(input_shapes[1][1:])
        else:
            k = input_shapes[0][-1]
        flops = 2 * outputs * k
        if backward:
            flops = 2 * flops
    elif name in _MOVES:
        flops = 0
    else:
        flops = max([outputs] + [math.prod(shape) for shape in input_shapes])
    return int(flops)


def key_averages(events):
    sums = {}  # name -> [count, duration_ns, self_ns, flops, nbytes], in order of first appearance
    for event in events:
        if event.name not in sums:
            sums[event.name] = [0, 0, 0, 0, 0]
        row = sums[event.name]
        row[0] += 1
        row[1] += event.duration_ns
        row[2] += event.self_ns
        row[3] += event.flops
        row[4] += event.nbytes
    rows = []
    for name, (count, total_ns, self_ns, flops, nbytes) in sums.items():
        rows.append(KeyAverage(name, count=count, cpu_time_total=total_ns / 1000,
                               self_cpu_time_total=self_ns / 1000, flops=flops, cpu_memory_usage=nbytes))
    return KeyAverages(rows)


def trace_events(events, origin_ns, pid):
    traced = []
    for event in events:
        traced.append({"name": event.name, "cat": event.category, "ph": "X",
                       "ts": (event.start_ns - origin_ns) / 1000, "dur": event.duration_ns / 1000,
                       "pid": pid, "tid": event.thread, "args": event.trace_args()})
    return traced


def mfu(flops, seconds, peak_flops):
    return flops / seconds / peak_flops


def graph_saved_bytes(output):
    # 1. every Function reachable from output._ctx through the tensors the Functions hold, each once
    functions = []
    seen = set()
    todo = [output._ctx] if output._ctx is not None else []
    while todo:
        fn = todo.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        functions.append(fn)
        for value in vars(fn).values():
            items = value if isinstance(value, (tuple, list)) else [value]
            for item in items:
                if isinstance(item, Tensor) and item._ctx is not None:
                    todo.append(item._ctx)
    # 2. the memory each one holds: leaves' memory apart, each block once
    leaf_keys = set()
    held = {}  # memory key -> the array that owns that memory
    for fn in functions:
        if not hasattr(fn, "backend"):  # its backward has run: it holds nothing
            continue
        for value in vars(fn).values():
            items = value if isinstance(value, (tuple, list)) else [value]
            for item in items:
                if isinstance(item, Tensor):
                    owner, key = memory_owner(item.data)
                    if item._ctx is None:
                        leaf_keys.add(key)
                    else:
                        held[key] = owner
                elif fn.backend.is_array(item):
                    owner, key = memory_owner(item)
                    held[key] = owner
    return sum(owner.nbytes for key, owner in held.items() if key not in leaf_keys)


def median_interval(samples, confidence=0.95):
    n = len(samples)
    ordered = sorted(samples)
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2)
    spread = z * math.sqrt(n)
    j = math.floor((n - spread) / 2)
    k = math.ceil(1 + (n + spread) / 2)
    j = max(j, 1)
    k = min(k, n)
    return statistics.median(ordered), ordered[j - 1], ordered[k - 1]
