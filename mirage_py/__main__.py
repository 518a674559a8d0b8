"""``python -m mirage_py ...`` is the ``mirage-py`` command line (see :mod:`mirage_py.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
