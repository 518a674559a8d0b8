"""Example programs shipped with the package, so that ``mirage-py demo`` and ``mirage-py bench``
work from any directory after a plain ``pip install``.

* ``programs``: the nine reference benchmark programs (``NAMES``, ``get_program(name, bs)``,
  ``get_inputs(name, bs)``), the demo's programs;
* ``fixtures``: hand-built fused μGraphs for them (``hand_built(name, bs)``), the expert fusions
  the benchmark table compares against;
* ``bench``: the benchmark runner behind ``mirage-py bench`` (and ``python -m benchmarks.run``);
* ``torch_baselines``: PyTorch eager / ``torch.compile`` / SDPA baselines for GPU runs;
* ``measure``: the measuring core every GPU benchmark path shares (check against eager and
  float64, time per call and as a CUDA-graph replay; dry on the CPU).

The repository's ``benchmarks/programs.py``, ``fixtures.py``, ``run.py`` and
``torch_baselines.py`` re-export these modules.
"""

from .programs import NAMES, get_inputs, get_program

__all__ = ["NAMES", "get_inputs", "get_program"]
