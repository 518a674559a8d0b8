"""Running a captured graph: superoptimised regions, eager PyTorch between them.

A :class:`CompiledCapture` is one captured graph specialised to one input signature (shapes,
dtypes, pytree structure, non-tensor values). Its regions are superoptimised once (results are
cached in memory by program structure and options, and superopt's results database keeps them
across processes), and :meth:`CompiledCapture.run` executes the schedule:

* a region on **CUDA** tensors runs the generated kernels (``OptimizedProgram.__call__``: CuPy
  and NVRTC) on the tensors themselves through DLPack, on PyTorch's current stream; outputs come
  back as torch tensors sharing the CuPy buffers;
* a region on **CPU** tensors runs the μGraph interpreter (``OptimizedProgram.run_numpy``, GPU-like
  precision: storage rounding to the tensors' dtypes) and converts to and from NumPy;
* an eager node calls its aten operator on the run's tensors.

Parameters and buffers are read from the module at every call, so a changed weight is used.
Everything runs under ``torch.no_grad()``: a compiled module is for inference.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from ..errors import MirageError, OptionError, TorchCaptureError
from .capture import Captured
from .classify import describe
from .dynamic import (AnswerOrigin, Dynamic, FamilyRegion, family_of, samples_for, forget_families,
                      superopt_family_of)
from .region_programs import RegionSpec, Source, analyse

#: superopt answers by (program structural hash, options): a recompile of a seen region is free
_SUPEROPT_CACHE: dict[tuple, Any] = {}


def _torch() -> Any:
    import torch
    return torch


# the least a region's search is given when a capture's budget is spent (superopt lays its
# floor within about a second whatever the budget)
MIN_REGION_BUDGET_S = 0.05


def _options_key(options: dict[str, Any]) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in options.items()))


def float32_matmul_of(options: dict[str, Any]) -> str:
    """What float32 matmuls of a capture may lose: the ``float32_matmul`` option, else PyTorch's
    ``torch.get_float32_matmul_precision()`` now (``torch.set_float32_matmul_precision``)."""
    return str(options.get("float32_matmul") or _torch().get_float32_matmul_precision())


def superopt_cached(program: Any, options: dict[str, Any],
                    budget_s: float | None = None) -> tuple[Any, bool]:
    """``mp.superopt(program, **options)``, memoised in this process; (result, was cached).
    ``budget_s``: this call's share of the options' ``time_budget_s`` (the answer is memoised
    under the options). An answer interrupted by Ctrl-C is not memoised: KeyboardInterrupt is
    raised (what it verified is in the results database, so compiling again resumes)."""
    from ..superopt import superopt
    hit = memoised(program, options)
    if hit is not None:
        return hit, True
    opt = superopt(program, **(options if budget_s is None else
                               {**options, "time_budget_s": budget_s}))
    if opt.interrupted:
        raise KeyboardInterrupt
    _SUPEROPT_CACHE[_memo_key(program, options)] = opt
    return opt, False


def _memo_key(program: Any, options: dict[str, Any]) -> tuple:
    return program.structural_hash(), _options_key(options)


def memoised(program: Any, options: dict[str, Any]) -> Any:
    """The answer :func:`superopt_cached` keeps for exactly this program and options, or None."""
    return _SUPEROPT_CACHE.get(_memo_key(program, options))


def clear_cache() -> None:
    """Forget the superopt answers and shape families kept in memory (the results database is
    not touched)."""
    _SUPEROPT_CACHE.clear()
    forget_families()


class CompiledCapture:
    """A captured graph with superoptimised regions, for one input signature."""

    def __init__(self, cap: Captured, name: str, options: dict[str, Any], signature: str = "",
                 dynamic: Dynamic = Dynamic.NEVER, companions: "list[Captured] | None" = None):
        options = {**options, "float32_matmul": float32_matmul_of(options)}
        self.cap = cap
        self.name = name
        self.signature = signature
        self.dynamic = Dynamic.parse(dynamic)
        # the same graph captured at other sizes (dynamic=True): their regions are the second
        # samples each region's family is generalised from
        self._companions = list(companions or [])
        self.capture_seconds = self.superopt_seconds = 0.0
        forced: dict[str, str] = {}
        budget = options.get("time_budget_s")
        # one budget for the whole capture: each region's search gets its share of what is left
        end = None if budget is None else time.perf_counter() + budget
        for _ in range(len(list(cap.gm.graph.nodes)) + 1):
            t0 = time.perf_counter()
            self.analysis, self.regions = analyse(cap, forced)
            self.capture_seconds += time.perf_counter() - t0
            t0 = time.perf_counter()
            failed = self._superopt(name, options, forced, end)
            self.superopt_seconds += time.perf_counter() - t0
            if failed is None:
                break
            # superopt refused a region's program: its operators run eagerly, the rest again
            region, why = failed
            forced.update({n: f"superopt failed on its region: {why}" for n in region.nodes})
        self.steps = self.analysis.schedule()
        levels = sorted({self.analysis.pos[n] for r in self.regions for n in r.nodes})
        self._region_at = {k: r for k, r in zip(levels, self.regions)}
        self.consts = dict(self.analysis.consts)
        for r in self.regions:
            self.consts.update(r.consts)
        self._device_consts: dict[str, dict[str, Any]] = {}
        self._mask_stamps: dict[str, tuple] = {}
        self._static: dict[tuple, tuple[tuple, Any]] = {}
        self.out_node = next(n for n in self.analysis.nodes if n.op == "output")

    def _superopt(self, name: str, options: dict[str, Any], forced: dict[str, str],
                  end: float | None = None) -> tuple[RegionSpec, str] | None:
        self.opts: dict[int, Any] = {}
        self.origin: dict[int, AnswerOrigin] = {}
        samples = self._companion_programs(forced)
        todo = [r for r in self.regions if r.program is not None]
        for i, r in enumerate(todo):
            r.program.name = f"{name}_{r.program.name}"
            share = None if end is None else \
                max(MIN_REGION_BUDGET_S, (end - time.perf_counter()) / (len(todo) - i))
            try:
                self.opts[r.index], self.origin[r.index] = \
                    self._answer(r.program, options, samples.get(r.index, []), share)
            except OptionError:
                raise
            except MirageError as e:
                return r, f"{type(e).__name__}: {e}"
        return None

    def _answer(self, program: Any, options: dict[str, Any], samples: list,
                budget_s: float | None = None) -> tuple[Any, AnswerOrigin]:
        """A region program's answer: this shape's own answer from the memory cache, a known
        shape family it is an instance of, a family generalised from it and captures of it at
        other sizes (``samples`` of the companion captures, or the captures of the same
        structure at other shapes met before), or the static search; a search gets
        ``budget_s``, this region's share of the capture's time budget."""
        exact = memoised(program, options)
        if exact is not None:  # this very shape was searched: its own answer, not a bucket's
            return exact, AnswerOrigin.MEMORY
        if self.dynamic is not Dynamic.NEVER:
            from ..lax.generalize import erased_key
            key = (erased_key(program), _options_key(options))
            hit = family_of(program, key)
            if hit is not None:
                return FamilyRegion(hit[0].answer, program), AnswerOrigin.FAMILY
            fam = superopt_family_of(program, samples + samples_for(key, program), key, options,
                                     budget_s)
            if fam is not None:
                kept = getattr(fam.answer.answer, "origin", "search") == "database"
                return FamilyRegion(fam.answer, program), \
                    AnswerOrigin.DATABASE if kept else AnswerOrigin.FAMILY_SEARCH
        opt, cached = superopt_cached(program, options, budget_s)
        if cached:
            return opt, AnswerOrigin.MEMORY
        return opt, AnswerOrigin.DATABASE if opt.origin == "database" else AnswerOrigin.SEARCH

    def _companion_programs(self, forced: dict[str, str]) -> dict[int, list]:
        """The companion captures' region programs by region index (dynamic=True), cut as this
        capture is (the same operators ``forced`` to run eagerly: a retry after a refused
        region cuts the companions the same way)."""
        out: dict[int, list] = {}
        for cap in self._companions:
            try:
                _, regions = analyse(cap, forced)
            except MirageError:
                continue
            if len(regions) != len(self.regions):
                continue
            for r in regions:
                if r.program is not None:
                    out.setdefault(r.index, []).append(r.program)
        return out

    @property
    def cached(self) -> dict[int, bool]:
        """Regions answered without a search, by index."""
        return {i: not o.searched for i, o in self.origin.items()}

    def searches(self) -> int:
        """Region searches this capture ran (a family's search counts once, for the capture
        that made the family)."""
        return sum(o.searched for o in self.origin.values())

    # -- running --------------------------------------------------------------------------------
    def masks_hold(self, placeholders: dict[str, Any]) -> bool:
        """Do the mask buffers folded at capture still hold their values? Checked by pointer and
        version first, by value when those changed (a module moved to the GPU keeps its masks)."""
        torch = _torch()
        for node, want in self.cap.masks.items():
            v = placeholders.get(node)
            if v is None:
                continue
            stamp = (v.data_ptr(), v._version, str(v.device))
            if self._mask_stamps.get(node) == stamp:
                continue
            if tuple(v.shape) != tuple(want.shape) or \
                    not torch.equal(v.detach(), want.to(device=v.device, dtype=v.dtype)):
                return False
            self._mask_stamps[node] = stamp
        return True

    def run(self, placeholders: dict[str, Any]) -> list[Any]:
        """All graph outputs (user outputs and mutations) from the placeholders' values."""
        torch = _torch()
        device = _device_of(placeholders.values())
        env = dict(placeholders)
        env.update(self._consts_on(device))
        with torch.no_grad():
            for kind, x in self.steps:
                if kind == "region":
                    self._run_region(self._region_at[x], env, device)
                else:
                    env[x.name] = self._run_eager(x, env, device)
        from torch.fx.node import map_arg
        res = map_arg(self.out_node.args[0], lambda n: env[n.name])
        return list(res) if isinstance(res, (list, tuple)) else [res]

    def _consts_on(self, device: Any) -> dict[str, Any]:
        key = str(device)
        got = self._device_consts.get(key)
        if got is None:
            got = {k: _to_device(v, device) for k, v in self.consts.items()}
            self._device_consts[key] = got
        return got

    def _run_eager(self, node: Any, env: dict[str, Any], device: Any) -> Any:
        from torch.fx.node import map_arg
        args = map_arg(node.args, lambda n: env[n.name])
        kwargs = map_arg(node.kwargs, lambda n: env[n.name])
        if "device" in kwargs and device is not None:
            kwargs = dict(kwargs, device=device)
        try:
            return node.target(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 -- name the node, keep the cause
            op, module, location = describe(node)
            raise TorchCaptureError(f"eager {op} (node {node.name})"
                                    f"{' in ' + module if module else ''} failed: "
                                    f"{type(e).__name__}: {e}") from e

    def _source(self, src: Source, env: dict[str, Any]) -> Any:
        v = env[src.ref]
        if src.static and src.ops and getattr(v, "is_cuda", False):
            # a transposed / sliced / converted parameter: one contiguous copy per weight version
            key = (src.ref, src.ops)
            stamp = (v.data_ptr(), v._version, tuple(v.shape), v.dtype)
            hit = self._static.get(key)
            if hit is not None and hit[0] == stamp:
                return hit[1]
            out = _apply_ops(v, src.ops).contiguous()
            self._static[key] = (stamp, out)
            return out
        return _apply_ops(v, src.ops)

    def _run_region(self, r: RegionSpec, env: dict[str, Any], device: Any) -> None:
        vals = {nm: self._source(src, env) for nm, src in r.inputs.items()}
        outs: dict[str, Any] = {}
        if r.program is not None:
            opt = self.opts[r.index]
            ins = {t.name: vals[t.name] for t in r.program.inputs}
            if device is not None and device.type == "cuda":
                outs = _run_cuda(opt, ins, device)
            else:
                outs = _run_cpu(opt, ins)
        for o in r.outputs:
            if o.kind == "program":
                v = outs[o.key]
            elif o.kind == "input":
                v = vals[o.key]
            else:
                v = env[o.key]
            for op in o.post:
                v = v.reshape(op[1]) if op[0] == "reshape" else v.expand(op[1])
            env[o.node] = v

    # -- reporting ------------------------------------------------------------------------------
    def region_rows(self) -> list[dict[str, Any]]:
        rows = []
        for r in self.regions:
            opt = self.opts.get(r.index)
            row: dict[str, Any] = {"region": r.index, "nodes": len(r.nodes),
                                   "inputs": list(r.inputs),
                                   "outputs": [o.node for o in r.outputs]}
            if opt is not None:
                vs = [v for v in opt.verification if v is not None]
                row.update(kernels_naive=opt.naive_num_kernels, kernels=opt.num_kernels,
                           naive_us=opt.naive_estimated_time_us, us=opt.estimated_time_us,
                           verified=bool(vs) and all(bool(v.equivalent) for v in vs),
                           bound=max((float(v.bound) for v in vs), default=math.nan),
                           search_seconds=opt.search_seconds,
                           cached=self.cached.get(r.index, False),
                           origin=self.origin[r.index].value,
                           dims=sorted(getattr(opt, "dims", None) or {}))
            else:
                row.update(kernels_naive=0, kernels=0, naive_us=0.0, us=0.0, verified=True,
                           bound=0.0, search_seconds=0.0, cached=False, origin="", dims=[])
            rows.append(row)
        return rows

    def eager_rows(self) -> list[dict[str, str]]:
        rows = []
        for n in self.analysis.eager_nodes():
            op, module, location = describe(n)
            rows.append({"node": n.name, "op": op, "module": module, "location": location,
                         "reason": self.analysis.reason.get(n.name, "")})
        return rows

    def report(self) -> str:
        an = self.analysis
        rows = self.region_rows()
        eager = self.eager_rows()
        nk = sum(r["kernels_naive"] for r in rows)
        fk = sum(r["kernels"] for r in rows)
        lines = [f"graph {self.signature or self.name} (captured by {self.cap.method}"
                 + (", kept graph from the results database" if self.cap.cached else "")
                 + f" in {self.cap.seconds:.2f} s"
                 + (f"; export failed: {self.cap.export_error}" if self.cap.export_error else "")
                 + f"): {len(rows)} region(s), {len(eager)} eager operator(s), kernels "
                 f"{nk} naive -> {fk} found, predicted "
                 f"{sum(r['naive_us'] for r in rows):.1f} -> {sum(r['us'] for r in rows):.1f} us"]
        for r in rows:
            src = r["origin"] + (f" {r['search_seconds']:.1f} s"
                                 if r["origin"] and AnswerOrigin(r["origin"]).searched else "")
            if r["dims"]:
                src += f" (symbolic in {', '.join(r['dims'])})"
            lines.append(f"  region {r['region']}: {r['nodes']} aten node(s); kernels "
                         f"{r['kernels_naive']} naive -> {r['kernels']} found; predicted "
                         f"{r['naive_us']:.1f} -> {r['us']:.1f} us; "
                         + (f"verified, bound {r['bound']:.1e}" if r["verified"] and r["kernels"]
                            else "no kernels (views only)" if not r["kernels"] else "NOT verified")
                         + f"; {src}")
            lines.append(f"    inputs: {', '.join(r['inputs']) or '-'}")
            lines.append(f"    outputs: {', '.join(r['outputs'])}")
        for e in eager:
            where = (f" in {e['module']}" if e["module"] else "")
            lines.append(f"  eager: {e['op']} (node {e['node']}){where}: {e['reason']}")
        folded = sum(1 for n in an.nodes if an.kind.get(n.name) == "const" and n.op ==
                     "call_function")
        if folded:
            lines.append(f"  folded at capture: {folded} constant node(s)")
        return "\n".join(lines)


def _device_of(values: Any) -> Any:
    torch = _torch()
    dev = None
    for v in values:
        if isinstance(v, torch.Tensor):
            if v.is_cuda:
                return v.device
            dev = dev or v.device
    return dev


def _to_device(v: Any, device: Any) -> Any:
    torch = _torch()
    if device is None:
        return v
    if isinstance(v, torch.Tensor):
        return v.to(device)
    if isinstance(v, (list, tuple)):
        return type(v)(_to_device(x, device) for x in v)
    return v


def _apply_ops(v: Any, ops: tuple) -> Any:
    torch = _torch()
    for op in ops:
        if op[0] == "reshape":
            v = v.reshape(op[1])
        elif op[0] == "permute":
            v = v.permute(op[1])
        elif op[0] == "to":
            v = v.to(getattr(torch, op[1]))
        elif op[0] == "narrow":
            v = v.narrow(op[1], op[2], op[3])
        elif op[0] == "item":
            v = v[op[1]]
        else:  # pragma: no cover - graph.py makes only these
            raise TorchCaptureError(f"internal: unknown input op {op!r}")
    return v


def _to_numpy(t: Any) -> np.ndarray:
    torch = _torch()
    t = t.detach().to("cpu")
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.numpy()


def _run_cpu(opt: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    torch = _torch()
    res = opt.run_numpy({k: _to_numpy(v) for k, v in inputs.items()})
    dtypes = {o.name: o.dtype for o in opt.program.outputs}
    return {k: torch.from_numpy(np.array(a, dtype=np.float32, order="C", copy=True))
            .to(getattr(torch, dtypes[k])) for k, a in res.items()}


def _run_cuda(opt: Any, inputs: dict[str, Any], device: Any) -> dict[str, Any]:
    """The generated kernels on the tensors themselves (DLPack, no copies for contiguous inputs),
    launched on PyTorch's current stream."""
    torch = _torch()
    try:
        import cupy
    except ImportError as e:
        raise TorchCaptureError("running a compiled region on CUDA tensors needs CuPy "
                                "(pip install cupy-cuda13x)") from e
    stream = torch.cuda.current_stream(device)
    with cupy.cuda.Device(device.index or 0), cupy.cuda.ExternalStream(stream.cuda_stream):
        res = opt({k: v.contiguous() for k, v in inputs.items()})
    dtypes = {o.name: o.dtype for o in opt.program.outputs}
    out = {}
    for k, a in res.items():
        if dtypes[k] == "bfloat16":  # CuPy has no bfloat16: the kernels' raw bits
            out[k] = torch.from_dlpack(a.view(cupy.int16)).view(torch.bfloat16)
        else:
            out[k] = torch.from_dlpack(a)
    return out


def signature_of(leaves: list[Any], spec: Any) -> tuple:
    """The specialisation key of one call: the pytree structure, every tensor's shape and dtype,
    every other leaf's value."""
    torch = _torch()
    parts = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            parts.append(("T", tuple(leaf.shape), str(leaf.dtype).replace("torch.", "")))
        else:
            parts.append(("V", repr(leaf)))
    return (str(spec), tuple(parts))


def describe_signature(sig: tuple, names: list[str]) -> str:
    items = []
    for i, p in enumerate(sig[1]):
        nm = names[i] if i < len(names) else f"arg{i}"
        items.append(f"{nm}: {p[1]} {p[2]}" if p[0] == "T" else f"{nm}={p[1]}")
    return "(" + ", ".join(items) + ")"


__all__ = ["CompiledCapture", "superopt_cached", "clear_cache", "signature_of",
           "describe_signature"]
