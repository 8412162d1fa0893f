"""Process-wide settings and services of the library, hand-written (not part of a lesson).

* ``allocator``: glibc keeps freed array memory instead of returning it to the
  OS (applied by ``import tinytrain``).
* ``mpi``: the MPI world of this process (mpi4py's ``COMM_WORLD``, imported on first use).
"""
