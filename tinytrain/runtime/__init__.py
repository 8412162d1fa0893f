"""Process-wide settings, state and services of the library, hand-written (not part of a lesson).

* ``allocator``: glibc keeps freed array memory instead of returning it to the
  OS (applied by ``import tinytrain``);
* ``buffers``: a cache of large arrays for the convolution kernels, switched on
  only where the allocator's settings do not hold;
* ``mpi``: the MPI world of this process (mpi4py's ``COMM_WORLD``, imported on first use);
* ``workers``: the worker processes of ``DataLoader(num_workers=N)``.
"""
