"""Process-wide settings and state the library keeps for speed, hand-written (not part of a lesson).

* ``allocator``: glibc keeps freed array memory instead of returning it to the
  OS (applied by ``import tinytrain``);
* ``buffers``: a cache of large arrays for the convolution kernels, switched on
  only where the allocator's settings do not hold.
"""
