"""Training records for cost models: programs as kernel graphs, with measured times.

Every source of measurements becomes the same records, so one pipeline calibrates and trains on
all of them:

* **published** KernelBench timings (``benchmarks/published_gpu.py``): a problem's eager trace
  (:mod:`mirage_py.eager`) gives its kernels and their data edges; each (problem, GPU) timing is
  a record;
* **our own** μGraph measurements (the results database's training-set export,
  :func:`mirage_py.tuning.export.export_training_set`): each measured graph is a record whose
  kernels carry the analytic model's per-kernel quantities (:func:`from_export_row`).

A record belongs to a *problem* (the unit of the train / test split: every GPU's and every
size's record of a problem falls on the same side) and a *family* (what the problem computes,
for top-k scores). :func:`split_of` is a fixed-seed hash of the problem, so adding problems
never moves the others.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Iterable

from ..eager import EagerKernel, GemmShape, KernelClass
from ..errors import LearnedModelError

SPLIT_SEED = 31  # the number: the split of the published records


class Split(Enum):
    TRAIN = "train"
    TEST = "test"


@dataclass(frozen=True)
class KernelNode:
    """One kernel of a record: what a model may know of it before it runs."""

    kind: KernelClass
    read_bytes: float
    write_bytes: float
    flops: float
    tensor_core: bool = False
    sources: tuple[int, ...] = ()  # earlier kernels of the record it reads from
    # a graph-defined (generated) kernel's launch shape; 0 for library kernels
    blocks: int = 0
    threads: int = 0
    smem: int = 0
    stages: int = 0
    forloop: int = 0
    call: int = 0  # the host call that launches it (an eager trace's aten call index)
    rows: int = 0  # a row-per-block library kernel's rows (0: spreads over the GPU)
    gemm: GemmShape | None = None  # a library GEMM's shape and operand layout

    @property
    def bytes(self) -> float:
        return self.read_bytes + self.write_bytes

    def to_json(self) -> dict[str, Any]:
        """The fields that differ from their defaults (records hold thousands of kernels)."""
        d = {k: v for k, v in asdict(self).items()
             if k != "gemm" and v not in (0, 0.0, False, ())}
        d["kind"] = self.kind.value
        if self.sources:
            d["sources"] = list(self.sources)
        if self.gemm is not None:
            d["gemm"] = self.gemm.to_json()
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "KernelNode":
        d = dict(d)
        d["kind"] = KernelClass(d["kind"])
        d["sources"] = tuple(d.get("sources", ()))
        if d.get("gemm") is not None:
            d["gemm"] = GemmShape.from_json(d["gemm"])
        d.setdefault("read_bytes", 0.0)
        d.setdefault("write_bytes", 0.0)
        d.setdefault("flops", 0.0)
        return cls(**d)

    @classmethod
    def from_eager(cls, k: EagerKernel) -> "KernelNode":
        return cls(k.kind, k.read_bytes, k.write_bytes, k.flops, k.tensor_core, k.sources,
                   call=k.call, rows=k.rows, gemm=k.gemm)


@dataclass(frozen=True)
class Record:
    """A program (its kernels) measured on one GPU."""

    problem: str  # "level2/12_Gemm_Multiply_LeakyReLU": the split unit
    family: str
    target: str  # a mirage_py target name: the hardware features come from it
    kernels: tuple[KernelNode, ...]
    calls: int  # host-side calls (aten calls of an eager trace; kernels for a μGraph)
    measured_us: float
    source: str = ""  # where the measurement comes from ("H100_PCIe_LambdaLabs@129232e")
    program: str = ""  # the program's key (problem and sizes)
    captured: bool = True  # the torch frontend captures it as one Program
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def level(self) -> str:
        return self.problem.split("/", 1)[0] if "/" in self.problem else ""

    def split(self, seed: int = SPLIT_SEED) -> Split:
        return split_of(self.problem, seed)


def split_of(problem: str, seed: int = SPLIT_SEED) -> Split:
    """The fixed-seed half a problem falls in (a hash: stable as problems come and go)."""
    h = hashlib.sha256(f"{seed}:{problem}".encode()).digest()
    return Split.TEST if h[0] & 1 else Split.TRAIN


FAMILIES = (  # first match wins; names are KernelBench's file names, lower case
    ("conv", r"conv"), ("attention", r"attention|attn|transformer|gpt|vit|swin"),
    ("rnn", r"lstm|gru|rnn|mamba"), ("mlp", r"mlp"),
    ("matmul", r"matmul|gemm|matrix|linear|bmm|_mm|multiplication"),
    ("norm", r"norm"), ("softmax", r"softmax"), ("pool", r"pool"),
    ("loss", r"loss|entropy|divergence"),
    ("reduction", r"sum|mean|max|min|argm|prod|cumsum|cumprod|scan|reduction|logsumexp"),
    ("activation", r"relu|gelu|sigmoid|tanh|swish|elu|softplus|softsign|hardtanh|mish|"
                   r"selu|leaky|activation"),
)


def family_of(problem: str) -> str:
    """The problem family of a KernelBench problem name (``FAMILIES``; "other" if none)."""
    name = problem.rsplit("/", 1)[-1].lower()
    level = problem.split("/", 1)[0] if "/" in problem else ""
    if level == "level3":
        for fam, pat in FAMILIES[:4]:
            if re.search(pat, name):
                return fam
        return "network"
    for fam, pat in FAMILIES:
        if re.search(pat, name):
            return fam
    return "other"


def record_to_json(r: Record) -> dict[str, Any]:
    return {"problem": r.problem, "family": r.family, "target": r.target,
            "kernels": [k.to_json() for k in r.kernels], "calls": r.calls,
            "measured_us": r.measured_us, "source": r.source, "program": r.program,
            "captured": r.captured, "extra": r.extra}


def record_from_json(d: dict[str, Any]) -> Record:
    try:
        return Record(d["problem"], d["family"], d["target"],
                      tuple(KernelNode.from_json(k) for k in d["kernels"]), int(d["calls"]),
                      float(d["measured_us"]), d.get("source", ""), d.get("program", ""),
                      bool(d.get("captured", True)), dict(d.get("extra", {})))
    except (KeyError, TypeError, ValueError) as e:
        raise LearnedModelError(f"not a training record ({type(e).__name__}: {e}); records "
                                "are written by mirage_py.learned.save_records") from None


def save_records(records: Iterable[Record], path: str | Path) -> int:
    n = 0
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(record_to_json(r), sort_keys=True) + "\n")
            n += 1
    return n


def load_records(path: str | Path) -> list[Record]:
    with open(path) as f:
        return [record_from_json(json.loads(line)) for line in f if line.strip()]


def op_kind(op: str) -> KernelClass:
    """The library-kernel class of a μGraph's pre-defined kernel operator."""
    if op == "matmul":
        return KernelClass.GEMM
    if op in ("sum", "max", "min"):
        return KernelClass.REDUCTION
    if op in ("reshape", "transpose", "slice", "concat", "mask", "const"):
        return KernelClass.COPY
    return KernelClass.ELEMENTWISE


def cost_node(graph_kernel: bool, op: str, nbytes: float, tc_flops: float, simt_flops: float,
              sources: tuple[int, ...], call: int, blocks: int = 0, threads: int = 0,
              smem: int = 0, stages: int = 0, forloop: int = 0) -> KernelNode:
    """A μGraph kernel as a node, from the analytic model's quantities for it (a graph-defined
    kernel is ``OTHER``, with its launch shape; a pre-defined one is its operator's class)."""
    kind = KernelClass.OTHER if graph_kernel else op_kind(op)
    return KernelNode(kind, nbytes, 0.0, tc_flops + simt_flops, tc_flops > 0, sources,
                      blocks, threads, smem, stages, forloop, call)


def from_export_row(row: dict[str, Any], problem: str | None = None) -> Record:
    """A record from one row of the results database's JSONL export (a measured μGraph): its
    kernels with the analytic model's per-kernel bytes and flops and their launch shapes."""
    if row.get("measured_us") is None:
        raise LearnedModelError(f"export row {row.get('record_id')}: no measured time "
                                "(export with --measured-only)")
    feats = row.get("features", {})
    kernels = []
    for i, k in enumerate(feats.get("per_kernel", [])):
        graph = k.get("kind") == "graph"
        kernels.append(cost_node(
            graph, k.get("op", ""), float(k.get("bytes", 0.0)), float(k.get("tc_flops", 0.0)),
            float(k.get("simt_flops", 0.0)), tuple(k.get("sources", ())), i,
            int(k.get("blocks", 0) or 0) if graph else 0, int(k.get("threads", 0) or 0),
            int(k.get("smem", 0) or 0), int(k.get("stages", 0) or 0) if graph else 0,
            int(k.get("forloop", 0) or 0) if graph else 0))
    if not kernels:
        raise LearnedModelError(f"export row {row.get('record_id')}: no per-kernel features")
    prob = problem or f"ugraph/{row.get('workload', '')[:16]}"
    return Record(prob, "ugraph", str(row.get("target", "h100")), tuple(kernels),
                  len(kernels), float(row["measured_us"]), str(row.get("runner", "")),
                  str(row.get("graph_hash", "")))
