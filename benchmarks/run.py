"""The benchmark suite, from a checkout: ``python -m benchmarks.run [options]`` is
``mirage-py bench [options]`` (``mirage_py/examples/bench.py``) writing into
``benchmarks/results`` by default::

    python -m benchmarks.run                      # everything
    python -m benchmarks.run --names gqa lora --bs 1 --workers 2
"""

from __future__ import annotations

import os
import sys

from mirage_py.examples.bench import markdown, measure_gpu, run_one  # noqa: F401

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def main(argv: list[str] | None = None) -> int:
    from mirage_py.examples.bench import main as bench_main
    return bench_main(argv, prog="python -m benchmarks.run", default_out=RESULTS)


if __name__ == "__main__":
    sys.exit(main())
