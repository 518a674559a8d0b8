"""Shared test setup: make ``benchmarks`` (at the repository root) and the tests' helper modules
(``strategies``) importable however pytest runs."""

import os
import sys

# Single-threaded BLAS for the suite. The test matrices are small, and on a busy 2-core machine
# OpenBLAS's spinning threads made one batched float64 matmul (mha) take 10 s instead of 0.1 s.
# This only takes effect if NumPy has not been imported yet; set the variable yourself to override.
if "numpy" not in sys.modules:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for path in (ROOT, HERE):
    if path not in sys.path:
        sys.path.insert(0, path)


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _results_database(tmp_path_factory, monkeypatch):
    """superopt's results database: a fresh file per test, never the user's cache."""
    path = tmp_path_factory.mktemp("resultsdb") / "results.sqlite"
    monkeypatch.setenv("MIRAGE_PY_DATABASE", str(path))
    yield path


@pytest.fixture(scope="session")
def superopt_bs1():
    """superopt's answer for a benchmark at batch size 1 (full shapes), searched once per session
    and shared by the tests that need it: ``superopt_bs1("gqa")``."""
    import mirage_py as mp
    from benchmarks.programs import get_program

    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = mp.superopt(get_program(name, 1), target="h100", workers=2,
                                      progress=False, database=False)
        return cache[name]
    return get
