"""The course tooling: everything that serves the course rather than training models.

Hand-written, but for the copies in ``recipes/``; none of it comes from a lesson and none of it is the
student's.

* ``cli``: the ``tinytrain`` command (``python -m tinytrain``)
* ``build``: library files and student notebooks from ``modules/``, recipe copies from ``milestones/``
* ``markers``: the comment above each library function that is the student's
* ``inventory``: which teaching module each library file belongs to, and whose code it holds
* ``notebooks``: reading a notebook's export cells
* ``overlay``: running a notebook's code as modules laid over the package
* ``checks``: the ``@check`` decorator of the graded checks
* ``grading``: running graded checks and reporting points
* ``export``: a notebook's code into the package, and the reference back
* ``imports``: which names one exported file needs from its siblings
* ``doctor``: ``tinytrain doctor``, the installation checks
* ``gpu``: the GPU part of ``doctor`` (the CuPy wheel, the driver, a kernel on ``cuda:0``)
* ``milestones``: what the milestone recipes (``milestones/*.py``) share -- options, output folder, resuming,
  result -- and the runner of ``tinytrain milestone``
* ``recipes/``: copies of the milestone recipes that ``tinytrain build`` makes, for an installed package

The command starts without importing the library (``cli`` and the modules it
imports load library code only inside the functions that need it; ``milestones``
is imported when a milestone runs), so a student's broken export cannot take the
command that repairs it (``tinytrain reset``) down with it.
"""
