"""Fast paths that the library's reference solutions call, hand-written (not part of a lesson).

* ``convolution``: the convolution on NumPy that Module 11's ``Conv2dFunction``
  hands its layers to (``fast_path``): im2col in cache-sized parts of the batch,
  col2im along whole rows, the bias as a row of ones;
* ``winograd``: Winograd's F(2x2, 3x3) for 3x3 convolutions with many channels, on
  the CPU (one of ``convolution``'s kernels);
* ``parts``: a batch cut into parts that fit the processor's caches (the
  convolution's and Module 11's max pooling's);
* ``reductions``: sums, means and dot products over an array's last axes as
  matrix-vector products and ``vecdot`` (Module 05's ``Normalize``, Module 14's
  ``MaskedSoftmax``);
* ``softmax``: a softmax's exponentials, with one stabilising shift for a whole
  array where that is safe (Module 14's ``MaskedSoftmax``).

Module 11, section 8, explains and measures the first three; Modules 05 and 14 the last two.
"""
