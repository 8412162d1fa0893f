"""``python -m tinytrain``: the same as the ``tinytrain`` command."""

import sys

from tinytrain.cli import main

if __name__ == "__main__":
    sys.exit(main())
