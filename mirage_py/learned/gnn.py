"""A GraphSAGE-style network over the operator graph with a pairwise ranking loss, as the TPU
learned performance model (Kaufman et al., 2021) uses one.

Nodes are a record's kernels and its host node (:mod:`.features`, standardised); edges are the
data edges between kernels, both ways, and every kernel to the host node. ``LAYERS`` SAGE layers
(``h' = relu(W_self h + W_neigh mean_{j in N(i)} h_j) + h``), then a per-node score added to the
node's analytic log time; a program's time is ``sum_i exp(s_i)`` (as in :mod:`.gbt`). The loss
is the squared log error plus a pairwise logistic ranking loss over pairs of records measured
on the same GPU: ``softplus(margin - sign(y_a - y_b) (log T_a - log T_b))`` (``margin`` 0: the
plain logistic loss; above 0, a pair already in order is pushed apart to that log ratio).

Written with plain PyTorch (``index_add_`` for the mean aggregation): torch_geometric's
``SAGEConv`` computes the same layer, and adds six dependencies and about 2.7 s of import time
for these dozen lines (docs/learned.md).
"""

from __future__ import annotations

import math

import numpy as np

from ..eager import DEFAULT, EagerConstants
from ..errors import LearnedModelError
from .features import edges, node_features
from .gbt import init_scores
from .records import Record

# chosen on the training half only (--select gnn: three of its five folds; widths 32 / 64,
# 2 / 3 layers, rates 3e-3 / 1e-2, margins 0 / 0.5, 100-300 epochs; published_cv.json)
HIDDEN = 32
LAYERS = 3
EPOCHS = 100
LR = 3e-3
RANK_WEIGHT = 1.0
MARGIN = 0.5


def _torch():
    try:
        import torch
    except ImportError:
        raise LearnedModelError("the graph model needs PyTorch: pip install "
                                "'mirage_py[learned]'") from None
    return torch


class _Batch:
    """Records stacked into one disjoint graph."""

    def __init__(self, records: list[Record], c: EagerConstants):
        torch = _torch()
        xs, inits, groups, src, dst = [], [], [], [], []
        off = 0
        for i, r in enumerate(records):
            f = node_features(r, c)
            e = edges(r) + off
            xs.append(f)
            inits.append(init_scores(r, c))
            groups.append(np.full(len(f), i))
            src += [e[0], e[1]]
            dst += [e[1], e[0]]
            off += len(f)
        self.x = torch.tensor(np.vstack(xs), dtype=torch.float32)
        self.init = torch.tensor(np.concatenate(inits), dtype=torch.float32)
        self.group = torch.tensor(np.concatenate(groups), dtype=torch.long)
        self.src = torch.tensor(np.concatenate(src), dtype=torch.long)
        self.dst = torch.tensor(np.concatenate(dst), dtype=torch.long)
        deg = torch.zeros(len(self.x)).index_add_(0, self.dst, torch.ones(len(self.dst)))
        self.inv_deg = (1.0 / deg.clamp(min=1.0)).unsqueeze(1)
        self.n = len(records)


def _net(width: int, hidden: int = HIDDEN, layers: int = LAYERS):
    torch = _torch()
    nn = torch.nn

    class Sage(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(width, hidden)
            self.self_w = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(layers))
            self.neigh_w = nn.ModuleList(nn.Linear(hidden, hidden, bias=False)
                                         for _ in range(layers))
            self.out = nn.Linear(hidden, 1)

        def forward(self, b: _Batch):
            h = torch.relu(self.inp(b.x))
            for ws, wn in zip(self.self_w, self.neigh_w):
                agg = torch.zeros_like(h).index_add_(0, b.dst, h[b.src]) * b.inv_deg
                h = torch.relu(ws(h) + wn(agg)) + h
            s = b.init + self.out(h).squeeze(1)
            top = torch.full((b.n,), -1e30).scatter_reduce(0, b.group, s, "amax")
            tot = torch.zeros(b.n).index_add_(0, b.group, torch.exp(s - top[b.group]))
            return top + torch.log(tot)  # log program time

    return Sage()


class GraphSage:
    """The model: fit on records, predict their times (microseconds)."""

    kind = "gnn"

    def __init__(self, constants: EagerConstants = DEFAULT, epochs: int = EPOCHS,
                 seed: int = 0, rank_weight: float = RANK_WEIGHT, hidden: int = HIDDEN,
                 snapshots: tuple[int, ...] = (), layers: int = LAYERS, lr: float = LR,
                 margin: float = MARGIN):
        if layers < 0 or hidden < 1 or epochs < 1 or lr <= 0 or margin < 0:
            raise LearnedModelError(f"graph model: bad settings (layers {layers}, hidden "
                                    f"{hidden}, epochs {epochs}, lr {lr}, margin {margin})")
        self.constants = constants
        self.epochs = epochs
        self.seed = seed
        self.rank_weight = rank_weight
        self.hidden = hidden
        self.layers = layers
        self.lr = lr
        self.margin = margin
        self.snapshots = tuple(e for e in snapshots if e < epochs)  # epochs whose weights
        self.states: dict[int, dict] = {}  # ... are kept (cross-validation scores them all)
        self.net = None
        self.mean = self.std = None

    def _norm(self, b: _Batch) -> _Batch:
        torch = _torch()
        b.x = (b.x - torch.as_tensor(self.mean)) / torch.as_tensor(self.std)
        return b

    def fit(self, records: list[Record]) -> "GraphSage":
        torch = _torch()
        if not records:
            raise LearnedModelError("graph model: no training records")
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # small tensors: threads only wait for each other
        try:
            return self._fit(records)
        finally:
            torch.set_num_threads(threads)

    def _fit(self, records: list[Record]) -> "GraphSage":
        torch = _torch()
        torch.manual_seed(self.seed)
        b = _Batch(records, self.constants)
        self.mean = b.x.mean(0).numpy()
        std = b.x.std(0)
        # a column constant in training (one GPU's figures) is centred, not blown up
        self.std = torch.where(std > 1e-3, std, torch.ones_like(std)).numpy()
        b = self._norm(b)
        y = torch.tensor(np.log([r.measured_us for r in records]), dtype=torch.float32)
        codes = {t: i for i, t in enumerate(sorted({r.target for r in records}))}
        tgt = torch.tensor([codes[r.target] for r in records])
        same = tgt.unsqueeze(1) == tgt.unsqueeze(0)
        diff = torch.sign(y.unsqueeze(1) - y.unsqueeze(0))
        pair = same & (diff != 0)
        self.net = _net(b.x.shape[1], self.hidden, self.layers)
        opt = torch.optim.Adam(self.net.parameters(), lr=self.lr, weight_decay=1e-5)
        for epoch in range(self.epochs):
            if epoch in self.snapshots:
                self.states[epoch] = {k: v.clone() for k, v in self.net.state_dict().items()}
            opt.zero_grad()
            logt = self.net(b)
            mse = ((logt - y) ** 2).mean()
            d = logt.unsqueeze(1) - logt.unsqueeze(0)
            rank = torch.nn.functional.softplus(self.margin - diff * d)[pair].mean() \
                if pair.any() else 0.0
            loss = mse + self.rank_weight * rank
            loss.backward()
            opt.step()
        return self

    def predict(self, records: list[Record], epochs: int | None = None) -> list[float]:
        """Predicted times (us); ``epochs``: with the weights after that many epochs (one of
        ``snapshots``), else the last."""
        torch = _torch()
        if self.net is None:
            raise LearnedModelError("graph model: predict before fit (or load)")
        b = self._norm(_Batch(records, self.constants))
        net = self.net
        if epochs is not None and epochs != self.epochs:
            if epochs not in self.states:
                raise LearnedModelError(f"graph model: no snapshot after {epochs} epochs")
            net = _net(len(self.mean), self.hidden, self.layers)
            net.load_state_dict(self.states[epochs])
        with torch.no_grad():
            return [math.exp(min(v, 700.0)) for v in net(b).tolist()]  # no overflow

    def save(self, path: str) -> None:
        torch = _torch()
        torch.save({"kind": self.kind, "constants": self.constants.as_dict(),
                    "mean": self.mean, "std": self.std, "state": self.net.state_dict(),
                    "width": len(self.mean), "hidden": self.hidden, "layers": self.layers},
                   path)

    @classmethod
    def load(cls, path: str) -> "GraphSage":
        torch = _torch()
        d = torch.load(path, weights_only=False)
        m = cls(EagerConstants.from_dict(d["constants"]), hidden=int(d.get("hidden", HIDDEN)),
                layers=int(d.get("layers", LAYERS)))
        m.mean, m.std = d["mean"], d["std"]
        m.net = _net(int(d["width"]), m.hidden, m.layers)
        m.net.load_state_dict(d["state"])
        return m
