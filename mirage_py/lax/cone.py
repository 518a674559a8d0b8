"""Read cones: which input elements one output element depends on, structurally.

Walking a program backwards from one element of an output, every operator passes the set of
elements it needs on to its operands: an elementwise operator the same positions (collapsed
over the dims its operand broadcasts), a reduction the whole reduced range, a matmul a row of its
left and a column of its right operand, shape operators the positions they moved. The sets are
NumPy boolean arrays of the operands' shapes; what reaches an input is its *cone*.

The dependence is structural: ``x - x`` needs ``x``. Masks are leaves, like inputs, and a
masked position still needs what the mask selects away (``where`` reads both branches).

The cost model's lower bound uses it: a single graph-defined kernel computes every element of an
output in one block (blocks of one kernel do not exchange data), so some block loads a whole
cone (:func:`mirage_py.cost_model.lower_bound_us`).
"""

from __future__ import annotations

import numpy as np

from .ops import DTYPES


def _unbroadcast(need: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``need`` (of a broadcast result's shape) collapsed onto an operand of ``shape``."""
    extra = need.ndim - len(shape)
    if extra > 0:
        need = need.any(axis=tuple(range(extra)))
    axes = tuple(i for i, (n, d) in enumerate(zip(shape, need.shape)) if n == 1 and d != 1)
    if axes:
        need = need.any(axis=axes, keepdims=True)
    return np.broadcast_to(need, shape)


def _operand_needs(t, need: np.ndarray) -> list[np.ndarray | None]:
    """What each operand of node ``t`` needs for the elements ``need`` of its result."""
    op = t.op
    ins = t.inputs
    if op == "matmul":
        a, b = ins
        batch = need.shape[:-2]
        m, n = need.shape[-2:]
        k = a.shape[-1]
        rows = need.any(axis=-1)[..., None]  # (..., m, 1): every k of those rows
        cols = need.any(axis=-2)[..., None, :]  # (..., 1, n): every k of those columns
        return [_unbroadcast(np.broadcast_to(rows, batch + (m, k)), a.shape),
                _unbroadcast(np.broadcast_to(cols, batch + (k, n)), b.shape)]
    if op in ("sum", "max", "min"):
        (x,) = ins
        axes = tuple(a % x.ndim for a in t.attr("axes"))
        if not t.attr("keepdims"):
            need = np.expand_dims(need, axes)
        return [np.broadcast_to(need.any(axis=axes, keepdims=True), x.shape)]
    if op == "reshape":
        return [need.reshape(ins[0].shape)]
    if op == "transpose":
        return [np.transpose(need, np.argsort(t.attr("perm")))]
    if op == "slice":
        (x,) = ins
        out = np.zeros(x.shape, dtype=bool)
        axis = t.attr("axis") % x.ndim
        out[(slice(None),) * axis + (slice(t.attr("start"), t.attr("stop")),)] = need
        return [out]
    if op == "take":
        # element (i..., j...) reads ids[i...] and table[ids[i...], j...]: which row is known
        # only at run time, so the table's cone is counted as one row (the indices may repeat)
        # with the columns needed -- a lower bound, as the cost model's bound wants
        table, ids = ins
        k = ids.ndim
        cols = need.any(axis=tuple(range(k))) if k else need
        tneed = np.zeros(table.shape, dtype=bool)
        tneed[0] = cols
        return [tneed, need.any(axis=tuple(range(k, need.ndim))) if need.ndim > k else need]
    if op == "concat":
        axis = t.attr("axis") % t.ndim
        cuts = np.cumsum([x.shape[axis] for x in ins])[:-1]
        return list(np.split(need, cuts, axis=axis))
    # elementwise (unary, binary, ternary; numpy broadcasting)
    return [_unbroadcast(need, x.shape) for x in ins]


def cone_masks(program, output: str, index: tuple[int, ...] | None = None
               ) -> dict[str, np.ndarray]:
    """The elements of each input that element ``index`` of ``output`` depends on (its last
    element by default), as boolean arrays of the inputs' shapes, by input name; inputs it
    does not reach are left out."""
    out = program.output_tensors[output]
    if index is None:
        index = tuple(n - 1 for n in out.shape)
    seed = np.zeros(out.shape, dtype=bool)
    seed[index] = True
    needs: dict[str, np.ndarray] = {out.digest: seed}
    cone: dict[str, np.ndarray] = {}
    for t in reversed(program.nodes()):
        need = needs.pop(t.digest, None)
        if need is None or t.op in ("const", "mask"):
            continue
        if t.op == "input":
            cone[t.name] = np.array(need)
            continue
        for x, nx in zip(t.inputs, _operand_needs(t, need)):
            if x.op in ("const", "mask"):
                continue
            prev = needs.get(x.digest)
            needs[x.digest] = nx if prev is None else (prev | nx)
    return cone


def read_cone(program, output: str, index: tuple[int, ...] | None = None) -> dict[str, int]:
    """How many elements of each input element ``index`` of ``output`` depends on
    (:func:`cone_masks` counted)."""
    return {n: int(np.count_nonzero(m)) for n, m in cone_masks(program, output, index).items()}


# the walk keeps a boolean array per tensor: above this many elements in one tensor (a
# 4096-token prefill's 32 x 4096 x 4096 attention scores) it is not taken
MAX_ELEMENTS = 1 << 24


def cone_bytes(program) -> int:
    """The most bytes of inputs one output element depends on, over the program's outputs (each
    output's last element); 0 -- no information -- for a program with a tensor of more than
    ``MAX_ELEMENTS`` elements."""
    if any(t.size > MAX_ELEMENTS for t in program.nodes()):
        return 0
    dtypes = {t.name: t.dtype for t in program.inputs}
    best = 0
    for name in program.output_tensors:
        cone = read_cone(program, name)
        best = max(best, sum(n * DTYPES[dtypes[x]] for x, n in cone.items()))
    return best

