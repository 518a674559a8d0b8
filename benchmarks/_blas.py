"""BLAS thread pinning for the benchmark scripts (NumPy-free: it must run before NumPy loads)."""

from __future__ import annotations

import argparse
import os
import sys

BLAS_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
HELP = ("BLAS threads (sets OPENBLAS/OMP/MKL_NUM_THREADS; must come before NumPy is imported, so "
        "only from the command line)")


def pin_blas_threads(ap: argparse.ArgumentParser, threads: int | None) -> None:
    """Apply ``--blas-threads``; an argparse error when NumPy is already loaded."""
    if threads is None:
        return
    if "numpy" in sys.modules:
        ap.error("--blas-threads: NumPy is already imported in this process")
    for k in BLAS_ENV:
        os.environ[k] = str(threads)
