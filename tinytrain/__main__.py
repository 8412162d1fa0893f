"""``python -m tinytrain``: the same as the ``tinytrain`` command."""

import sys

from tinytrain.course.cli import main

if __name__ == "__main__":
    sys.exit(main())
