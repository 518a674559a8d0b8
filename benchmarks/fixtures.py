"""Hand-built fused μGraphs for the nine benchmarks: they live in the package
(``mirage_py/examples/fixtures.py``, used by ``mirage-py bench``); this module re-exports them
for code that imports ``benchmarks.fixtures``."""

from mirage_py.examples.fixtures import SM_COUNT, THREADS, hand_built  # noqa: F401

__all__ = ["SM_COUNT", "THREADS", "hand_built"]
