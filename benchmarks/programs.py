"""The nine reference benchmark programs: they live in the package
(``mirage_py/examples/programs.py``, so an installed ``mirage-py demo`` finds them); this module
re-exports them for code that imports ``benchmarks.programs``."""

from mirage_py.examples.programs import NAMES, _attention, get_inputs, get_program  # noqa: F401

__all__ = ["NAMES", "get_inputs", "get_program"]
