"""Test stand-ins that let CI, which has no GPU and maybe no MPI, catch what those would.

* ``strict``: device ``"strict"``, NumPy arrays that refuse what CuPy refuses
  (implicit conversion to NumPy, mixing devices);
* ``fake_cupy``: a FAKE CuPy on top of the strict device, for the CUDA backend's
  own logic (device indices, scatter-add routing, random states);
* ``ranks``: several ranks as forked processes with a communicator over queues, for
  distributed training without ``mpirun`` (and errors where MPI would hang).

Hand-written, not generated; none is a real device or MPI, and none is the student's.
"""
