"""Fast paths that the library's reference solutions call, hand-written (not part of a lesson).

* ``winograd``: Winograd's F(2x2, 3x3) for 3x3 convolutions with many channels, on
  the CPU (Module 11's ``Conv2dFunction``, explained in its section 8).
"""
