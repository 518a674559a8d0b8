"""Parameters that make a test too slow for the default run (``make test`` deselects the
``slow`` marker; ``make test-all`` runs everything): the largest benchmark, exp_matmul
(8 x 4096 x 4096 products), interpreted, emulated or mutated, takes 15-50 s per case on the
2-core CI machine; every other benchmark stays in the default run."""

import pytest

HEAVY = ("exp_matmul",)


def sample(values, heavy=HEAVY):
    """``values`` as pytest parameters, those in ``heavy`` (a value, or a tuple's first item)
    marked slow."""
    def key(v):
        return v[0] if isinstance(v, tuple) else v
    return [pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=pytest.mark.slow)
            if key(v) in heavy else v for v in values]
