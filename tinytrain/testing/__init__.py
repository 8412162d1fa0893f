"""Test devices: stand-ins that let CI, which has no GPU, catch what a GPU would.

* ``strict``: device ``"strict"``, NumPy arrays that refuse what CuPy refuses
  (implicit conversion to NumPy, mixing devices);
* ``fake_cupy``: a FAKE CuPy on top of the strict device, for the CUDA backend's
  own logic (device indices, scatter-add routing, random states).

Hand-written, not generated; neither is a real device, and neither is the student's.
"""
