"""Worker processes that gather a DataLoader's batches in parallel and hand them back in order.

Hand-written, not part of a lesson: Module 08's ``DataLoader(num_workers=N)`` gives
its batches' sample indices to a :class:`WorkerPool` instead of gathering them itself.

How the work is shared. Batch ``k`` of an epoch goes to worker ``k % N``, and at
most ``PREFETCH`` batches per worker are in flight: gathering runs ahead of
training by a few batches, never by an epoch (memory stays bounded). Results come
back in whatever order the workers finish; the pool keeps the early ones until
their turn, so the main process sees batch 0, 1, 2, ... exactly as a loader without
workers would.

Why the batches are equal to ``num_workers=0``'s. The sample order is drawn in the
main process, by the loader's own generator, before any batch is handed out; a
worker only gathers the indices it is given, with the loader's own code. Randomness
*inside* a sample (augmentation) must come from a generator derived from the sample
(see ``tinytrain.datasets.transforms``), not from whichever process reads it.

Seeding. Each worker seeds Python's ``random``, NumPy's global generator and
tinytrain's generators with ``worker_seed(seed, epoch, worker_id)`` when it starts,
then calls ``worker_init_fn(worker_id)``: code in a dataset that draws from those
generators gets a different, reproducible stream in every worker (with the same
numbers of workers and the same seed), never N copies of one stream.

Errors. An exception while gathering a batch is caught in the worker, which reads
the batch's samples one at a time to find the first that fails, and sends the
exception's type, message and traceback back; the main process raises it there,
naming the sample index, the batch and the worker. A worker that dies (killed,
out of memory) is reported with its exit code instead of hanging the loop.

Processes never outlive their use: :meth:`WorkerPool.close` stops and joins them
(killing any that do not stop), the loader calls it at the end of each epoch (or,
with ``persistent_workers``, when it is garbage-collected), the workers are daemons
(they end with the main process), and a worker whose parent died exits by itself.
"""
import multiprocessing
import multiprocessing.connection
import os
import pickle
import random
import time
import traceback
from typing import Any, Callable, Iterator, Sequence

import numpy as np

PREFETCH = 2  # batches in flight per worker (PyTorch's prefetch_factor)
_POLL_SECONDS = 0.5  # how often a waiting process checks that the other side is alive
_STOP_SECONDS = 5.0  # how long close() waits for a worker to stop before killing it


def worker_seed(seed: int, epoch: int, worker_id: int) -> int:
    """The seed of worker ``worker_id`` started for ``epoch`` by a loader seeded with ``seed``.

    ``SeedSequence([seed, epoch, worker_id])`` hashes the three numbers into
    independent streams: workers of one epoch, and one worker in two epochs, never
    share a stream, and the same three numbers always give the same seed.
    """
    return int(np.random.SeedSequence([seed, epoch, worker_id]).generate_state(1, np.uint32)[0])


def _seed_this_process(seed: int) -> None:
    # tinytrain.backend loads only here, in the worker: the pool itself is plain multiprocessing.
    from tinytrain.backend import manual_seed

    random.seed(seed)
    np.random.seed(seed)
    manual_seed(seed)


def _failing_sample(gather: Callable[[np.ndarray, int], Any], indices: np.ndarray, epoch: int) -> int | None:
    """The first of ``indices`` whose batch of one fails to gather, or None when each alone works."""
    for index in indices:
        try:
            gather(np.asarray([index]), epoch)
        except Exception:
            return int(index)
    return None


def _report(error: BaseException, worker_id: int, batch: int | None, sample: int | None) -> dict:
    """What the main process needs to raise ``error`` again: called in its ``except`` block (for the traceback)."""
    kind: type | None = type(error)
    try:
        pickle.dumps(kind)
    except Exception:  # a class defined inside a function cannot travel; its name can
        kind = None
    return {"type": kind, "type_name": type(error).__qualname__, "message": str(error),
            "traceback": traceback.format_exc(), "worker": worker_id, "batch": batch, "sample": sample}


def _work(gather: Callable[[np.ndarray, int], Any], worker_id: int, seed: int,
          init_fn: Callable[[int], None] | None, tasks: Any, results: Any, parent: int) -> None:
    """A worker's life: seed, run ``init_fn``, then gather each task's batch until told to stop.

    ``tasks`` and ``results`` are this worker's ends of two pipes. ``send`` pickles
    the whole message before writing a byte, so a batch that cannot be pickled is
    reported like any other error instead of vanishing.
    """
    try:
        _seed_this_process(seed)
        if init_fn is not None:
            init_fn(worker_id)
    except Exception as error:
        results.send((None, None, _report(error, worker_id, None, None)))
        return
    while True:
        if not tasks.poll(_POLL_SECONDS):
            if os.getppid() != parent:  # the main process died: nobody will read what this worker makes
                return
            continue
        task = tasks.recv()
        if task is None:
            return
        ticket, batch, epoch, indices = task
        try:
            results.send((ticket, gather(indices, epoch), None))
        except Exception as error:
            report = _report(error, worker_id, batch, None)
            report["sample"] = _failing_sample(gather, indices, epoch)
            results.send((ticket, None, report))


def _raise(report: dict) -> None:
    """Raise a worker's exception in this process, with where it happened in front of its message."""
    if report["batch"] is None:
        where = f"DataLoader worker {report['worker']} failed to start (worker_init_fn or seeding)"
    elif report["sample"] is None:
        where = f"DataLoader worker {report['worker']} failed on batch {report['batch']} (each sample alone reads)"
    else:
        where = f"DataLoader worker {report['worker']} failed on sample {report['sample']} (batch {report['batch']})"
    message = f"{where}: {report['message']}\n\nThe worker's traceback:\n{report['traceback']}"
    try:
        error = report["type"](message)
    except Exception:  # a class that did not travel, or whose constructor needs other arguments
        error = RuntimeError(f"{report['type_name']}: {message}")
    raise error


def _start_method() -> str:
    # fork: the workers inherit the dataset and the loader as they are, classes defined in a
    # notebook included (spawn would have to pickle them and import them by name).
    return "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


class WorkerPool:
    """``num_workers`` processes that run ``gather(indices, epoch)`` on batches of sample indices.

    ``gather`` returns a batch made of NumPy arrays (it is pickled back to this
    process); ``seed`` and ``epoch`` seed the workers (:func:`worker_seed`),
    ``init_fn(worker_id)`` runs in each worker after seeding. :meth:`batches` hands
    out the gathered batches in order; :meth:`close` stops the processes.
    """

    def __init__(self, gather: Callable[[np.ndarray, int], Any], num_workers: int, seed: int, epoch: int,
                 init_fn: Callable[[int], None] | None = None) -> None:
        context = multiprocessing.get_context(_start_method())
        task_pipes = [context.Pipe(duplex=False) for _ in range(num_workers)]  # (reader, writer) each
        result_pipes = [context.Pipe(duplex=False) for _ in range(num_workers)]
        self._tasks = [writer for _, writer in task_pipes]
        self._results = [reader for reader, _ in result_pipes]
        self._processes = [
            context.Process(target=_work, name=f"tinytrain DataLoader worker {worker_id}", daemon=True,
                            args=(gather, worker_id, worker_seed(seed, epoch, worker_id), init_fn,
                                  task_pipes[worker_id][0], result_pipes[worker_id][1], os.getpid()))
            for worker_id in range(num_workers)
        ]
        for process in self._processes:
            process.start()
        for (task_reader, _), (_, result_writer) in zip(task_pipes, result_pipes):
            task_reader.close()  # the workers' ends: this process keeps only its own
            result_writer.close()
        self.pids = [process.pid for process in self._processes]
        self._next_ticket = 0  # tickets number the tasks of every call, so a stale call's results are known

    def batches(self, index_batches: Sequence[np.ndarray], first: int, epoch: int) -> Iterator[Any]:
        """The gathered batches ``index_batches[first:]``, in order.

        Results of an earlier, abandoned call (a loop left early on persistent
        workers) that arrive now are dropped.
        """
        if not self._processes:
            raise RuntimeError("this WorkerPool is closed")
        numbers = range(first, len(index_batches))
        base = self._next_ticket
        self._next_ticket += len(numbers)
        sent = 0
        arrived: dict[int, Any] = {}

        def send() -> None:
            nonlocal sent
            number = numbers[sent]
            self._tasks[(base + sent) % len(self._tasks)].send((base + sent, number, epoch, index_batches[number]))
            sent += 1

        while sent < min(len(numbers), PREFETCH * len(self._tasks)):
            send()
        for offset in range(len(numbers)):
            while base + offset not in arrived:
                ticket, batch, report = self._receive()
                if ticket is not None and ticket < base:
                    continue  # an abandoned call's batch
                if report is not None:
                    self.close()
                    _raise(report)
                arrived[ticket] = batch
            if sent < len(numbers):
                send()
            yield arrived.pop(base + offset)

    def _receive(self) -> tuple:
        """The next message of any worker; a worker that died without one is an error."""
        while True:
            sentinels = {process.sentinel: number for number, process in enumerate(self._processes)}
            ready = multiprocessing.connection.wait([*self._results, *sentinels], timeout=_POLL_SECONDS)
            for channel in ready:
                if channel in self._results:
                    try:
                        return channel.recv()
                    except EOFError:  # its worker is gone: its sentinel says so, next round at the latest
                        pass
            dead = [number for sentinel, number in sentinels.items() if sentinel in ready]
            if dead and not any(self._results[number].poll() for number in dead):
                for number in dead:  # its sentinel fired: reap it, so that its exit code is known
                    self._processes[number].join(timeout=5)
                codes = [(number, self._processes[number].exitcode) for number in dead]
                self.close()
                raise RuntimeError("DataLoader worker(s) exited unexpectedly: "
                                   + ", ".join(f"worker {number} with exit code {code}" for number, code in codes))

    def close(self) -> None:
        """Stop every worker and wait for it; a worker that does not stop in time is killed. Idempotent."""
        processes, self._processes = self._processes, []
        for tasks, process in zip(self._tasks, processes):
            try:
                tasks.send(None)
            except OSError:  # BrokenPipeError: that worker is gone already
                pass
        for results, process in zip(self._results, processes):
            # A worker blocked sending a batch nobody wants stops only once it is read: read while waiting.
            deadline = time.monotonic() + _STOP_SECONDS
            while process.is_alive() and time.monotonic() < deadline:
                if results.poll(0.05):
                    try:
                        results.recv()
                    except EOFError:
                        break
            process.join(timeout=max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()
        for channel in (*self._tasks, *self._results):
            channel.close()
        self._tasks, self._results = [], []
