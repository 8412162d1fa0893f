"""Process-wide settings the library makes for speed, hand-written (not part of a lesson).

* ``allocator``: glibc keeps freed array memory instead of returning it to the
  OS (applied by ``import tinytrain``).
"""
