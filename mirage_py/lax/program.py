"""Programs: named inputs, a DAG of operators, named outputs; reference evaluation, hashing, JSON.

>>> import mirage_py as mp
>>> p = mp.Program("lora")
>>> X = p.input("X", (16, 256)); W = p.input("W", (256, 4096))
>>> A = p.input("A", (256, 16)); B = p.input("B", (16, 4096))
>>> p.output(X @ W + (X @ A) @ B)
>>> print(p)  # doctest: +NORMALIZE_WHITESPACE
program lora
  X: (16, 256) float16
  W: (256, 4096) float16
  A: (256, 16) float16
  B: (16, 4096) float16
  %4 = matmul(X, W) : (16, 4096) float16
  %5 = matmul(X, A) : (16, 16) float16
  %6 = matmul(%5, B) : (16, 4096) float16
  %7 = add(%4, %6) : (16, 4096) float16
  out0 = %7
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any, Mapping

import numpy as np

from ..errors import DTypeError, MirageError, ProgramError, SerializationError, ShapeError
from . import ops as _ops
from .precision import Float32Matmul
from .shapes import Affine, Dim, json_size, resolve, size_from_json
from .tensor import (Tensor, _fmt, _json_attr, apply, const, make_input, mask_from_attrs,
                     topo_order)

FORMAT = "mirage_py.program"
FORMAT_VERSION = 1


class Program:
    """A tensor program: declare inputs, apply operators, declare outputs.

    Attributes: ``name``; ``inputs`` (list of input tensors, each with ``name``, ``shape``,
    ``dtype``); ``outputs`` (list of :class:`Output`: ``name`` plus the tensor's ``shape`` and
    ``dtype``, and ``tensor``).
    """

    def __init__(self, name: str):
        if not isinstance(name, str) or not name:
            raise ProgramError(f"Program: name must be a non-empty string, got {name!r}")
        self.name = name
        self._inputs: dict[str, Tensor] = {}
        self._outputs: dict[str, Tensor] = {}

    # -- building -------------------------------------------------------------------------------
    def input(self, name: str, shape: tuple[int, ...], dtype: str = "float16") -> Tensor:
        """Declare an input tensor: dtype float16, bfloat16 or float32, or int32 / int64 for an
        index tensor (token ids, positions) that only ``mp.take`` reads."""
        if name in self._inputs:
            raise ProgramError(f"Program {self.name!r}: input {name!r} is declared twice")
        t = make_input(name, shape, dtype)
        known = self.dims
        for d in t.shape:
            if isinstance(d, Dim) and d.name in known and known[d.name] != d:
                raise ProgramError(f"Program {self.name!r}: input {name!r} uses dim {d.name} with "
                                   f"range {d.lo} .. {d.hi}, declared {known[d.name].lo} .. "
                                   f"{known[d.name].hi} before")
        self._inputs[name] = t
        return t

    def output(self, tensor: Tensor, name: str | None = None) -> None:
        """Declare ``tensor`` an output; names default to ``out0, out1, ...``."""
        if not isinstance(tensor, Tensor):
            raise ProgramError(f"Program {self.name!r}: output must be a Tensor, got "
                               f"{type(tensor).__name__}")
        if name is None:
            name = f"out{len(self._outputs)}"
        if not isinstance(name, str) or not name.isidentifier():
            raise ProgramError(f"Program {self.name!r}: output name {name!r} must be an identifier")
        if name in self._outputs or name in self._inputs:
            raise ProgramError(f"Program {self.name!r}: name {name!r} is already used")
        for node in topo_order([tensor]):
            if node.op == "input":
                mine = self._inputs.get(node.name)
                if mine is None or mine != node:
                    raise ProgramError(
                        f"Program {self.name!r}: output {name!r} uses input {node.name!r} "
                        f"{_fmt(node.shape)} {node.dtype}, which is not an input of this program")
        if tensor.op in ("const", "mask"):
            raise ProgramError(f"Program {self.name!r}: output {name!r} is a constant "
                               f"({tensor.op})")
        if _ops.is_index(tensor.dtype):
            raise DTypeError(f"Program {self.name!r}: output {name!r} is the index tensor "
                             f"{_fmt(tensor.shape)} {tensor.dtype}; outputs are float values "
                             "(index tensors only feed mp.take)")
        self._outputs[name] = tensor

    def with_float32_matmul(self, precision: Any) -> "Program":
        """This program with ``precision`` (``"highest"``, ``"high"`` or ``"medium"``; see
        :mod:`mirage_py.lax.precision`) on every float32 matmul that does not name its own; the
        program itself when that changes nothing. What superopt(float32_matmul=...) searches."""
        p = Float32Matmul.parse(precision)
        if p is Float32Matmul.HIGHEST or not any(
                t.op == "matmul" and t.dtype == "float32" and t.attr("precision") is None
                for t in self.nodes()):
            return self
        new: dict[str, Tensor] = {}
        for t in self.nodes():
            if not t.inputs:
                new[t.digest] = t
                continue
            attrs = t.attr_dict
            if t.op == "matmul" and t.dtype == "float32" and "precision" not in attrs:
                attrs["precision"] = p.value
            new[t.digest] = apply(t.op, [new[i.digest] for i in t.inputs], attrs)
        out = copy.copy(self)  # a subclass keeps its class and attributes (TorchProgram)
        out._inputs = dict(self._inputs)
        out._outputs = {n: new[t.digest] for n, t in self._outputs.items()}
        return out

    # -- views ----------------------------------------------------------------------------------
    @property
    def inputs(self) -> list[Tensor]:
        return list(self._inputs.values())

    @property
    def outputs(self) -> list["Output"]:
        return [Output(n, t) for n, t in self._outputs.items()]

    @property
    def output_tensors(self) -> dict[str, Tensor]:
        return dict(self._outputs)

    @property
    def dims(self) -> dict[str, Dim]:
        """The symbolic dims of the inputs, by name (empty for a static program)."""
        out: dict[str, Dim] = {}
        for t in self._inputs.values():
            for d in t.shape:
                if isinstance(d, Dim):
                    out.setdefault(d.name, d)
        return out

    @property
    def symbolic(self) -> bool:
        return bool(self.dims)

    @property
    def params(self) -> tuple[str, ...]:
        """Dims the program's masks name that no input shape carries: sizes known only when it
        runs (the valid sizes of a padded program, lax/family.py), given to ``evaluate``."""
        shaped = set(self.dims)
        names: set[str] = set()
        for t in self.nodes():
            if t.op == "mask":
                for _, v in t.attrs:
                    for x in (v if isinstance(v, tuple) else (v,)):
                        if isinstance(x, (Dim, Affine)):
                            names |= {n for n, _ in Affine.of(x).terms}
        return tuple(sorted(names - shaped))

    def bind(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
        """The size of every dim, read from input ``shapes`` (name -> concrete shape): each
        dim's uses must agree and lie in its range (typed errors name the input)."""
        sizes: dict[str, int] = {}
        for n, t in self._inputs.items():
            got = tuple(shapes[n])
            if len(got) != len(t.shape):
                raise ShapeError(f"Program {self.name!r}: input {n!r} has shape {_fmt(got)}, "
                                 f"declared {_fmt(t.shape)}")
            for want, have in zip(t.shape, got):
                if isinstance(want, Dim):
                    where = f"Program {self.name!r}: input {n!r} {_fmt(got)}"
                    want.check(int(have), where)
                    if sizes.setdefault(want.name, int(have)) != int(have):
                        raise ShapeError(f"{where}: dim {want.name} is {have} here and "
                                         f"{sizes[want.name]} in another input")
                elif want != have:
                    raise ShapeError(f"Program {self.name!r}: input {n!r} has shape {_fmt(got)}, "
                                     f"declared {_fmt(t.shape)}")
        return sizes

    def at(self, sizes: Mapping[str, int]) -> "Program":
        """The static program this one is for ``sizes`` (dim name -> size, each in its dim's
        range): every dim, and every expression of dims in a mask, replaced by its size (also
        the :attr:`params` of a padded program, when ``sizes`` names them)."""
        dims = self.dims
        if not dims and not set(self.params) & set(sizes):
            return self
        for n, d in dims.items():
            if n not in sizes:
                raise ShapeError(f"Program {self.name!r}: no size given for dim {n}")
            d.check(int(sizes[n]), f"Program {self.name!r}")
        new: dict[str, Tensor] = {}
        out = Program(self.name)
        for t in self.nodes():
            if t.op == "input":
                new[t.digest] = out.input(t.name, resolve(t.shape, sizes), t.dtype)
            elif t.op == "const":
                new[t.digest] = t
            elif t.op == "mask":
                new[t.digest] = mask_from_attrs(resolve(t.shape, sizes),
                                                {k: resolve(v, sizes) for k, v in t.attrs})
            else:
                new[t.digest] = apply(t.op, [new[i.digest] for i in t.inputs],
                                      {k: resolve(v, sizes) for k, v in t.attrs}, exact=False)
        for n, t in self._outputs.items():
            out.output(new[t.digest], n)
        return out

    def nodes(self) -> list[Tensor]:
        """Every node (inputs first in declaration order, then operators in dependency order)."""
        order = [t for t in topo_order(self._outputs.values()) if t.op != "input"]
        return list(self._inputs.values()) + order

    def lean_order(self) -> list[tuple[Tensor, tuple[str, ...]]]:
        """Every node in the order an evaluation meets them with least memory: each input just
        before its first use (a float64 copy of a weight lives from its first use to its last,
        not through the whole program), each node with the digests of the values no later node
        reads and no output is (dropped after it)."""
        order: list[Tensor] = []
        placed: set[str] = set()
        topo = topo_order(self._outputs.values())
        used = {i.digest for n in topo for i in n.inputs}
        for t in self._inputs.values():  # unused inputs are still checked, first
            if t.digest not in used and t.digest not in placed:
                placed.add(t.digest)
                order.append(t)
        for t in topo:
            if t.op == "input":
                continue
            for i in t.inputs:
                if i.op == "input" and i.digest not in placed:
                    placed.add(i.digest)
                    order.append(i)
            order.append(t)
        for t in self._inputs.values():  # an input that is only an output
            if t.digest not in placed:
                placed.add(t.digest)
                order.append(t)
        last: dict[str, int] = {}
        for k, t in enumerate(order):
            for i in t.inputs:
                last[i.digest] = k
        kept = {t.digest for t in self._outputs.values()}
        drops: list[list[str]] = [[] for _ in order]
        for d, k in last.items():
            if d not in kept:
                drops[k].append(d)
        return [(t, tuple(dr)) for t, dr in zip(order, drops)]

    def node_ids(self) -> dict[str, int]:
        """Stable small integer per node digest (its position in :meth:`nodes`)."""
        return {t.digest: i for i, t in enumerate(self.nodes())}

    def index_bounds(self) -> dict[str, int]:
        """For every index input (int32 / int64), the number of rows its values may pick:
        the fewest rows of a table ``take`` gathers from with it (1 when no take reads it).
        Valid indices are ``[0, bound)``; random inputs and the verifier draw from there."""
        out = {n: None for n, t in self._inputs.items() if _ops.is_index(t.dtype)}
        for t in self.nodes():
            if t.op == "take" and t.inputs[1].op == "input":
                n, rows = t.inputs[1].name, t.inputs[0].shape[0]
                out[n] = rows if out[n] is None else min(out[n], rows)
        return {n: (1 if b is None else b) for n, b in out.items()}

    @property
    def is_lax(self) -> bool:
        """True when every operator is in the Lax fragment and no exp is nested in an exp."""
        return not self.uninterpreted_ops and not self.nested_exp()

    @property
    def verifiable(self) -> bool:
        """True when the finite-field verifier can check this program: every operator has field
        semantics (Lax ones exactly, uninterpreted functions and max/min as random functions),
        and no exp is nested in an exp."""
        return not self.nested_exp()

    @property
    def uninterpreted_ops(self) -> set[str]:
        """Non-Lax operators used (sqrt, silu, ..., max, min: Lax classes ``uf`` and
        ``select``)."""
        return {t.op for t in self.nodes()
                if _ops.lax_class(t.op, t.attrs) in ("uf", "select")}

    def nested_exp(self) -> list[Tensor]:
        """exp nodes with another exp below them (not through an opaque operator: an
        uninterpreted function or a max/min, whose results the verifier draws fresh)."""
        under: dict[str, bool] = {}
        bad = []
        for t in self.nodes():
            below = any(under[i.digest] or i.op == "exp" for i in t.inputs
                        if not _ops.OPS[i.op].opaque)
            under[t.digest] = below
            if t.op == "exp" and below:
                bad.append(t)
        return bad

    # -- evaluation -----------------------------------------------------------------------------
    def _check_names(self, inputs: Mapping[str, Any]) -> None:
        if not isinstance(inputs, Mapping):
            raise ProgramError(f"Program {self.name!r}: inputs must be a dict name -> array")
        missing = [n for n in self._inputs if n not in inputs]
        if missing:
            raise ProgramError(f"Program {self.name!r}: missing input(s) {', '.join(missing)}")
        extra = [n for n in inputs if n not in self._inputs]
        if extra:
            raise ProgramError(f"Program {self.name!r}: unknown input(s) {', '.join(map(str, extra))}"
                               f"; inputs are {', '.join(self._inputs)}")

    def _check_input(self, n: str, value: Any) -> np.ndarray:
        """One input as an array, checked against its declared dtype kind and shape."""
        t = self._inputs[n]
        a = np.asarray(value)
        if a.dtype.kind not in "biuf":
            raise DTypeError(f"Program {self.name!r}: input {n!r} {_fmt(a.shape)} has dtype "
                             f"{a.dtype}, not a real number type")
        if _ops.is_index(t.dtype) and a.dtype.kind not in "iu":
            raise DTypeError(f"Program {self.name!r}: input {n!r} {_fmt(a.shape)} is an "
                             f"index tensor ({t.dtype}) but was given {a.dtype} values; "
                             "pass integers")
        if a.shape != t.shape and not t.symbolic:
            raise ShapeError(f"Program {self.name!r}: input {n!r} has shape {_fmt(a.shape)}, "
                             f"declared {_fmt(t.shape)}")
        return a

    def check_inputs(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Inputs as arrays, checked against the declared names and shapes."""
        self._check_names(inputs)
        out = {}
        for n in self._inputs:
            a = self._check_input(n, inputs[n])
            out[n] = a
        if self.symbolic:
            self.bind({n: a.shape for n, a in out.items()})
        return out

    def evaluate(self, inputs: Mapping[str, Any], dtype: Any = np.float64, *,
                 backend: Any = None, sizes: Mapping[str, int] | None = None) -> dict[str, Any]:
        """Reference semantics: evaluate in ``dtype`` (float64 by default) with NumPy.

        ``backend`` (a :class:`mirage_py.lax.backend.Backend`) evaluates the same operators with
        other arithmetic -- the verifier's finite field, degree bounds -- instead; ``inputs`` are
        then values of that backend (anything with a ``shape``) and ``dtype`` is ignored. A
        symbolic program binds its dims from the inputs' shapes; ``sizes`` gives the dims a
        program's masks name without a tensor of that size (:attr:`params`: the valid sizes of
        a padded program, lax/family.py).
        """
        if self.symbolic:  # bind the dims from the inputs, then the static program
            bound = self.bind({n: np.shape(v) for n, v in self.check_inputs(inputs).items()}
                              if backend is None else {n: v.shape for n, v in inputs.items()})
            return self.at(bound).evaluate(inputs, dtype, backend=backend, sizes=sizes)
        missing = sorted(set(self.params) - set(sizes or {}))
        if missing:
            raise ShapeError(f"Program {self.name!r}: its masks need the size of "
                             f"{', '.join(missing)} (evaluate(..., sizes=...))")
        if backend is not None:
            return self._evaluate_on(backend, inputs, sizes)
        self._check_names(inputs)
        order = self.lean_order()
        readers: dict[str, set[str]] = {}
        for t, _ in order:
            for i in t.inputs:
                readers.setdefault(i.digest, set()).add(t.op)
        outs = {t.digest for t in self._outputs.values()}
        vals: dict[str, np.ndarray] = {}
        for t, drop in order:
            if t.op == "input":  # fetched at its first reader (inputs may be drawn lazily)
                a = self._check_input(t.name, inputs[t.name])
                if _ops.is_index(t.dtype):
                    vals[t.digest] = a.astype(np.int64, copy=False)
                elif readers.get(t.digest) == {"matmul"} and t.digest not in outs and \
                        a.ndim >= 2 and a.dtype.kind == "f" and \
                        a.dtype.itemsize < np.dtype(dtype).itemsize:
                    vals[t.digest] = a  # widened a slice at a time by its matmuls
                else:
                    vals[t.digest] = a.astype(dtype, copy=False)
            elif t.op == "const":
                vals[t.digest] = np.asarray(t.attr("value"), dtype=dtype)
            elif t.op == "mask":
                vals[t.digest] = _ops.mask_values(t.shape, **t.attr_dict,
                                                  sizes=sizes).astype(dtype)
            elif t.op == "matmul":
                vals[t.digest] = _wide_matmul(vals[t.inputs[0].digest], vals[t.inputs[1].digest],
                                              np.dtype(dtype), t.attr_dict)
            else:
                # np.asarray: a full reduction gives a NumPy scalar; keep every value an array
                vals[t.digest] = np.asarray(_ops.compute(t.op, [vals[i.digest] for i in t.inputs],
                                                         t.attr_dict)).astype(dtype, copy=False)
            for d in drop:
                del vals[d]
        # an output that is an input would otherwise alias the caller's array
        return {n: vals[t.digest].copy() if t.op == "input" else vals[t.digest]
                for n, t in self._outputs.items()}

    def _evaluate_on(self, backend: Any, inputs: Mapping[str, Any],
                     sizes: Mapping[str, int] | None = None) -> dict[str, Any]:
        if not isinstance(inputs, Mapping):
            raise ProgramError(f"Program {self.name!r}: inputs must be a dict name -> value")
        missing = [n for n in self._inputs if n not in inputs]
        extra = [n for n in inputs if n not in self._inputs]
        if missing or extra:
            raise ProgramError(f"Program {self.name!r}: inputs {sorted(map(str, inputs))} do not "
                               f"match the declared {list(self._inputs)}")
        vals: dict[str, Any] = {}
        for t, drop in self.lean_order():
            backend.annotate(f"program {self.name!r}: {t.op} {_fmt(t.shape)}")
            if t.op == "input":
                v = inputs[t.name]
                if tuple(v.shape) != t.shape:
                    raise ShapeError(f"Program {self.name!r}: input {t.name!r} has shape "
                                     f"{_fmt(tuple(v.shape))}, declared {_fmt(t.shape)}")
                vals[t.digest] = backend.input(v, t.dtype)
            elif t.op == "const":
                vals[t.digest] = backend.scalar(float(t.attr("value")))
            elif t.op == "mask":
                vals[t.digest] = backend.data(_ops.mask_values(t.shape, **t.attr_dict,
                                                               sizes=sizes))
            else:
                vals[t.digest] = backend.compute(t.op, [vals[i.digest] for i in t.inputs],
                                                 t.attr_dict)
            for d in drop:
                del vals[d]
        return {n: vals[t.digest] for n, t in self._outputs.items()}

    def random_inputs(self, seed: int = 0, scale: float = 1.0,
                      sizes: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
        """Normal random float64 inputs of the declared shapes (``scale`` times N(0,1)), and
        for an index input uniform valid indices (int64 in ``[0, bound)``,
        :meth:`index_bounds`); a symbolic program's dims take ``sizes`` (default: each dim's
        smallest size)."""
        rng = np.random.default_rng(seed)
        if self.symbolic:
            sizes = {n: d.lo for n, d in self.dims.items()} if sizes is None else sizes
        bounds = self.index_bounds()
        out = {}
        for n, t in self._inputs.items():
            shape = resolve(t.shape, sizes or {})
            if n in bounds:
                out[n] = rng.integers(0, resolve(bounds[n], sizes or {}), size=shape,
                                      dtype=np.int64)
            else:
                out[n] = scale * rng.standard_normal(shape)
        return out

    # -- identity and persistence ---------------------------------------------------------------
    def structural_hash(self) -> str:
        """SHA-256 of the structure (inputs, operators, outputs); the name is not part of it."""
        key = json.dumps({"inputs": [[n, [json_size(d) for d in t.shape], t.dtype]
                                     for n, t in self._inputs.items()],
                          "outputs": [[n, t.digest] for n, t in self._outputs.items()]},
                         separators=(",", ":"))
        return hashlib.sha256(key.encode()).hexdigest()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Program) and other.name == self.name and \
            other.structural_hash() == self.structural_hash()

    def __hash__(self) -> int:
        return int(self.structural_hash()[:16], 16)

    def to_json(self) -> dict[str, Any]:
        ids = self.node_ids()
        nodes = []
        for t in self.nodes():
            nodes.append({"id": ids[t.digest], "op": t.op,
                          "inputs": [ids[i.digest] for i in t.inputs],
                          "attrs": {k: _json_attr(v) for k, v in t.attrs},
                          "shape": [json_size(d) for d in t.shape], "dtype": t.dtype})
        return {"format": FORMAT, "version": FORMAT_VERSION, "name": self.name, "nodes": nodes,
                "outputs": [{"name": n, "node": ids[t.digest]} for n, t in self._outputs.items()]}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "Program":
        try:
            if doc.get("format") != FORMAT:
                raise SerializationError(f"not a serialized program (format={doc.get('format')!r})")
            if doc.get("version") != FORMAT_VERSION:
                raise SerializationError(f"program format version {doc.get('version')!r} is not "
                                         f"supported (expected {FORMAT_VERSION})")
            p = cls(doc["name"])
            built: dict[int, Tensor] = {}
            for nd in doc["nodes"]:
                op = nd["op"]
                attrs = {k: _from_json_attr(v) for k, v in nd["attrs"].items()}
                shape = tuple(size_from_json(d) for d in nd["shape"])
                if op == "input":
                    t = p.input(attrs["name"], shape, nd["dtype"])
                elif op == "const":
                    t = const(attrs["value"], nd["dtype"])
                elif op == "mask":
                    t = mask_from_attrs(shape, attrs)
                elif op not in _ops.OPS:
                    raise SerializationError(f"unknown operator {op!r} in node {nd['id']!r}")
                else:
                    # re-infer shape and dtype with the operator's own checks
                    t = apply(op, [built[i] for i in nd["inputs"]], attrs)
                if t.shape != shape or t.dtype != nd["dtype"]:
                    raise SerializationError(
                        f"node {nd['id']!r} ({op}) records {_fmt(shape)} "
                        f"{nd['dtype']}, but its operands give {_fmt(t.shape)} {t.dtype}")
                if nd["id"] in built:
                    raise SerializationError(f"node id {nd['id']!r} appears twice")
                built[nd["id"]] = t
            for o in doc["outputs"]:
                p.output(built[o["node"]], o["name"])
            return p
        except SerializationError:
            raise
        except MirageError as e:
            raise SerializationError(f"invalid program JSON: {e}") from None
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
            raise SerializationError(f"malformed program JSON: {type(e).__name__}: {e}") from None

    @classmethod
    def loads(cls, text: str) -> "Program":
        try:
            doc = json.loads(text)
        except (json.JSONDecodeError, TypeError) as e:
            raise SerializationError(f"program JSON does not parse: {e}") from None
        if not isinstance(doc, dict):
            raise SerializationError("program JSON must be an object")
        return cls.from_json(doc)

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            f.write(self.dumps())

    @classmethod
    def load(cls, path: str) -> "Program":
        with open(path) as f:
            return cls.loads(f.read())

    # -- printing -------------------------------------------------------------------------------
    def __str__(self) -> str:
        ids = self.node_ids()

        def ref(t: Tensor) -> str:
            if t.op == "input":
                return t.name
            if t.op == "const":
                return repr(t.attr("value"))
            return f"%{ids[t.digest]}"

        lines = [f"program {self.name}"]
        for t in self.nodes():
            if t.op == "input":
                lines.append(f"  {t.name}: {_fmt(t.shape)} {t.dtype}")
            elif t.op != "const":
                args = [ref(i) for i in t.inputs] + [f"{k}={v}" for k, v in t.attrs]
                lines.append(f"  {ref(t)} = {t.op}({', '.join(args)}) : {_fmt(t.shape)} {t.dtype}")
        for n, t in self._outputs.items():
            lines.append(f"  {n} = {ref(t)}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"Program({self.name!r}, inputs={[t.name for t in self.inputs]}, "
                f"outputs={list(self._outputs)})")


class Output:
    """A named program output."""

    __slots__ = ("name", "tensor")

    def __init__(self, name: str, tensor: Tensor):
        self.name = name
        self.tensor = tensor

    @property
    def shape(self) -> tuple[int, ...]:
        return self.tensor.shape

    @property
    def dtype(self) -> str:
        return self.tensor.dtype

    def __repr__(self) -> str:
        return f"Output({self.name!r}, shape={_fmt(self.shape)}, dtype={self.dtype})"


#: elements of a narrow (float16 / float32) matmul operand widened at once by ``_wide_matmul``
WIDEN_CHUNK = 1 << 24


def _wide_matmul(a: np.ndarray, b: np.ndarray, dtype: np.dtype, attrs: dict) -> np.ndarray:
    """``a @ b`` in ``dtype`` where an operand is still in a narrower storage dtype (a weight
    read by matmuls only, ``Program.evaluate``): the narrow operand widened a slice of columns
    (of ``b``) or rows (of ``a``) at a time, so a float64 reference never holds a float64 copy
    of a whole weight. The same float64 products as widening first (sums may round in another
    order)."""
    if (a.dtype == dtype and b.dtype == dtype) or a.ndim < 2 or b.ndim < 2:
        a, b = a.astype(dtype, copy=False), b.astype(dtype, copy=False)
        return np.asarray(_ops.compute("matmul", [a, b], attrs)).astype(dtype, copy=False)
    if b.dtype != dtype:
        a = a.astype(dtype, copy=False)
        n = b.shape[-1]
        step = max(1, WIDEN_CHUNK // max(1, b.size // max(n, 1)))
        parts = [np.asarray(_ops.compute("matmul", [a, b[..., j:j + step].astype(dtype)], attrs))
                 for j in range(0, n, step)]
        return np.concatenate(parts, axis=-1).astype(dtype, copy=False)
    m = a.shape[-2]
    step = max(1, WIDEN_CHUNK // max(1, a.size // max(m, 1)))
    parts = [np.asarray(_ops.compute("matmul", [a[..., i:i + step, :].astype(dtype), b], attrs))
             for i in range(0, m, step)]
    return np.concatenate(parts, axis=-2).astype(dtype, copy=False)


def _from_json_attr(v: Any) -> Any:
    if isinstance(v, dict):
        return float(v["f"]) if "f" in v else size_from_json(v)
    if isinstance(v, list):
        return tuple(_from_json_attr(x) for x in v)
    return v


__all__ = ["Program", "Output", "const"]
