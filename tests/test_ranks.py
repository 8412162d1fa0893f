"""The forked ranks of ``tinytrain.testing.ranks``: MPI's collectives without MPI, and the mistakes
(mismatched or missing collectives, a failing rank) that MPI would leave to hang, as errors."""
import numpy as np
import pytest

from tinytrain.testing.ranks import run_ranks


def collectives(comm):
    rank, size = comm.Get_rank(), comm.Get_size()
    summed = np.empty(4, np.float32)
    comm.Allreduce(np.full(4, rank + 1, np.float32), summed)
    block = np.empty(2, np.float64)
    comm.Reduce_scatter_block(np.arange(2 * size, dtype=np.float64) * (rank + 1), block)
    gathered = np.empty((size, 3), np.uint16)
    comm.Allgather(np.full(3, rank, np.uint16), gathered)
    rooted = np.empty(size, np.float32) if rank == 1 else None
    comm.Gather(np.array([rank * 10], np.float32), rooted, root=1)
    shared = np.arange(3.0) if rank == 2 else np.zeros(3)
    comm.Bcast(shared, root=2)
    comm.Barrier()
    return summed, block, gathered, rooted, shared, comm.bcast(f"from {rank}", root=1), comm.allgather(rank * rank)


def test_the_collectives_compute_what_mpi_computes():
    results = run_ranks(3, collectives)
    triangle = 1 + 2 + 3
    for rank, (summed, block, gathered, rooted, shared, message, squares) in enumerate(results):
        assert summed.tolist() == [triangle] * 4 and summed.dtype == np.float32
        assert block.tolist() == [triangle * 2 * rank, triangle * (2 * rank + 1)]
        assert gathered.tolist() == [[0] * 3, [1] * 3, [2] * 3] and gathered.dtype == np.uint16
        assert rooted is None if rank != 1 else rooted.tolist() == [0, 10, 20]
        assert shared.tolist() == [0.0, 1.0, 2.0] and message == "from 1" and squares == [0, 1, 4]


def test_a_rank_that_calls_another_collective_is_named():
    def mismatched(comm):
        buffer = np.zeros(2)
        if comm.Get_rank() == 0:
            comm.Allreduce(np.ones(2), buffer)
        else:
            comm.Allgather(np.ones(1), buffer)

    with pytest.raises(RuntimeError, match=r"collective number 1 differs between ranks: rank \d called "
                                           r"(Allreduce|Allgather) with shape \(\d,\), rank \d called"):
        run_ranks(2, mismatched)


def test_buffers_of_different_shapes_are_a_mismatch():
    def ragged(comm):
        comm.Allreduce(np.ones(2 + comm.Get_rank()), np.empty(2 + comm.Get_rank()))

    with pytest.raises(RuntimeError, match=r"rank 0 called Allreduce with shape \(2,\), rank 1 called Allreduce "
                                           r"with shape \(3,\)|rank 1 called Allreduce with shape \(3,\), rank 0"):
        run_ranks(2, ragged)


def test_a_rank_that_skips_a_collective_times_out_naming_it():
    def skipping(comm):
        if comm.Get_rank() == 0:
            comm.Barrier()

    with pytest.raises(RuntimeError, match=r"rank 0 waited 1 s in its collective number 1 \(Barrier\) for "
                                           r"rank\(s\) \[1\]"):
        run_ranks(2, skipping, timeout=1.0)


def test_a_failing_rank_stops_the_others_with_its_traceback():
    def failing(comm):
        if comm.Get_rank() == 1:
            raise ValueError("rank one's own error")
        comm.Barrier()  # would wait for rank 1 forever

    with pytest.raises(RuntimeError, match=r"(?s)rank 1 of 2 failed:.*ValueError: rank one's own error"):
        run_ranks(2, failing, timeout=30.0)


def test_one_rank_is_the_function_itself():
    assert run_ranks(1, lambda comm, x: (comm.Get_rank(), comm.Get_size(), x * 2), 21) == [(0, 1, 42)]
    with pytest.raises(ValueError, match="world_size >= 1, got 0"):
        run_ranks(0, print)


def test_a_rank_killed_without_a_result_is_named():
    import os
    import signal

    def killed(comm):
        if comm.Get_rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return comm.Get_rank()

    with pytest.raises(RuntimeError, match=r"rank 1 of 2 ended without a result \(killed by signal 9\)"):
        run_ranks(2, killed, timeout=30.0)


def _ranks_in_a_worker(world_size):
    return run_ranks(world_size, lambda comm: comm.allgather(comm.Get_rank()))


def test_ranks_start_inside_a_daemonic_worker():
    """tinytrain mutants grades in multiprocessing's daemonic workers, which may not start Process children."""
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.map(_ranks_in_a_worker, [2]) == [[[0, 1], [0, 1]]]
