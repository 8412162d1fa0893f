"""Several ranks on one machine without MPI: forked processes and a communicator over queues.

``run_ranks(world_size, function, *args, **kwargs)`` forks ``world_size`` processes; rank
``r`` runs ``function(comm, *args, **kwargs)`` with a :class:`ForkedComm` of rank ``r``, and the
return values come back as a list in rank order (they must pickle). Tests and
graded checks use it to run data parallelism and ZeRO on 2, 3 or 4 ranks where
``mpirun`` is missing; ``tests/test_zero.py`` runs the same code under ``mpirun`` too,
found by :func:`find_mpirun`.

The communicator offers the part of mpi4py's buffer interface that tinytrain uses
(``Allreduce``, ``Reduce_scatter_block``, ``Allgather``, ``Gather``, ``Bcast``) and
three of its object methods (``bcast``, ``allgather``, ``Barrier``). Every collective
is one exchange: each rank sends its buffer to every other rank and computes its
result from all of them, summing in rank order (so every rank gets the same bits).
That is slow, and meant for small tests.

It also checks what MPI would leave to hang: every rank must call the same
collectives in the same order with buffers of the same shape. A rank whose
collective differs from another's raises ``RuntimeError`` naming both calls; a rank
that waits longer than ``timeout`` seconds raises naming the collective it waits in
and the ranks it waits for. An exception on any rank ends them all, and
``run_ranks`` raises ``RuntimeError`` with that rank's traceback.
"""
from __future__ import annotations

import functools
import multiprocessing
import os
import importlib.util
import queue
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np


class ForkedComm:
    """Rank ``rank`` of ``world_size`` ranks forked by :func:`run_ranks` (see the module docstring)."""

    def __init__(self, rank: int, world_size: int, inboxes: list[Any], timeout: float) -> None:
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self._inboxes = inboxes  # one queue per rank: what the others sent it
        self._calls = 0  # collectives this rank has entered
        self._early: dict[tuple[int, int], tuple] = {}  # (call, source) -> a message of a later collective

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return self.world_size

    def _exchange(self, name: str, payload: Any, shape: tuple | None = None) -> list[Any]:
        """Send ``payload`` to every other rank in this rank's next collective ``name``; every rank's payload,
        in rank order. ``shape`` (a buffer's) must be the same on every rank."""
        self._calls += 1
        call = self._calls
        for other, inbox in enumerate(self._inboxes):
            if other != self.rank:
                inbox.put((call, self.rank, name, shape, payload))
        received = {self.rank: payload}
        deadline = time.monotonic() + self.timeout
        while len(received) < self.world_size:
            early = [key for key in self._early if key[0] == call]
            if early:
                message = self._early.pop(early[0])
            else:
                try:
                    message = self._inboxes[self.rank].get(timeout=max(deadline - time.monotonic(), 0.001))
                except queue.Empty:
                    missing = [r for r in range(self.world_size) if r not in received]
                    raise RuntimeError(f"rank {self.rank} waited {self.timeout:g} s in its collective number {call} "
                                       f"({name}) for rank(s) {missing}, which never called it: a rank that skipped "
                                       "or added a collective, or one that stopped") from None
            their_call, source, their_name, their_shape, their_payload = message
            if their_call != call:  # a rank that is ahead: its message waits for this rank's next collective
                self._early[(their_call, source)] = message
                continue
            if (their_name, their_shape) != (name, shape):
                raise RuntimeError(f"collective number {call} differs between ranks: rank {self.rank} called "
                                   f"{name}{'' if shape is None else f' with shape {shape}'}, rank {source} called "
                                   f"{their_name}{'' if their_shape is None else f' with shape {their_shape}'}")
            received[source] = their_payload
        return [received[r] for r in range(self.world_size)]

    def _buffers(self, name: str, send: Any) -> list[np.ndarray]:
        send = np.array(send, copy=True)
        return self._exchange(name, send, send.shape)

    def Allreduce(self, send: Any, receive: Any, op: Any = None) -> None:
        """``receive`` = the sum of every rank's ``send`` (``op`` is always the sum here)."""
        receive[...] = functools.reduce(np.add, self._buffers("Allreduce", send))

    def Reduce_scatter_block(self, send: Any, receive: Any, op: Any = None) -> None:
        """``receive`` = block ``rank`` of the sum of every rank's ``send`` (cut into ``world_size`` equal blocks)."""
        total = functools.reduce(np.add, self._buffers("Reduce_scatter_block", send)).reshape(-1)
        if total.size % self.world_size or total.size // self.world_size != np.size(receive):
            raise ValueError(f"Reduce_scatter_block: a send buffer of {total.size} numbers is {self.world_size} "
                             f"blocks of {total.size / self.world_size:g}, the receive buffer holds {np.size(receive)}")
        block = total.size // self.world_size
        receive[...] = total[self.rank * block:(self.rank + 1) * block].reshape(np.shape(receive))

    def Allgather(self, send: Any, receive: Any) -> None:
        """``receive`` = every rank's ``send``, one after the other in rank order."""
        receive[...] = np.concatenate([part.reshape(-1) for part in self._buffers("Allgather", send)]
                                      ).reshape(np.shape(receive))

    def Gather(self, send: Any, receive: Any, root: int = 0) -> None:
        """On ``root``, ``receive`` = every rank's ``send`` in rank order; elsewhere ``receive`` may be None."""
        parts = self._buffers("Gather", send)
        if self.rank == root:
            receive[...] = np.concatenate([part.reshape(-1) for part in parts]).reshape(np.shape(receive))

    def Bcast(self, buffer: Any, root: int = 0) -> None:
        """``buffer`` = ``root``'s ``buffer``, on every rank."""
        parts = self._exchange("Bcast", np.array(buffer, copy=True) if self.rank == root else None,
                               np.shape(buffer))
        buffer[...] = parts[root]

    def bcast(self, value: Any, root: int = 0) -> Any:
        return self._exchange("bcast", value if self.rank == root else None)[root]

    def allgather(self, value: Any) -> list[Any]:
        return self._exchange("allgather", value)

    def Barrier(self) -> None:
        self._exchange("Barrier", None)


def _rank_main(rank: int, world_size: int, inboxes: list[Any], results: Any, timeout: float,
               function: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    """A forked rank's life: run ``function``, send its result (or traceback), flush the queues, exit.

    The exit waits for the queues to deliver what the rank sent: every message belongs to
    a collective its receiver waits in, so each is read. ``os._exit`` skips the cleanup
    the parent registered (pytest's, say), which is the parent's to run.
    """
    try:
        try:
            value = function(ForkedComm(rank, world_size, inboxes, timeout), *args, **kwargs)
            results.put((rank, True, value))
        except BaseException:  # noqa: BLE001 - every failure goes back to the parent, which raises it
            results.put((rank, False, traceback.format_exc()))
        for messages in (*inboxes, results):
            messages.close()
            messages.join_thread()
    finally:
        os._exit(0)


def _ended(pids: dict[int, int]) -> dict[int, int]:
    """The ranks among ``pids`` (rank -> process id) whose processes have ended: rank -> exit code
    (negative: the signal that ended it). They are reaped, and so removed from ``pids``."""
    ended = {}
    for rank, pid in list(pids.items()):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            ended[rank] = os.waitstatus_to_exitcode(status)
            del pids[rank]
    return ended


def run_ranks(world_size: int, function: Callable[..., Any], *args: Any, timeout: float = 60.0,
              **kwargs: Any) -> list[Any]:
    """``[function(comm_of_rank_r, *args, **kwargs) for r in range(world_size)]``, each rank in a forked process.

    Plain ``os.fork``: it works inside multiprocessing's daemonic workers too, which may not
    start children of their own (``tinytrain mutants`` grades in such workers). Raises
    ``RuntimeError`` with the traceback of the first rank that fails (the others are
    killed), naming a rank whose process ended without a result (a SIGKILL, say), or when
    the ranks have not all finished ``2 * timeout + 5`` seconds after the last result came
    (a rank's own ``timeout`` in a collective should have ended it first).
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"run_ranks needs a world_size >= 1, got {world_size!r}")
    context = multiprocessing.get_context("fork")  # queues whose pipes and locks the forked ranks share
    inboxes = [context.Queue() for _ in range(world_size)]
    results = context.Queue()
    pids: dict[int, int] = {}  # rank -> process id, until reaped
    finished: dict[int, Any] = {}
    try:
        for rank in range(world_size):
            pid = os.fork()
            if pid == 0:
                _rank_main(rank, world_size, inboxes, results, timeout, function, args, kwargs)
            pids[rank] = pid
        deadline = time.monotonic() + 2 * timeout + 5
        while len(finished) < world_size:
            if _collect(results, finished, world_size, wait=0.2):
                deadline = time.monotonic() + 2 * timeout + 5
                continue
            for rank, code in _ended(pids).items():
                while rank not in finished and _collect(results, finished, world_size, wait=0.5):
                    pass  # a rank's last result may still be on its way as it exits
                if rank not in finished:
                    how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
                    raise RuntimeError(f"rank {rank} of {world_size} ended without a result ({how})")
            if time.monotonic() > deadline:
                missing = [r for r in range(world_size) if r not in finished]
                raise RuntimeError(f"rank(s) {missing} of {world_size} did not finish within {2 * timeout + 5:g} s")
    finally:
        for pid in pids.values():
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        for messages in (*inboxes, results):
            messages.close()
    return [finished[rank] for rank in range(world_size)]


def _collect(results: Any, finished: dict[int, Any], world_size: int, wait: float) -> bool:
    """Take one result within ``wait`` seconds into ``finished`` (raising a rank's failure); whether one came."""
    try:
        rank, ok, value = results.get(timeout=wait)
    except queue.Empty:
        return False
    if not ok:
        raise RuntimeError(f"rank {rank} of {world_size} failed:\n{value}")
    finished[rank] = value
    return True


def find_mpirun() -> str | None:
    """The command that launches MPI ranks -- ``mpirun`` or ``mpiexec`` on the PATH, or the ``mpirun`` that
    pip's ``mpich`` wheel puts beside the Python executable -- or None when it or ``mpi4py`` is missing
    (``pip install mpi4py mpich`` installs both)."""
    if importlib.util.find_spec("mpi4py") is None:
        return None
    beside_python = Path(sys.executable).parent / "mpirun"
    return shutil.which("mpirun") or shutil.which("mpiexec") or (str(beside_python) if beside_python.exists() else None)
