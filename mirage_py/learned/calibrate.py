"""Calibrate the analytic model's eager pricing on measured records.

The analytic model prices a record as eager PyTorch runs it (:func:`mirage_py.eager.eager_time`
with :class:`~mirage_py.eager.EagerConstants`). Calibration fits those constants -- bandwidth
efficiency (all kernels, and more for reducing ones), cuBLAS and cuDNN efficiency, the launch
cost's scale and the host's time per call and per launch -- to the training records, minimising
the squared log error (``scipy.optimize.least_squares``, robust ``soft_l1`` loss, parameters in
log space so they stay positive). One set of constants serves every GPU: each multiplies the
target's own figures.
"""

from __future__ import annotations

import math
from dataclasses import fields

import numpy as np

from ..eager import DEFAULT, EagerConstants, eager_time
from ..errors import LearnedModelError
from .records import Record

BOUNDS = {"mem_eff": (0.2, 2.0), "reduce_mem_eff": (0.1, 2.0), "gemm_eff": (0.1, 2.0),
          "conv_eff": (0.02, 2.0), "launch_scale": (0.2, 5.0), "host_kernel_us": (0.5, 50.0),
          "host_call_us": (0.05, 20.0)}


def predict_us(record: Record, c: EagerConstants = DEFAULT) -> float:
    """The (calibrated, with ``c``) analytic model's eager time of a record, microseconds."""
    return eager_time(list(record.kernels), record.calls, record.target, c).us


def calibrate(records: list[Record], start: EagerConstants = DEFAULT) -> EagerConstants:
    """Constants that fit ``records`` best (see the module docstring)."""
    from scipy.optimize import least_squares

    if len(records) < len(BOUNDS):
        raise LearnedModelError(f"calibration needs at least {len(BOUNDS)} records, got "
                                f"{len(records)}")
    names = [f.name for f in fields(EagerConstants)]
    lo = np.log([BOUNDS[n][0] for n in names])
    hi = np.log([BOUNDS[n][1] for n in names])
    x0 = np.clip(np.log([getattr(start, n) for n in names]), lo + 1e-6, hi - 1e-6)
    meas = np.log([r.measured_us for r in records])

    def consts(x: np.ndarray) -> EagerConstants:
        return EagerConstants(**{n: float(math.exp(v)) for n, v in zip(names, x)})

    def residuals(x: np.ndarray) -> np.ndarray:
        c = consts(x)
        return np.log([predict_us(r, c) for r in records]) - meas

    fit = least_squares(residuals, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.5,
                        diff_step=1e-3, max_nfev=200)
    return consts(fit.x)
