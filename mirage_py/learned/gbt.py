"""Gradient-boosted trees on per-kernel features (LightGBM), as AutoTVM and Ansor use them.

Ansor's formulation: the model scores every kernel (here: every node of :mod:`.features`, the
host node included) and a program's time is the sum over its nodes, ``T = sum_i exp(s_i)``;
the loss is on the program, ``(log T - log measured)^2``, so the trees learn per-kernel times
from whole-program measurements. Each node's score starts at the (calibrated) analytic model's
log time for it (LightGBM's ``init_score``; the host node starts at the host time the stream
does not hide), so the trees learn corrections to the model, and a tree that learns nothing
gives back the analytic prediction.

Gradient and Hessian of the program loss with respect to a node's score, with
``w_i = exp(s_i) / T`` and ``e = log T - log measured``: ``g_i = 2 e w_i``, ``h_i = 2 w_i``
(the Newton step of a leaf is then minus the weighted mean log error of the programs whose
kernels fall into it).

``rank_weight`` adds the graph model's pairwise ranking loss (:mod:`.gnn`, the TPU learned
performance model's): ``softplus(-sign(y_a - y_b) (log T_a - log T_b))`` over the pairs of
records measured on the same GPU, averaged per record, its gradient with respect to
``log T_a`` spread over a record's nodes by ``w_i`` as above (and the logistic's curvature as
the Hessian).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from ..eager import DEFAULT, EagerConstants
from ..errors import LearnedModelError
from .calibrate import predict_us
from .features import NODE_NAMES, host_us, node_features, node_us
from .records import Record

# num_leaves, min_data_in_leaf, ROUNDS, RANK_WEIGHT and EXCLUDE: the winners of the
# cross-validation on the training half (``benchmarks/published_gpu.py --select``,
# ``results/published_cv.json``: out-of-fold tau 0.858; the GEMM-shape and bound columns and
# the ranking term did not help there, so the default leaves them out)
PARAMS = {"num_leaves": 31, "learning_rate": 0.05, "min_data_in_leaf": 40, "lambda_l2": 1.0,
          "feature_fraction": 0.9, "bagging_fraction": 0.9, "bagging_freq": 1, "seed": 0,
          "deterministic": True, "num_threads": 1, "verbose": -1}
# one thread: the trees are small, and on a loaded machine OpenMP's threads spin on each other
# (100 rounds: 3 s with one thread, 69 s with two, on two busy cores)
ROUNDS = 800
RANK_WEIGHT = 0.0
EXCLUDE: tuple[str, ...] = ("gemm_", "log_mem_over_compute")  # columns (prefixes) left out


def _lightgbm():
    try:
        import lightgbm
    except ImportError:
        raise LearnedModelError("the boosted-tree model needs LightGBM: pip install "
                                "'mirage_py[learned]'") from None
    return lightgbm


def init_scores(r: Record, c: EagerConstants) -> np.ndarray:
    """Each node's starting log time: the analytic kernel time; the host node's, the part of
    the analytic eager time the kernels do not account for."""
    ks = [node_us(k, r.target, c) for k in r.kernels]
    rest = max(predict_us(r, c) - sum(ks), 0.05)
    if not ks:
        rest = max(host_us(r, c), 0.05)
    return np.log(np.asarray(ks + [rest], dtype=np.float64))


@dataclass
class _Stacked:
    x: np.ndarray
    init: np.ndarray
    group: np.ndarray  # record index of every row


def _stack(records: list[Record], c: EagerConstants,
           exclude: tuple[str, ...] = ()) -> _Stacked:
    xs, inits, groups = [], [], []
    keep = [i for i, n in enumerate(NODE_NAMES) if not n.startswith(exclude)] if exclude \
        else slice(None)
    for i, r in enumerate(records):
        f = node_features(r, c)[:, keep]
        xs.append(f)
        inits.append(init_scores(r, c))
        groups.append(np.full(len(f), i))
    return _Stacked(np.vstack(xs), np.concatenate(inits), np.concatenate(groups))


def _program_log_time(score: np.ndarray, group: np.ndarray, n: int) -> np.ndarray:
    top = np.full(n, -np.inf)
    np.maximum.at(top, group, score)
    tot = np.zeros(n)
    np.add.at(tot, group, np.exp(score - top[group]))
    return top + np.log(tot)


def _same_gpu_pairs(records: list[Record], y: np.ndarray):
    """Index pairs (a, b) of records on the same GPU with different measured times, the sign
    of y_a - y_b, and each record's pair count."""
    by: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        by.setdefault(r.target, []).append(i)
    a_s, b_s = [], []
    for idx in by.values():
        ix = np.asarray(idx)
        a, b = np.meshgrid(ix, ix, indexing="ij")
        keep = y[a] != y[b]
        a_s.append(a[keep])
        b_s.append(b[keep])
    a, b = np.concatenate(a_s), np.concatenate(b_s)
    count = np.maximum(np.bincount(a, minlength=len(records)), 1)
    return a, b, np.sign(y[a] - y[b]), count


def _rank_grad(logt: np.ndarray, a: np.ndarray, b: np.ndarray, sign: np.ndarray,
               count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gradient and Hessian of each record's mean pairwise logistic loss w.r.t. its log time
    (every ordered pair counts once for its first record: both sides of a pair move)."""
    z = sign * (logt[a] - logt[b])
    sig = 1.0 / (1.0 + np.exp(np.clip(z, -50, 50)))  # sigmoid(-z)
    n = len(logt)
    g = np.bincount(a, -sign * sig, minlength=n) / count
    h = np.bincount(a, sig * (1.0 - sig), minlength=n) / count
    return g, h


class BoostedTrees:
    """The model: fit on records, predict their times (microseconds)."""

    kind = "gbt"

    def __init__(self, constants: EagerConstants = DEFAULT, rounds: int = ROUNDS,
                 params: dict | None = None, exclude: tuple[str, ...] = EXCLUDE,
                 rank_weight: float = RANK_WEIGHT):
        self.constants = constants
        self.rounds = rounds
        self.rank_weight = rank_weight
        self.params = dict(PARAMS, **(params or {}))
        self.exclude = tuple(exclude)  # feature columns left out (names or name prefixes)
        self.booster = None

    def fit(self, records: list[Record]) -> "BoostedTrees":
        lgb = _lightgbm()
        if not records:
            raise LearnedModelError("boosted trees: no training records")
        st = _stack(records, self.constants, self.exclude)
        y = np.log([r.measured_us for r in records])
        n = len(records)

        pairs = _same_gpu_pairs(records, y) if self.rank_weight else None

        def objective(preds: np.ndarray, data) -> tuple[np.ndarray, np.ndarray]:
            logt = _program_log_time(preds, st.group, n)
            w = np.exp(preds - logt[st.group])
            g, h = 2.0 * (logt - y), np.full(n, 2.0)
            if pairs is not None:
                rg, rh = _rank_grad(logt, *pairs)
                g, h = g + self.rank_weight * rg, h + self.rank_weight * rh
            return g[st.group] * w, h[st.group] * w + 1e-9

        ds = lgb.Dataset(st.x, init_score=st.init, free_raw_data=False)
        self.booster = lgb.train(dict(self.params, objective=objective), ds,
                                 num_boost_round=self.rounds)
        return self

    def predict(self, records: list[Record], rounds: int | None = None) -> list[float]:
        """Predicted times (us); ``rounds``: with the first that many trees only (the
        cross-validation scores several round counts from one fit)."""
        if self.booster is None:
            raise LearnedModelError("boosted trees: predict before fit (or load)")
        st = _stack(records, self.constants, self.exclude)
        s = st.init + self.booster.predict(st.x, raw_score=True, num_iteration=rounds)
        return [float(math.exp(v)) for v in _program_log_time(s, st.group, len(records))]

    def to_json(self) -> dict:
        return {"kind": self.kind, "constants": self.constants.as_dict(),
                "exclude": list(self.exclude), "rank_weight": self.rank_weight,
                "booster": self.booster.model_to_string() if self.booster else None}

    @classmethod
    def from_json(cls, d: dict) -> "BoostedTrees":
        lgb = _lightgbm()
        m = cls(EagerConstants.from_dict(d.get("constants", {})),
                exclude=tuple(d.get("exclude", ())), rank_weight=d.get("rank_weight", 0.0))
        m.booster = lgb.Booster(model_str=d["booster"])
        return m

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_json(), f)
