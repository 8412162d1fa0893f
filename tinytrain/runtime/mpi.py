"""The MPI world of this process, shared by data parallelism (Module 13) and ZeRO (Module 18).

``world()`` is mpi4py's ``COMM_WORLD``, imported on first use so that the library
imports without MPI; where mpi4py is missing it raises an ``ImportError`` that says
what to install and how to launch. ``communicator(comm)`` is ``comm``, or the world
when ``comm`` is ``None``: every distributed class takes ``comm=None`` that way.
``broadcast(tensors, comm)`` gives every rank rank 0's values, as both strategies
do when they start.
"""
from typing import Any, Iterable

import numpy as np


def world() -> Any:
    """``mpi4py``'s ``COMM_WORLD``, or a clear error when mpi4py is missing."""
    try:
        from mpi4py import MPI
    except ImportError as error:
        raise ImportError("distributed training needs mpi4py and an MPI runtime: "
                          "pip install mpi4py mpich   (then run with: mpirun -n 2 python script.py)") from error
    return MPI.COMM_WORLD


def communicator(comm: Any) -> Any:
    """``comm``, or :func:`world` when it is ``None``."""
    return world() if comm is None else comm


def broadcast(tensors: Iterable[Any], comm: Any) -> None:
    """Give every rank rank 0's values of ``tensors`` (in place), one ``Bcast`` each through a host
    buffer: MPI reads host memory, so a device array goes through ``to_host`` and back."""
    for t in tensors:
        host = np.ascontiguousarray(t._backend.to_host(t.data))
        comm.Bcast(host, root=0)
        t.data[...] = t._backend.from_host(host)
