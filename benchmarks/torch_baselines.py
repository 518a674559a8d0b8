"""PyTorch baselines and CUDA-event timing: they live in the package
(``mirage_py/examples/torch_baselines.py``); this module re-exports them."""

from mirage_py.examples.torch_baselines import (copy_bandwidth, rel_err, sdpa_fn,  # noqa: F401
                                                time_cuda, torch_fn)
