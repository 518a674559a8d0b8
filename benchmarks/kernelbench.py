"""KernelBench's own problem files through the PyTorch frontend: capture, fuse, verify, compare.

A KernelBench-format file (https://github.com/ScalingIntelligence/KernelBench, ``KernelBench/
level{1,2,3}/*.py``) defines ``class Model(nn.Module)``, ``get_inputs()`` and
``get_init_inputs()``, with the sizes as module-level integer constants (``batch_size = 128``,
``in_features = 8192``, ``layer_sizes = [...]``). For each file this reports:

* **captured**: ``mp.from_torch(model, inputs)`` gives one ``Program`` (else the reason: the
  frontend's ``UnsupportedOperatorError`` names the aten operator and where it is);
* **fused**: ``mp.superopt`` of that program, kernels naive -> found;
* **verified**: every chosen μGraph proved equivalent (finite-field random tests);
* **equal to eager**: ``mp.compile(model, inputs)`` run on the CPU (the μGraph interpreter at GPU
  precision: float32 storage, tensor-core operands rounded to float16; eager PyTorch for what
  could not be captured) equals the eager model within ``--tolerance`` (norm-wise relative).

The models run in eval mode (dropout off, batch norm with running statistics), in float32, on
``get_inputs()`` after ``torch.manual_seed(0)``.

**Sizes** (``--scale``): KernelBench's sizes are for GPUs (a 4096 x 393216 softmax). ``auto``
(default) divides the size constants by the smallest power of two that brings the problem under
``--max-elements`` (inputs + parameters + buffers) and ``--max-flops`` (PyTorch's flop counter),
both measured on the meta device without allocating; an integer N divides by N; 1 keeps the
file's sizes. Only integer constants >= 16 scale (a ``reduce_dim = 1`` or ``n_head = 8`` stays),
never below 8, and divisibility among the file's constants is kept (``n_embd % n_head == 0``,
``dim1 % dim2``...): a scaled value is rounded to a multiple of the scaled values of the
constants that divided it. The table shows the factor and the file's text is never changed (the
scaled module is compiled from its syntax tree).

Each problem runs in a child process with a wall-clock limit (a hang or a crash is a row, not
the end of the run), and each row is appended to ``<out>.jsonl`` as it finishes, so an
interrupted run resumes where it stopped (``--resume``)::

    python -m benchmarks.kernelbench KernelBench/level1/19_ReLU.py         # one file
    python -m benchmarks.kernelbench KernelBench/level2 --exclude conv     # a folder
    python -m benchmarks.kernelbench --issue-set KernelBench/ --time-budget 30 \\
        --out benchmarks/results/kernelbench_torch                        # the committed table

``--issue-set ROOT`` selects the problems the table covers: every level-1 and level-2 problem
without a convolution (no ``conv`` in the file name), and the level-3 MLPs and attention blocks
(``LEVEL3_SET``). The KernelBench files are not part of this repository: pass the path of a
checkout.
"""

from __future__ import annotations

import argparse
import ast
import datetime as _dt
import inspect
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import mirage_py as mp  # noqa: E402
from mirage_py.errors import MirageError  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "kernelbench_torch"

# level 3: the MLPs and the attention blocks (models without convolutions built from linear
# layers, norms and attention)
LEVEL3_SET = ("1_MLP", "2_ShallowWideMLP", "3_DeepNarrowMLP", "31_VisionAttention",
              "43_MinGPTCausalAttention", "44_MiniGPTBlock", "50_ReLUSelfAttention")

SCALE_THRESHOLD = 16  # integer constants below this are not sizes (dims, head counts, kernels)
SCALE_FLOOR = 8  # a scaled size never goes below min(its value, this)


class KernelBenchFileError(MirageError, ValueError):
    """A file that is not a usable KernelBench problem: it does not parse, lacks ``Model`` /
    ``get_inputs`` / ``get_init_inputs``, or fails to build. The message names the file."""


# ---- size constants --------------------------------------------------------------------------

def _int_expr(node: ast.AST) -> int | None:
    """The value of an integer expression made of literals and + - * // ** (no names)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = _int_expr(node.operand)
        return None if v is None else -v
    if isinstance(node, ast.BinOp):
        a, b = _int_expr(node.left), _int_expr(node.right)
        if a is None or b is None:
            return None
        ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
               ast.FloorDiv: lambda: a // b if b else None,
               ast.Pow: lambda: a ** b if 0 <= b <= 64 else None}
        f = ops.get(type(node.op))
        return f() if f else None
    return None


def _constant_value(node: ast.AST) -> int | list[int] | tuple[int, ...] | None:
    """An integer, or a list / tuple of integers (``[1024] * 16`` included), or None."""
    v = _int_expr(node)
    if v is not None:
        return v
    if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
        vals = [_int_expr(e) for e in node.elts]
        if all(x is not None for x in vals):
            return vals if isinstance(node, ast.List) else tuple(vals)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        seq, n = (node.left, node.right) if isinstance(node.left, (ast.List, ast.Tuple)) \
            else (node.right, node.left)
        base, times = _constant_value(seq), _int_expr(n)
        if isinstance(base, (list, tuple)) and times is not None and 0 <= times <= 4096:
            return base * times
    return None


def size_constants(tree: ast.Module) -> dict[str, tuple[ast.AST, Any]]:
    """Module-level ``name = <integer expression or list of them>`` assignments, by name (the
    last assignment wins, as when the module runs)."""
    out = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                and isinstance(stmt.targets[0], ast.Name):
            name, value = stmt.targets[0].id, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) \
                and stmt.value is not None:
            name, value = stmt.target.id, stmt.value
        else:
            continue
        v = _constant_value(value)
        if v is not None:
            out[name] = (stmt, v)
        else:
            out.pop(name, None)
    return out


def scale_values(values: list[int], factor: int, threshold: int = SCALE_THRESHOLD,
                 floor: int = SCALE_FLOOR) -> dict[int, int]:
    """Map each integer to its scaled value: ``round(v / factor)`` for ``v >= threshold``
    (never below ``min(v, floor)``), rounded to a multiple of the scaled values of every other
    value that divides ``v`` so that divisibility is kept; smaller values stay. Equal values
    scale alike, larger values never become smaller than smaller ones' multiples."""
    if not isinstance(factor, int) or factor < 1:
        raise KernelBenchFileError(f"scale factor must be a positive int, got {factor!r}")
    distinct = sorted({v for v in values})
    new: dict[int, int] = {}
    for v in distinct:
        if factor == 1 or v < threshold:
            new[v] = v
            continue
        t = max(min(v, floor), round(v / factor))
        lcm = 1
        for b in distinct:
            if 2 <= b < v and v % b == 0:
                lcm = math.lcm(lcm, new[b])
        if lcm > 1:
            t = lcm * max(1, round(t / lcm))
        new[v] = t
    return new


@dataclass
class LoadedProblem:
    path: Path
    factor: int
    module: types.ModuleType
    constants: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # name -> (file, used)

    @property
    def Model(self):  # noqa: N802 -- KernelBench's name
        return self.module.Model

    def get_inputs(self):
        return self.module.get_inputs()

    def get_init_inputs(self):
        return self.module.get_init_inputs()


def load_problem(path: str | Path, factor: int = 1) -> LoadedProblem:
    """Import the KernelBench file at ``path`` with its size constants divided by ``factor``
    (``scale_values``). The file is read, never written; the scaled module keeps the file's
    name and line numbers for tracebacks."""
    path = Path(path)
    try:
        text = path.read_text()
        tree = ast.parse(text, filename=str(path))
    except OSError as e:
        raise KernelBenchFileError(f"{path}: cannot read: {e.strerror}") from None
    except SyntaxError as e:
        raise KernelBenchFileError(f"{path}:{e.lineno}: syntax error: {e.msg}") from None
    consts = size_constants(tree)
    flat = [x for _, v in consts.values() for x in (v if isinstance(v, (list, tuple)) else [v])]
    mapping = scale_values(flat, factor)
    changed = {}
    for name, (stmt, v) in consts.items():
        nv = type(v)(mapping[x] for x in v) if isinstance(v, (list, tuple)) else mapping[v]
        if nv == v:
            continue
        changed[name] = (v, nv)
        if isinstance(nv, (list, tuple)):
            kind = ast.List if isinstance(nv, list) else ast.Tuple
            node = kind(elts=[ast.Constant(x) for x in nv], ctx=ast.Load())
        else:
            node = ast.Constant(nv)
        stmt.value = ast.copy_location(node, stmt.value)
        ast.fix_missing_locations(stmt)
    mod_name = "kernelbench_" + re.sub(r"\W", "_", path.stem)
    module = types.ModuleType(mod_name)
    module.__file__ = str(path)
    sys.modules[mod_name] = module  # classes resolve their module (inspect, pickling)
    try:
        exec(compile(tree, str(path), "exec"), module.__dict__)
    except Exception as e:
        raise KernelBenchFileError(f"{path}: importing it failed: {type(e).__name__}: {e}") \
            from e
    for name in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, name):
            raise KernelBenchFileError(f"{path}: no {name} defined: a KernelBench file has "
                                       "class Model(nn.Module), get_inputs() and "
                                       "get_init_inputs()")
    return LoadedProblem(path, factor, module, changed)


def _tensors(xs) -> list:
    import torch
    return [x for x in xs if isinstance(x, torch.Tensor)]


def measure(problem: LoadedProblem) -> tuple[int, int | None]:
    """(elements of inputs + parameters + buffers, forward flops or None), on the meta device:
    nothing is allocated."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        model = problem.Model(*problem.get_init_inputs())
        inputs = problem.get_inputs()
    elements = sum(t.numel() for t in _tensors(inputs))
    elements += sum(p.numel() for p in model.parameters())
    elements += sum(b.numel() for b in model.buffers())
    try:
        with FlopCounterMode(display=False) as fc:
            model.eval()(*inputs)
        flops = int(fc.get_total_flops())
    except Exception:  # an operator without a meta kernel, data-dependent control flow
        flops = None
    return elements, flops


def choose_factor(path: str | Path, max_elements: int, max_flops: int,
                  limit: int = 4096) -> tuple[LoadedProblem, int, int | None]:
    """The smallest power-of-two factor under both budgets (or ``limit``), loaded."""
    f = 1
    while True:
        prob = load_problem(path, f)
        try:
            elements, flops = measure(prob)
        except Exception as e:
            if f >= 16:
                raise KernelBenchFileError(f"{path}: building the model on the meta device "
                                           f"failed: {type(e).__name__}: {e}") from e
            f *= 2  # some models only build small (an assertion on a size, memory)
            continue
        if (elements <= max_elements and (flops is None or flops <= max_flops)) or f >= limit:
            return prob, elements, flops
        f *= 2


# ---- one problem -----------------------------------------------------------------------------

def _rel(a, b) -> float:
    import numpy as np
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return math.inf
    den = float(np.linalg.norm(b))
    diff = float(np.linalg.norm(a - b))
    return diff / den if den > 0 else diff


def _flat_outputs(out) -> list:
    import torch
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat_outputs(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _flat_outputs(o)]
    return []


def _allclose(got, want, tol: float = 1e-4) -> bool:
    """KernelBench's own check of a float32 answer: ``torch.allclose(atol=rtol=tol)`` on every
    output (a missing or reshaped output fails)."""
    import torch
    g, w = _flat_outputs(got), _flat_outputs(want)
    if len(g) != len(w) or not w:
        return False
    for a, b in zip(g, w):
        a = a.detach().cpu() if isinstance(a, torch.Tensor) else torch.as_tensor(a)
        b = b.detach().cpu()
        if a.shape != b.shape or not torch.allclose(a.to(b.dtype), b, atol=tol, rtol=tol):
            return False
    return True


def _compare(got, want) -> float:
    """Largest norm-wise relative error over the outputs (inf for a missing output, a shape
    mismatch or a non-float output that differs)."""
    import torch
    g, w = _flat_outputs(got), _flat_outputs(want)
    if len(g) != len(w) or not w:
        return math.inf
    worst = 0.0
    for a, b in zip(g, w):
        a = a.detach().cpu() if isinstance(a, torch.Tensor) else torch.as_tensor(a)
        b = b.detach().cpu()
        if not b.is_floating_point():
            worst = max(worst, 0.0 if torch.equal(a.to(b.dtype), b) else math.inf)
        else:
            worst = max(worst, _rel(a.double().numpy(), b.double().numpy()))
    return worst


def _why(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}"[:400]


def _program_inputs(model, inputs: list, program) -> dict:
    """The captured program's inputs as float64 arrays: user inputs by the forward's argument
    names, parameters and buffers by their qualified names (the frontend's naming)."""
    import torch
    sig = inspect.signature(model.forward)
    bound = sig.bind(*inputs).arguments
    named = {k: v for k, v in bound.items() if isinstance(v, torch.Tensor)}
    named.update(dict(model.named_parameters(remove_duplicate=False)))
    named.update(dict(model.named_buffers(remove_duplicate=False)))
    out = {}
    for t in program.inputs:
        if t.name not in named:
            raise KeyError(f"program input {t.name!r} is neither an argument of forward nor a "
                           "parameter or buffer")
        out[t.name] = named[t.name].detach().double().numpy()
    return out


def run_problem(path: str | Path, *, scale: str | int = "auto", max_elements: int = 1 << 18,
                max_flops: int = 1 << 28, time_budget_s: float = 30.0, workers: int = 1,
                target: str = "h100", tolerance: float = 1e-2,
                database: str | None = None) -> dict:
    """Capture, superoptimise, compile and compare one KernelBench file; returns its row."""
    import torch

    path = Path(path)
    row: dict[str, Any] = _identity(path)
    t_start = time.perf_counter()
    # 1. load, scale, build, eager
    try:
        if scale == "auto":
            prob, elements, flops = choose_factor(path, max_elements, max_flops)
        else:
            prob = load_problem(path, int(scale))
            elements, flops = measure(prob)
    except MirageError as e:
        row.update(stage="load", why=_why(e))
        return row
    row.update(scale=prob.factor, elements=elements, flops=flops,
               constants={k: [a, b] for k, (a, b) in prob.constants.items()})
    try:
        torch.manual_seed(0)
        model = prob.Model(*prob.get_init_inputs()).eval()
        torch.manual_seed(0)
        inputs = list(prob.get_inputs())
        with torch.no_grad():
            want = model(*inputs)
    except Exception as e:
        row.update(stage="eager", why="the eager model fails: " + _why(e))
        return row
    row["inputs"] = [list(t.shape) if isinstance(t, torch.Tensor) else repr(t) for t in inputs]
    from_torch, compile_ = frontend()
    if from_torch is None:
        row.update(stage="capture", captured=False,
                   why="the PyTorch frontend is missing (mirage_py has no from_torch)")
        return row
    with tempfile.TemporaryDirectory(prefix="kb_db_") as tmp:
        # a fresh results database per problem (searched, not remembered), shared by superopt
        # and compile so that compile finds the regions superopt searched
        db = database or str(Path(tmp) / "results.sqlite")
        _capture_and_compile(row, model, inputs, want, db, from_torch, compile_, target,
                             time_budget_s, workers, tolerance)
    row["seconds"] = round(time.perf_counter() - t_start, 1)
    row["why"] = why_not(row)
    row["why_not_one_kernel"] = not_one_kernel(row)
    return row


def _capture_and_compile(row: dict, model, inputs: list, want, db: str, from_torch, compile_,
                         target: str, time_budget_s: float, workers: int,
                         tolerance: float) -> None:
    """Steps 2-4 of ``run_problem``: capture, superopt, compile and compare, into ``row``."""
    import numpy as np
    import torch

    # 2. capture
    try:
        program = from_torch(model, tuple(inputs))
        row["captured"] = True
        row["program_inputs"] = len(program.inputs)
        row["program_nodes"] = len(program.nodes())
    except MirageError as e:
        row["captured"] = False
        row["capture_error"] = _why(e)
        for attr in ("op", "node", "module", "location"):
            if getattr(e, attr, ""):
                row[f"unsupported_{attr}"] = str(getattr(e, attr))
        program = None
    except Exception as e:  # a frontend bug: report it as such
        row.update(captured=False, capture_error="frontend crashed: " + _why(e))
        program = None

    # 3. superopt the captured program: fused, verified
    if program is not None:
        try:
            t0 = time.perf_counter()
            opt = mp.superopt(program, target=target, time_budget_s=time_budget_s,
                              workers=workers, progress=False, database=db)
            row["search_seconds"] = round(time.perf_counter() - t0, 1)
            row["kernels_naive"] = opt.naive_num_kernels
            row["kernels_found"] = opt.num_kernels
            row["fused"] = opt.num_kernels < opt.naive_num_kernels or opt.num_kernels == 1
            row["verified"] = all(v is not None and v.equivalent for v in opt.verification)
            bounds = [v.bound for v in opt.verification if v is not None]
            row["bound"] = max(bounds) if bounds else None
            row["predicted_us_naive"] = round(opt.naive_estimated_time_us, 2)
            row["predicted_us_found"] = round(opt.estimated_time_us, 2)
            if opt.num_kernels > 1:
                row.update(_one_kernel(program, target, time_budget_s))
            try:
                x = program.bind(model, *inputs) if hasattr(program, "bind") else \
                    _program_inputs(model, inputs, program)
                got = opt.run_numpy(x)
                outs = [torch.from_numpy(np.array(got[o.name])) for o in program.outputs]
                row["superopt_rel_err"] = _compare(outs, want)
            except Exception as e:
                row["superopt_check_error"] = _why(e)
        except Exception as e:
            row["superopt_error"] = _why(e)

    # 4. compile and compare with eager
    if compile_ is None:
        row["compile_error"] = "mirage_py has no compile"
    else:
        try:
            t0 = time.perf_counter()
            compiled = compile_(model, tuple(inputs), target=target,
                                time_budget_s=time_budget_s, workers=workers, database=db)
            row["compile_seconds"] = round(time.perf_counter() - t0, 1)
            with torch.no_grad():
                got = compiled(*inputs)
            row["rel_err"] = _compare(got, want)
            row["equal"] = row["rel_err"] <= tolerance
            row["allclose_1e-4"] = _allclose(got, want)
            _compile_details(compiled, row)
        except Exception as e:
            row["compile_error"] = _why(e)


def _one_kernel(program, target: str, time_budget_s: float) -> dict[str, Any]:
    """Why superopt's answer is more than one kernel, as the search sees it: the generator's
    search of the whole program (each of its algebraic forms) limited to one kernel, the
    structures found tuned and ranked by the same cost model as superopt's (``explore`` with
    ``max_kernels=1``). Either a one-kernel graph exists and is predicted slower than the answer
    (``one_kernel_us``), or there is none -- in the whole search space when the search ran to
    its end (``one_kernel_complete``), or none found within the budget."""
    from mirage_py.superopt.search import Settings, default_model, explore
    t0 = time.perf_counter()
    try:
        ex = explore(program, target, default_model(), Settings(max_kernels=1),
                     time.perf_counter() + time_budget_s)
    except MirageError as e:
        return {"one_kernel_error": _why(e)}
    st = ex.stats
    return {"one_kernel_us": round(ex.options[0].predicted_us, 2) if ex.options else None,
            "one_kernel_candidates": ex.candidates, "one_kernel_plans": st.plans,
            "one_kernel_states": st.states,
            "one_kernel_complete": not (st.timed_out or st.interrupted or st.gave_up),
            "one_kernel_seconds": round(time.perf_counter() - t0, 1)}


def not_one_kernel(row: dict) -> str:
    """The reason a captured program is superoptimised into more than one kernel ('' when it is
    one, or when :func:`_one_kernel` did not run). Apart from :func:`why_not` (what keeps a row
    from the goal's four columns); the table's *why not* column shows both."""
    k = row.get("kernels_found")
    if not row.get("captured") or not isinstance(k, int) or k <= 1:
        return ""
    if "one_kernel_error" in row:
        return f"{k} kernels; the one-kernel search failed: {row['one_kernel_error']}"
    if "one_kernel_candidates" not in row:
        return ""
    one, found = row.get("one_kernel_us"), row.get("predicted_us_found", math.nan)
    if one is not None and one >= found:
        return (f"{k} kernels: a one-kernel graph exists ({row['one_kernel_candidates']} "
                f"found) but is predicted slower, {one:.1f} us against {found:.1f} us")
    if one is not None:
        return (f"{k} kernels: a one-kernel graph exists, predicted {one:.1f} us against "
                f"{found:.1f} us, but superopt did not choose it (not verified, or not reached "
                "within its budget)")
    where = ("in the generator's search space (searched to the end" if
             row.get("one_kernel_complete") else
             f"found within {row.get('one_kernel_seconds')} s (the search did not finish")
    return (f"{k} kernels: no one-kernel graph {where}: {row.get('one_kernel_plans')} "
            f"grid/loop plans, {row.get('one_kernel_states')} block states, no kernel "
            "computes every output)")


def _level(path: Path) -> str:
    name = path.parent.name
    return name[len("level"):] if name.startswith("level") else ""


def _identity(path: Path) -> dict[str, Any]:
    """A row's first fields: level (from a ``levelN`` folder), number, name, file."""
    m = re.match(r"(\d+)_(.*)", path.stem)
    return {"level": _level(path), "number": int(m.group(1)) if m else None,
            "name": m.group(2) if m else path.stem, "file": path.name}


def frontend() -> tuple[Any, Any]:
    """(from_torch, compile): ``mp``'s, else those of ``mirage_py.frontend_torch`` when the
    package exists but is not exported yet; (None, None) without a frontend."""
    if hasattr(mp, "from_torch") and hasattr(mp, "compile"):
        return mp.from_torch, mp.compile
    try:
        from mirage_py import frontend_torch as ft
    except ImportError:
        return getattr(mp, "from_torch", None), getattr(mp, "compile", None)
    return getattr(ft, "from_torch", None), getattr(ft, "compile", None)


def _compile_details(compiled, row: dict) -> None:
    """What ``mp.compile`` made: its regions (kernels naive -> found, verified) and the
    operators it left to eager PyTorch, as far as the module tells."""
    try:
        regions = list(compiled.regions())
        row["compile_regions"] = len(regions)
        row["compile_kernels_naive"] = sum(int(r.get("kernels_naive", 0)) for r in regions)
        row["compile_kernels"] = sum(int(r.get("kernels", 0)) for r in regions)
        row["compile_verified"] = all(bool(r.get("verified")) for r in regions)
    except Exception as e:
        row["regions_error"] = _why(e)
    try:
        ops = list(compiled.eager_ops())
        row["eager_ops"] = sorted({str(o.get("op", "?")) for o in ops})
        row["eager_reasons"] = sorted({f"{o.get('op', '?')}: {o.get('reason', '')}"[:200]
                                       for o in ops})[:5]
    except Exception as e:
        row["eager_ops_error"] = _why(e)
    try:
        row["report"] = str(compiled.report())[:3000]
    except Exception as e:
        row["report_error"] = _why(e)


def why_not(row: dict) -> str:
    """What keeps a row from captured + fused + verified + equal, in one phrase ('' if none)."""
    if row.get("why") and row.get("stage"):
        return row["why"]
    reasons = []
    if not row.get("captured"):
        op = row.get("unsupported_op")
        where = row.get("unsupported_module") or row.get("unsupported_node") or ""
        if op:
            reasons.append(f"not captured: {op}" + (f" (in {where})" if where else ""))
        else:
            reasons.append("not captured: " + row.get("capture_error", "?"))
    else:
        if "superopt_error" in row:
            reasons.append("superopt failed: " + row["superopt_error"])
        else:
            if not row.get("fused"):
                reasons.append(f"not fused ({row.get('kernels_naive')} -> "
                               f"{row.get('kernels_found')} kernels)")
            if not row.get("verified"):
                reasons.append("not verified")
    if "compile_error" in row:
        reasons.append("compile failed: " + row["compile_error"])
    elif row.get("eager_ops") and row.get("captured") is False:
        reasons.append(f"compile: {row.get('compile_regions', 0)} region(s) "
                       f"{row.get('compile_kernels_naive')} -> {row.get('compile_kernels')} "
                       f"kernels, eager: {', '.join(row['eager_ops'])}")
    elif not row.get("equal"):
        reasons.append(f"differs from eager (rel err {row.get('rel_err', math.inf):.1e})")
    return "; ".join(reasons)


# ---- many problems ---------------------------------------------------------------------------

def select_files(paths: list[str], exclude: list[str] | None = None) -> list[Path]:
    """The .py files named or found (recursively) under ``paths``, in level and number order,
    without those whose name matches any ``exclude`` pattern (case-insensitive regex)."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(p.rglob("*.py"))
        elif p.is_file():
            files.append(p)
        else:
            raise KernelBenchFileError(f"no such file or folder: {p}")
    pats = [re.compile(x, re.I) for x in exclude or []]
    files = [f for f in files if not any(r.search(f.name) for r in pats)
             and f.name != "__init__.py"]
    return sorted(dict.fromkeys(files), key=_order)


def _order(f: Path):
    m = re.match(r"(\d+)_", f.name)
    return (f.parent.name, int(m.group(1)) if m else 10 ** 9, f.name)


def issue_set(root: str | Path) -> list[Path]:
    """Level 1 and 2 without convolutions, plus ``LEVEL3_SET``, from a KernelBench checkout
    (``root`` is the repository or its ``KernelBench/`` folder)."""
    root = Path(root)
    if (root / "KernelBench").is_dir():
        root = root / "KernelBench"
    if not (root / "level1").is_dir():
        raise KernelBenchFileError(f"{root}: no level1/ folder: give the KernelBench checkout")
    files = select_files([str(root / "level1"), str(root / "level2")], exclude=["conv"])
    files += [root / "level3" / f"{n}.py" for n in LEVEL3_SET
              if (root / "level3" / f"{n}.py").is_file()]
    return files


def _child(args) -> int:
    """``--child FILE``: run one problem, print its row as the last line ('ROW {...}')."""
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        pass
    scale = args.scale if args.scale == "auto" else int(args.scale)
    row = run_problem(args.child, scale=scale, max_elements=args.max_elements,
                      max_flops=args.max_flops, time_budget_s=args.time_budget,
                      workers=args.workers, target=args.target, tolerance=args.tolerance)
    print("ROW " + json.dumps(row, default=str), flush=True)
    return 0


def run_isolated(path: Path, args, limit_s: float) -> dict:
    """One problem in a child process (its own session, killed whole past ``limit_s``)."""
    cmd = [sys.executable, "-m", "benchmarks.kernelbench", "--child", str(path),
           "--scale", str(args.scale), "--max-elements", str(args.max_elements),
           "--max-flops", str(args.max_flops), "--time-budget", str(args.time_budget),
           "--workers", str(args.workers), "--target", args.target,
           "--tolerance", str(args.tolerance)]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(cmd, cwd=str(ROOT), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the child and its search workers
        proc.communicate()
        return {**_identity(path), "stage": "timeout",
                "why": f"did not finish within {limit_s:.0f} s (killed)"}
    for line in reversed(out.splitlines()):
        if line.startswith("ROW "):
            return json.loads(line[4:])
    tail = err.strip().splitlines()[-1] if err.strip() else f"exit code {proc.returncode}"
    return {**_identity(path), "stage": "crash",
            "why": f"the child process died (exit code {proc.returncode}): {tail[:300]}"}


def summary(rows: list[dict]) -> dict[str, dict[str, int]]:
    """Per level: problems, captured, fused, verified, equal (to eager), all four, and one
    kernel (captured and superoptimised into a single kernel)."""
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        s = out.setdefault(r.get("level") or "-", dict.fromkeys(
            ("problems", "captured", "fused", "verified", "equal", "allclose", "all",
             "one_kernel", "compile_one_kernel"), 0))
        s["problems"] += 1
        ok = [bool(r.get(k)) for k in ("captured", "fused", "verified", "equal")]
        for k, v in zip(("captured", "fused", "verified", "equal"), ok):
            s[k] += v
        s["all"] += all(ok)
        s["allclose"] += bool(r.get("allclose_1e-4"))
        s["one_kernel"] += bool(r.get("captured")) and r.get("kernels_found") == 1
        s["compile_one_kernel"] += r.get("compile_kernels") == 1 and not r.get("eager_ops")
    return out


def blockers(rows: list[dict]) -> list[tuple[str, list[str]]]:
    """The operators that stopped capture, each with the problems it stopped (most first)."""
    by_op: dict[str, list[str]] = {}
    for r in rows:
        if r.get("captured") is False and r.get("unsupported_op"):
            by_op.setdefault(r["unsupported_op"], []).append(
                f"{r.get('level')}/{r.get('number')}")
    return sorted(by_op.items(), key=lambda kv: (-len(kv[1]), kv[0]))


def _cell(r: dict) -> tuple[str, ...]:
    yes = lambda k: "yes" if r.get(k) else "no"  # noqa: E731
    kernels = f"{r['kernels_naive']} -> {r['kernels_found']}" if "kernels_found" in r else ""
    err = f"{r['rel_err']:.1e}" if isinstance(r.get("rel_err"), (int, float)) else ""
    equal = (yes("equal") + (f" ({err})" if err else "")) if "equal" in r else "-"
    fused = yes("fused") if "kernels_found" in r else "-"  # '-': not reached
    verified = yes("verified") if "verified" in r else "-"
    return (str(r.get("scale", "")), yes("captured"), kernels, fused, verified, equal)


def markdown(rows: list[dict], meta: dict) -> str:
    s = summary(rows)
    lines = ["# KernelBench through the PyTorch frontend", "",
             "**Goal: every problem below captured, fused, verified and equal to eager.** "
             + (("The problems: every KernelBench level-1 and level-2 problem without a "
                 "convolution, and the level-3 MLPs and attention blocks "
                 f"({', '.join(LEVEL3_SET)}). Made by `python -m benchmarks.kernelbench "
                 "--issue-set <KernelBench checkout>`")
                if meta.get("selection", "--issue-set") == "--issue-set" else
                ("The problems: the files of `python -m benchmarks.kernelbench "
                 f"{meta['selection']}`"))
             + f" (KernelBench {meta.get('kernelbench', '?')}), {meta.get('date', '')}.", "",
             f"Settings: `mp.superopt` / `mp.compile` on {meta.get('target')} with "
             f"{meta.get('time_budget')} s per search, {meta.get('workers')} worker(s); sizes "
             f"scaled for the CPU (`--scale {meta.get('scale')}`: <= "
             f"{meta.get('max_elements')} elements of inputs + parameters, <= "
             f"{meta.get('max_flops')} flops; the *scale* column is the divisor of the size "
             "constants); models in eval mode, float32, `torch.manual_seed(0)`. *Captured*: "
             "`mp.from_torch` gives one Program. *Fused*: superopt's kernels fewer than the "
             "naive lowering's, or one. *Verified*: every chosen μGraph proved equivalent "
             "('-': not reached, the problem was not captured). "
             f"*Equal*: `mp.compile`'s module on the CPU (GPU precision) within "
             f"{meta.get('tolerance')} norm-wise of eager PyTorch (its relative error in "
             "brackets). *allclose 1e-4*: the same outputs pass KernelBench's own check of "
             "float32 answers, `torch.allclose(atol=rtol=1e-4)`.", "",
             "| level | problems | captured | fused | verified | equal to eager | "
             "allclose 1e-4 | all four | one kernel | one kernel (compile) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    keys = ("problems", "captured", "fused", "verified", "equal", "allclose", "all",
            "one_kernel", "compile_one_kernel")
    tot = dict.fromkeys(keys, 0)
    for lv in sorted(s, key=lambda x: (len(x), x)):
        c = s[lv]
        lines.append("| " + " | ".join([lv] + [str(c[k]) for k in keys]) + " |")
        for k in tot:
            tot[k] += c[k]
    lines.append("| **all** | " + " | ".join(f"**{tot[k]}**" for k in keys) + " |")
    lines += ["", "*One kernel*: captured and superoptimised (`mp.superopt` of the captured "
              "program) into a single kernel. *One kernel (compile)*: `mp.compile` runs the "
              "whole model as a single kernel with nothing eager; it lays static weights out "
              "once per weight version (a linear layer's transposed weight), which the captured "
              "program computes with a transpose kernel of its own. Where superopt's answer is "
              "more than one kernel, *why not* says why, from the generator's search of the "
              "whole program limited to one kernel (its algebraic forms, tuned and ranked by "
              "the same cost model): a one-kernel graph predicted slower than the answer, or "
              "none in the search space (the search ran to its end), or none found in the "
              "budget."]
    ops = blockers(rows)
    if ops:
        lines += ["", "Operators that stop capture (`mp.compile` runs them in eager PyTorch "
                  "between superoptimised regions; the problems they stop):", ""]
        lines += [f"- `{op}`: {len(ps)} ({', '.join(ps)})" for op, ps in ops]
    lines += ["", "| level | # | problem | scale | captured | kernels naive -> found | fused | "
              "verified | equal to eager | compile: regions, kernels naive -> found | why not |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        why = "; ".join(x for x in (r.get("why"), r.get("why_not_one_kernel")) if x)
        why = why.replace("|", "\\|")
        comp = (f"{r['compile_regions']}, {r.get('compile_kernels_naive')} -> "
                f"{r.get('compile_kernels')}" if "compile_regions" in r else "")
        lines.append(f"| {r.get('level', '')} | {r.get('number', '')} | {r.get('name', '')} | "
                     + " | ".join(_cell(r)) + f" | {comp} | {why} |")
    return "\n".join(lines) + "\n"


def _kernelbench_version(files: list[Path]) -> str:
    """The commit of the KernelBench checkout the files come from ('?' when not one)."""
    if not files:
        return "?"
    try:
        r = subprocess.run(["git", "-C", str(files[0].parent), "rev-parse", "--show-toplevel",
                            "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        lines = r.stdout.split()
        if r.returncode == 0 and len(lines) == 2 and "kernelbench" in lines[0].lower():
            return lines[1]
    except (OSError, subprocess.SubprocessError):
        pass
    return "?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.kernelbench",
                                 description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*", help="KernelBench .py files or folders of them")
    ap.add_argument("--issue-set", metavar="ROOT", default=None,
                    help="the committed table's problems from a KernelBench checkout")
    ap.add_argument("--exclude", nargs="*", default=[], metavar="REGEX",
                    help="skip files whose name matches (case-insensitive), e.g. conv")
    ap.add_argument("--scale", default="auto", help="auto (default), or a divisor of the size "
                    "constants (1: the file's sizes)")
    ap.add_argument("--max-elements", type=int, default=1 << 18,
                    help="auto scale: inputs + parameters + buffers at most (default 2^18)")
    ap.add_argument("--max-flops", type=int, default=1 << 28,
                    help="auto scale: forward flops at most (default 2^28)")
    ap.add_argument("--time-budget", type=float, default=30.0, help="seconds per search")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--target", default="h100")
    ap.add_argument("--tolerance", type=float, default=1e-2,
                    help="norm-wise relative error to eager that counts as equal")
    ap.add_argument("--limit", type=float, default=None, metavar="SECONDS",
                    help="wall-clock limit per problem (default 6 x time budget + 120)")
    ap.add_argument("--out", default=None, metavar="STEM",
                    help="write STEM.md, STEM.json and STEM.jsonl (default: print only; "
                         f"the committed table is {RESULTS.relative_to(ROOT)})")
    ap.add_argument("--resume", action="store_true",
                    help="keep the rows already in STEM.jsonl and run only the others")
    ap.add_argument("--in-process", action="store_true",
                    help="run the problems in this process (no isolation, no limit)")
    ap.add_argument("--kernelbench-commit", default=None, metavar="SHA",
                    help="the KernelBench commit, for the table (default: asked of git)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.scale != "auto" and not (args.scale.isdigit() and int(args.scale) >= 1):
        ap.error(f"--scale must be auto or a positive int, got {args.scale!r}")
    if args.child:
        return _child(args)
    try:
        files = issue_set(args.issue_set) if args.issue_set else []
        files += select_files(args.paths, args.exclude) if args.paths else []
    except KernelBenchFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not files:
        ap.error("give KernelBench files or folders, or --issue-set ROOT")
    limit = args.limit or 6 * args.time_budget + 120
    done: dict[str, dict] = {}
    jsonl = Path(args.out + ".jsonl") if args.out else None
    if jsonl and args.resume and jsonl.exists():
        for line in jsonl.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                done[f"{r.get('level')}/{r.get('file')}"] = r
    elif jsonl:
        jsonl.parent.mkdir(parents=True, exist_ok=True)
        jsonl.write_text("")
    rows = []
    for f in files:
        key = f"{_level(f)}/{f.name}"
        if key in done:
            rows.append(done[key])
            continue
        if args.in_process:
            scale = args.scale if args.scale == "auto" else int(args.scale)
            row = run_problem(f, scale=scale, max_elements=args.max_elements,
                              max_flops=args.max_flops, time_budget_s=args.time_budget,
                              workers=args.workers, target=args.target,
                              tolerance=args.tolerance)
        else:
            row = run_isolated(f, args, limit)
        rows.append(row)
        if jsonl:
            with jsonl.open("a") as fh:
                fh.write(json.dumps(row, default=str) + "\n")
        cells = _cell(row)
        print(f"level {row.get('level')} {row.get('number')!s:>3} {row.get('name', '')[:40]:40s} "
              f"scale {cells[0]:>4} captured {cells[1]:3s} kernels {cells[2]:8s} "
              f"verified {cells[4]:3s} equal {cells[5]:14s} {row.get('why', '')[:120]}",
              flush=True)
    meta = {"date": _dt.date.today().isoformat(), "kernelbench": args.kernelbench_commit or _kernelbench_version(files),
            "target": args.target, "time_budget": args.time_budget, "workers": args.workers,
            "scale": args.scale, "max_elements": args.max_elements, "max_flops": args.max_flops,
            "tolerance": args.tolerance,
            # what was selected: the issue set, or the paths given (and what was left out)
            "selection": "--issue-set" if args.issue_set else
            " ".join([*map(str, args.paths)] + [f"--exclude {x}" for x in args.exclude or ()])}
    text = markdown(rows, meta)
    if args.out:
        Path(args.out + ".md").write_text(text)
        Path(args.out + ".json").write_text(json.dumps({"meta": meta, "summary": summary(rows),
                                                        "rows": rows}, indent=1,
                                                       default=str) + "\n")
        print(f"wrote {args.out}.{{md,json,jsonl}}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
