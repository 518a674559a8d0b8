"""Calibrate the analytic model's eager pricing on measured records.

The analytic model prices a record as eager PyTorch runs it (:func:`mirage_py.eager.eager_time`
with :class:`~mirage_py.eager.EagerConstants`). Calibration fits those constants -- bandwidth
efficiency (all kernels, more for reducing ones, a row-per-block kernel's row bandwidth), cuBLAS
and cuDNN efficiency, the launch cost's scale, the host's time per call and per launch, and per
target a bandwidth, a GEMM and a convolution factor -- to the training records, minimising the squared log
error (``scipy.optimize.least_squares``, robust ``soft_l1`` loss, parameters in log space so
they stay positive; the per-target factors are pulled towards 1 by a small penalty, so the
global figures carry what all GPUs share and an unmeasured GPU gets those).
"""

from __future__ import annotations

import math
import numpy as np

from ..eager import DEFAULT, EagerConstants, KernelClass, eager_time
from ..eager.predict import row_bw
from ..errors import LearnedModelError
from ..targets import get_target
from .records import Record

BOUNDS = {"mem_eff": (0.2, 2.0), "reduce_mem_eff": (0.1, 2.0), "gemm_eff": (0.1, 2.0),
          "conv_eff": (0.02, 2.0), "launch_scale": (0.2, 5.0), "host_kernel_us": (0.5, 50.0),
          "host_call_us": (0.05, 20.0), "row_bw_scale": (0.05, 20.0)}
TARGET_BOUNDS = (0.3, 3.0)
TARGET_PENALTY = 0.3  # weight of log(factor) as a residual, per per-target factor
_REDUCING = (KernelClass.REDUCTION, KernelClass.SCAN, KernelClass.SOFTMAX, KernelClass.NORM)


def predict_us(record: Record, c: EagerConstants = DEFAULT) -> float:
    """The (calibrated, with ``c``) analytic model's eager time of a record, microseconds."""
    return eager_time(list(record.kernels), record.calls, record.target, c).us


class Prepared:
    """Records as arrays, so that the eager pricing of all of them is a few numpy operations
    (the fit evaluates it thousands of times). The stream recursion
    ``end_i = max(end_{i-1}, host_i) + d_i`` is ``end_n = S_n + max(0, max_j (host_j - S_{j-1}))``
    with ``S`` the running sum of kernel times."""

    def __init__(self, records: list[Record]):
        rows = [(i, j, k) for i, r in enumerate(records) for j, k in enumerate(r.kernels)]
        self.n = len(records)
        self.targets = sorted({r.target for r in records})
        self.rec = np.array([i for i, _, _ in rows], dtype=np.int64)
        self.pos = np.array([j for _, j, _ in rows], dtype=np.float64)
        self.call = np.array([k.call for _, _, k in rows], dtype=np.float64)
        self.bytes = np.array([k.bytes for _, _, k in rows], dtype=np.float64)
        self.flops = np.array([k.flops for _, _, k in rows], dtype=np.float64)
        self.rows = np.array([k.rows for _, _, k in rows], dtype=np.float64)
        self.reducing = np.array([k.kind in _REDUCING for _, _, k in rows])
        self.gemm = np.array([k.kind is KernelClass.GEMM for _, _, k in rows])
        conv = np.array([k.kind is KernelClass.CONV for _, _, k in rows])
        tc = np.array([k.tensor_core for _, _, k in rows])
        self.conv_tc, self.conv_simt = conv & tc, conv & ~tc
        names = [records[i].target for i, _, _ in rows]
        self.tname = np.array(names, dtype=object)
        ts = [get_target(n) for n in names]
        self.bw = np.array([t.mem_bw for t in ts])
        self.fp32 = np.array([t.fp32_flops for t in ts])
        self.tf32 = np.array([t.tf32_flops for t in ts])
        self.launch = np.array([t.launch_us for t in ts])
        self.row_bw = np.array([row_bw(t) for t in ts])
        self.calls = np.array([r.calls for r in records], dtype=np.float64)
        self.kernels = np.array([len(r.kernels) for r in records], dtype=np.float64)
        self.start = np.searchsorted(self.rec, np.arange(self.n))
        self.empty = self.kernels == 0

    def _per_target(self, pairs: tuple[tuple[str, float], ...]) -> np.ndarray:
        f = dict(pairs)
        return np.array([f.get(n, 1.0) for n in self.tname]) if f else np.ones(len(self.tname))

    def predict(self, c: EagerConstants) -> np.ndarray:
        eff = c.mem_eff * self._per_target(c.target_mem_eff) * \
            np.where(self.reducing, c.reduce_mem_eff, 1.0)
        eff = np.where(self.rows > 0,
                       np.minimum(eff, self.rows * self.row_bw * c.row_bw_scale / self.bw), eff)
        gemm = c.gemm_eff * self._per_target(c.target_gemm_eff)
        conv = c.conv_eff * self._per_target(c.target_conv_eff)
        rate = np.where(self.gemm, self.fp32 * gemm,
                        np.where(self.conv_tc, self.tf32 * conv,
                                 np.where(self.conv_simt, self.fp32 * conv, self.fp32)))
        d = self.launch * c.launch_scale + 1e6 * np.maximum(self.bytes / (self.bw * eff),
                                                            self.flops / rate)
        host = c.host_call_us * (self.call + 1) + c.host_kernel_us * (self.pos + 1)
        before = np.cumsum(d) - d  # S_{j-1}, over all records
        base = np.zeros(self.n)
        ok = ~self.empty
        base[ok] = before[self.start[ok]]
        slack = np.maximum(host - (before - base[self.rec]), 0.0)
        worst = np.zeros(self.n)
        np.maximum.at(worst, self.rec, slack)
        total = np.zeros(self.n)
        np.add.at(total, self.rec, d)
        host_total = c.host_call_us * self.calls + c.host_kernel_us * self.kernels
        return np.maximum(total + worst, host_total)


def calibrate(records: list[Record], start: EagerConstants = DEFAULT,
              per_target: bool = True) -> EagerConstants:
    """Constants that fit ``records`` best (see the module docstring); ``per_target``: fit a
    bandwidth, a GEMM and a convolution factor for every target among the records."""
    from scipy.optimize import least_squares

    if len(records) < len(BOUNDS):
        raise LearnedModelError(f"calibration needs at least {len(BOUNDS)} records, got "
                                f"{len(records)}")
    prepared = Prepared(records)
    names = list(BOUNDS)
    tnames = prepared.targets if per_target else []
    lo = np.log([BOUNDS[n][0] for n in names] + [TARGET_BOUNDS[0]] * 3 * len(tnames))
    hi = np.log([BOUNDS[n][1] for n in names] + [TARGET_BOUNDS[1]] * 3 * len(tnames))
    x0 = np.clip(np.log([getattr(start, n) for n in names] +
                        [start.mem(t) / start.mem_eff for t in tnames] +
                        [start.gemm(t) / start.gemm_eff for t in tnames] +
                        [start.conv(t) / start.conv_eff for t in tnames]),
                 lo + 1e-6, hi - 1e-6)
    meas = np.log([r.measured_us for r in records])
    k = len(names)

    def consts(x: np.ndarray) -> EagerConstants:
        kw = {n: float(math.exp(v)) for n, v in zip(names, x[:k])}
        m = len(tnames)
        kw["target_mem_eff"] = tuple((t, float(math.exp(v))) for t, v in zip(tnames, x[k:k + m]))
        kw["target_gemm_eff"] = tuple((t, float(math.exp(v)))
                                      for t, v in zip(tnames, x[k + m:k + 2 * m]))
        kw["target_conv_eff"] = tuple((t, float(math.exp(v)))
                                      for t, v in zip(tnames, x[k + 2 * m:]))
        return EagerConstants(**kw)

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.concatenate([np.log(prepared.predict(consts(x))) - meas,
                               TARGET_PENALTY * x[k:]])

    fit = least_squares(residuals, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.5,
                        diff_step=1e-3, max_nfev=300)
    return consts(fit.x)
