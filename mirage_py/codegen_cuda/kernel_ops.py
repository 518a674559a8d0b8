"""Emit one ``__global__`` function for a pre-defined kernel operator.

These are simple generated kernels, not library calls, so the exported extension depends on
nothing but the CUDA runtime (no cuBLAS): element-wise operators with NumPy broadcasting and
scalar operands (a grid-stride loop over output elements), matmul with batch broadcasting (output
tiles through shared memory on tensor cores by its math -- fp16, bf16, TF32 -- or of float32
FMA; fp32 accumulation), sum / max / min over axes (one warp per
output element), rms_norm over the last axis (one warp per row), reshape, transpose, slice and
concat (copies), masks (0/1 values from indices). Every operand is read through its layout's
strides, so padded intermediates need no special case.
Values are computed in fp32 and rounded once, when stored.
"""

from __future__ import annotations

from ..layout.tensors import DevicePlan, TensorLayout
from ..lax.ops import OPS
from ..ugraph.bind import op_params
from ..ugraph.graph import KernelOp
from .cexpr import (CTYPES, REDUCE_INIT, Names, broadcast_coords, declare_coords, elementwise,
                    flit, linear, mask_value, prod, prune_unused, reduce_step)
from .errors import CodegenError
from .launch import KernelParam, LaunchSpec
from ..layout.mma import fma_micro_tile, mma_config
from ..lax.precision import op_math

THREADS = 256
MAX_BLOCKS = 65535 * 16  # grid-stride loops cover anything larger
MMA_BM, MMA_BN, MMA_BK, MMA_THREADS = 64, 64, 32, 128  # matmul tiles on tensor cores
FMA_BM, FMA_BN, FMA_BK = 64, 64, 16  # matmul tiles of float32 FMA (THREADS threads)


def _guarded(conds: list[str], expr: str) -> str:
    """``expr`` where every non-empty condition holds, else 0."""
    cs = [x for x in conds if x]
    return f"{' && '.join(cs)} ? {expr} : 0.0f" if cs else expr


def _index_type(*layouts: TensorLayout, n: int = 0) -> str:
    big = max([lay.extent for lay in layouts] + [n])
    return "int" if big + THREADS * MAX_BLOCKS < 2**31 else "long long"


def _lit(n: int, itype: str) -> str:
    return f"{n}LL" if itype == "long long" else str(n)


def _coords(var: str, shape: tuple[int, ...], prefix: str, itype: str) -> tuple[list[str], list[str]]:
    decls, names = declare_coords(var, shape, prefix)
    return ([f"const {itype} {', '.join(decls)};"] if decls else []), names


def _offset(lay: TensorLayout, cs: list[str]) -> str:
    return linear(list(zip(cs, lay.strides)))


class KernelOpEmitter:
    def __init__(self, op: KernelOp, index: int, device: DevicePlan, kernel: str,
                 tensor_cores: bool = True):
        self.op, self.index, self.device, self.kernel = op, index, device, kernel
        self.tensor_cores = tensor_cores
        names = Names("g_")
        self.params: list[KernelParam] = []
        self.arg: dict[int, str] = {}  # operand position -> parameter name (tensor operands)
        for i, o in enumerate(op.operands):
            if isinstance(o, str):
                p = KernelParam(o, CTYPES[device.layouts[o].dtype], True,
                                names(o if o not in op.operands[:i] else f"{o}#{i}"))
                self.params.append(p)
                self.arg[i] = p.cname
        out = op.output
        self.out = KernelParam(out.name, CTYPES[out.dtype], False, names(out.name))
        self.params.append(self.out)
        self.out_layout = device.layouts[out.name]
        # how a matmul multiplies (lax/precision.py): tensor cores, or float32 FMA
        self.math = op_math(op.attrs, *(device.layouts[o].dtype for o in op.inputs)) \
            if op.op == "matmul" else None

    def layout(self, i: int) -> TensorLayout:
        return self.device.layouts[self.op.operands[i]]

    def expr(self, args: list[str]) -> str:
        consts = tuple(None if isinstance(o, str) else o for o in self.op.operands)
        return elementwise(self.op.op, args, consts, self.op.attrs)

    def load(self, i: int, off: str) -> str:
        return f"to_float({self.arg[i]}[{off}])"

    def header(self) -> str:
        o = self.op
        attrs = "".join(f", {k}={v}" for k, v in o.attrs)
        args = ", ".join(a if isinstance(a, str) else repr(a) for a in o.operands)
        ins = " ".join(f"{self.layout(i).shape}" for i in self.arg)
        return (f"// kernel #{self.index}: {o.output.name} = {o.op}({args}{attrs}) : "
                f"{ins} -> {o.output.shape} {o.output.dtype}")

    def spec(self, grid: tuple[int, int, int], block: tuple[int, int, int],
             smem: int = 0) -> LaunchSpec:
        return LaunchSpec(self.kernel, self.index, grid, block, smem, tuple(self.params),
                          dims=op_params(self.op))

    def finish(self, spec: LaunchSpec, body: list[str], note: str) -> tuple[str, LaunchSpec]:
        lines = [self.header(), f"// {note}", spec.signature() + " {",
                 *("  " + b if b else "" for b in prune_unused(body)), "}"]
        return "\n".join(lines) + "\n", spec

    def grid_stride(self, n: int, itype: str) -> tuple[list[str], tuple[int, int, int]]:
        blocks = max(1, min(-(-n // THREADS), MAX_BLOCKS))
        t = _lit(THREADS, itype)
        head = f"for ({itype} i = blockIdx.x * {t} + threadIdx.x; i < {n}; i += gridDim.x * {t}) {{"
        return [head], (blocks, 1, 1)

    # -- operators ------------------------------------------------------------------------------
    def emit(self) -> tuple[str, LaunchSpec]:
        o = self.op.op
        if o == "matmul":
            return self.emit_matmul()
        if o in ("sum", "max", "min"):
            return self.emit_reduce()
        if o == "rms_norm":
            return self.emit_rms_norm()
        if o in ("reshape", "transpose", "slice", "concat"):
            return self.emit_copy()
        if o == "mask":
            return self.emit_mask()
        if o == "take":
            return self.emit_take()
        if OPS.get(o) is not None and OPS[o].elementwise:
            return self.emit_elementwise()
        raise NotImplementedError(f"kernel operator {o!r}")

    def emit_elementwise(self) -> tuple[str, LaunchSpec]:
        out = self.out_layout
        shape = out.shape
        n = prod(shape)
        itype = _index_type(out, *(self.layout(i) for i in self.arg), n=n)
        simple = all(self.layout(i).shape == shape and self.layout(i).strides == out.strides
                     for i in self.arg)
        loop, grid = self.grid_stride(n, itype)
        body: list[str] = []
        if simple and out.dense:
            args = [self.load(i, "i") if i in self.arg else flit(a)
                    for i, a in enumerate(self.op.operands)]
            body.append(f"store({self.out.cname} + i, {self.expr(args)});")
        else:
            decls, cs = _coords("i", shape, "c", itype)
            body += decls
            args = []
            for i, a in enumerate(self.op.operands):
                if i in self.arg:
                    lay = self.layout(i)
                    args.append(self.load(i, _offset(lay, broadcast_coords(cs, lay.shape))))
                else:
                    args.append(flit(a))
            body.append(f"store({self.out.cname} + {_offset(out, cs)}, "
                        f"{self.expr(args)});")
        spec = self.spec(grid, (THREADS, 1, 1))
        return self.finish(spec, [*loop, *("  " + b for b in body), "}"],
                           "one thread per output element (grid-stride loop), fp32 arithmetic")

    def emit_copy(self) -> tuple[str, LaunchSpec]:
        out = self.out_layout
        n = prod(out.shape)
        itype = _index_type(out, *(self.layout(i) for i in self.arg), n=n)
        loop, grid = self.grid_stride(n, itype)
        odecls, oc = _coords("i", out.shape, "c", itype)
        o = self.op
        if o.op == "concat":
            ax = o.attr("axis") % len(out.shape)
            body, lo = [*odecls, "float v;"], 0
            for j in self.arg:
                lay = self.layout(j)
                ic = list(oc)
                ic[ax] = f"({oc[ax]} - {lo})" if lo else oc[ax]
                hi = lo + lay.shape[ax]
                cond = ("if" if j == 0 else "else if") + f" ({oc[ax]} < {hi}) " \
                    if j < len(self.arg) - 1 else "else "
                body.append(f"{cond if len(self.arg) > 1 else ''}v = "
                            f"{self.load(j, _offset(lay, ic))};")
                lo = hi
            body.append(f"store({self.out.cname} + {_offset(out, oc)}, v);")
            spec = self.spec(grid, (THREADS, 1, 1))
            return self.finish(spec, [*loop, *("  " + b for b in body), "}"],
                               f"concatenation along axis {ax}: each output element reads the "
                               "operand that holds it")
        src = self.layout(0)
        if o.op == "reshape":
            # element i in row-major order is the same element in both shapes
            idecls, ic = _coords("i", src.shape, "s", itype)
            note = "copy in row-major element order"
        elif o.op == "slice":
            ax, start = o.attr("axis"), o.attr("start")
            ic = list(oc)
            ic[ax] = f"({oc[ax]} + {start})" if oc[ax] != "0" else str(start)
            idecls = []
            note = f"elements {start}:{o.attr('stop')} along axis {ax}"
        else:
            perm = tuple(o.attr("perm"))
            ic = ["0"] * len(perm)
            for d, p in enumerate(perm):
                ic[p] = oc[d]
            idecls = []
            note = f"output coordinate d reads input coordinate perm[d], perm={perm}"
        body = [*odecls, *idecls,
                f"store({self.out.cname} + {_offset(out, oc)}, "
                f"{self.load(0, _offset(src, ic))});"]
        spec = self.spec(grid, (THREADS, 1, 1))
        return self.finish(spec, [*loop, *("  " + b for b in body), "}"], note)

    def emit_mask(self) -> tuple[str, LaunchSpec]:
        out = self.out_layout
        n = prod(out.shape)
        itype = _index_type(out, n=n)
        loop, grid = self.grid_stride(n, itype)
        odecls, oc = _coords("i", out.shape, "c", itype)
        body = [*odecls, f"store({self.out.cname} + {_offset(out, oc)}, "
                         f"{mask_value(oc[0], oc[1], self.op.attr('offset'), self.op.attr('window', 0), self.op.attr('valid'))});"]
        spec = self.spec(grid, (THREADS, 1, 1))
        return self.finish(spec, [*loop, *("  " + b for b in body), "}"],
                           "a 0/1 position mask computed from the element's row and column")

    def emit_take(self) -> tuple[str, LaunchSpec]:
        """Rows of the table gathered by the indices: output element (i..., j...) is table
        element (ids[i...], j...). An index outside the table writes NaN (the host checks the
        indices before launching and raises IndexRangeError; this keeps a stray one visible
        instead of reading outside the table)."""
        out, table, ids = self.out_layout, self.layout(0), self.layout(1)
        n = prod(out.shape)
        itype = _index_type(out, table, ids, n=n)
        loop, grid = self.grid_stride(n, itype)
        odecls, oc = _coords("i", out.shape, "c", itype)
        k = len(ids.shape)
        rows = table.shape[0]
        row = f"(long long){self.arg[1]}[{_offset(ids, oc[:k])}]"
        src = _offset(table, ["r", *oc[k:]])
        body = [*odecls, f"const long long r = {row};",
                f"store({self.out.cname} + {_offset(out, oc)}, (r >= 0 && r < {rows}LL) ? "
                f"{self.load(0, src)} : __int_as_float(0x7fc00000));"]
        spec = self.spec(grid, (THREADS, 1, 1))
        return self.finish(spec, [*loop, *("  " + b for b in body), "}"],
                           f"gather: output element (i, j) copies table row ids[i] "
                           f"({rows} rows), one thread per element")

    def _warp_reduce(self, var: str, op: str = "sum") -> list[str]:
        return [f"for (int s = 16; s > 0; s >>= 1) "
                f"{reduce_step(op, var, f'__shfl_xor_sync(0xffffffffu, {var}, s)')};"]

    def emit_reduce(self) -> tuple[str, LaunchSpec]:
        src, out = self.layout(0), self.out_layout
        op = self.op.op
        axes = tuple(sorted(self.op.attr("axes", ())))
        kept = [d for d in range(len(src.shape)) if d not in axes]
        kshape = tuple(src.shape[d] for d in kept)
        rshape = tuple(src.shape[d] for d in axes)
        nout, red = prod(kshape), prod(rshape)
        itype = _index_type(src, out)
        warps = THREADS // 32
        kdecls, kc = _coords("o", kshape, "k", itype)
        rdecls, rc = _coords("r", rshape, "r", itype)
        in_off = linear(list(zip(kc, [src.strides[d] for d in kept])) +
                        list(zip(rc, [src.strides[d] for d in axes])))
        # the output holds the kept dims in order (size-1 dims where keepdims)
        ocs = iter(kc)
        out_cs = [("0" if (self.op.attr("keepdims", False) and d in axes) else next(ocs))
                  for d in range(len(src.shape))
                  if d not in axes or self.op.attr("keepdims", False)]
        body = [f"const {itype} o = blockIdx.x * {_lit(warps, itype)} + threadIdx.x / 32;",
                "const int lane = threadIdx.x % 32;",
                f"if (o >= {nout}) return;  // whole warps leave together",
                *kdecls, f"float acc = {REDUCE_INIT[op]};",
                f"for ({itype} r = lane; r < {red}; r += 32) {{",
                *("  " + d for d in rdecls),
                f"  {reduce_step(op, 'acc', self.load(0, in_off))};", "}",
                *self._warp_reduce("acc", op),
                f"if (lane == 0) store({self.out.cname} + {_offset(out, out_cs)}, acc);"]
        spec = self.spec((max(1, -(-nout // warps)), 1, 1), (THREADS, 1, 1))
        what = {"sum": "sums", "max": "maxima", "min": "minima"}[op]
        return self.finish(spec, body, f"one warp per output element: {nout} {what} of {red}")

    def emit_rms_norm(self) -> tuple[str, LaunchSpec]:
        src, out = self.layout(0), self.out_layout
        rows_shape, n = src.shape[:-1], src.shape[-1]
        rows = prod(rows_shape)
        itype = _index_type(src, out)
        warps = THREADS // 32
        decls, rc = _coords("row", rows_shape, "c", itype)
        ioff = linear(list(zip(rc, src.strides[:-1])))
        ooff = linear(list(zip(rc, out.strides[:-1])))
        eps = flit(self.op.attr("eps", 1e-6))
        body = [f"const {itype} row = blockIdx.x * {_lit(warps, itype)} + threadIdx.x / 32;",
                "const int lane = threadIdx.x % 32;",
                f"if (row >= {rows}) return;  // whole warps leave together",
                *decls,
                f"const {self.params[0].ctype}* in_row = {self.arg[0]} + {ioff};",
                f"{self.out.ctype}* out_row = {self.out.cname} + {ooff};",
                "float ss = 0.0f;",
                f"for (int j = lane; j < {n}; j += 32) {{",
                "  const float x = to_float(in_row[j]);", "  ss += x * x;", "}",
                *self._warp_reduce("ss"),
                f"const float rms = sqrtf(ss / {flit(n)} + {eps});",
                f"for (int j = lane; j < {n}; j += 32) "
                "store(out_row + j, fdiv(to_float(in_row[j]), rms));"]
        spec = self.spec((max(1, -(-rows // warps)), 1, 1), (THREADS, 1, 1))
        return self.finish(spec, body, f"one warp per row: x / sqrt(mean(x^2) + eps) over "
                                       f"{rows} rows of {n}")

    def _matmul_setup(self, a_k: str, b_k: str) -> dict:
        """What both matmul kernels share: sizes, batch coordinates, the operands' batch bases
        and element offsets (row / col / the given k expressions) and the output's offset."""
        a, b, c = self.layout(0), self.layout(1), self.out_layout
        m, k = a.shape[-2:]
        itype = _index_type(a, b, c)
        decls, bc = _coords("bt", c.shape[:-2], "b", itype)

        def batch_terms(lay: TensorLayout) -> list[tuple[str, int]]:
            return list(zip(broadcast_coords(bc, lay.shape[:-2]), lay.strides[:-2]))

        def ptr(i: int, lay: TensorLayout) -> str:
            off = linear(batch_terms(lay))
            return self.arg[i] if off == "0" else f"{self.arg[i]} + {off}"

        sa, sb, sc = a.strides, b.strides, c.strides
        return dict(a=a, b=b, m=m, k=k, n=b.shape[-1], nb=prod(c.shape[:-2]), decls=decls,
                    a_ptr=ptr(0, a), b_ptr=ptr(1, b),
                    a_at=linear([("row", sa[-2]), (a_k, sa[-1])]),
                    b_at=linear([(b_k, sb[-2]), ("col", sb[-1])]),
                    c_at=linear(batch_terms(c) + [("row", sc[-2]), ("col", sc[-1])]))

    def emit_matmul(self) -> tuple[str, LaunchSpec]:
        """A block computes a (BM, BN) output tile; K runs in steps of BK through shared memory
        (operands staged as the product takes them -- rounded to the tensor cores' type, or
        float32 for FMA -- with zeros past the edges) into an fp32 tile that is stored at the
        end. Tensor cores (``tile_mma`` on 4 warps, by the matmul's math: fp16, bf16, TF32) or,
        for float32 products, ``tile_fma`` on 256 threads (micro-tiles of outputs in
        registers)."""
        mm = self._matmul_setup("kk", "kk")
        a, b, m, k, n, nb, decls = (mm[x] for x in ("a", "b", "m", "k", "n", "nb", "decls"))
        a_at, b_at, c_at = mm["a_at"], mm["b_at"], mm["c_at"]
        if self.tensor_cores and self.math.tensor_cores:
            bm = min(MMA_BM, -(-m // 16) * 16)
            bn = min(MMA_BN, -(-n // 8) * 8)
            bk = min(MMA_BK, -(-k // 16) * 16)
            t = MMA_THREADS
            cfg = mma_config(1, bm, bn, t, self.math)
            if cfg is None:
                raise CodegenError(f"kernel #{self.index}: {self.math.value} matmul has no "
                                   "tensor-core plan")
            e, eb = cfg.etype, (2 if cfg.sixteen_bit else 4)
            product = (f"tile_mma<1, {bm}, {bn}, {bk}, {cfg.warps}, {cfg.ng}, true, {e}>"
                       "(c_s, a_s, b_s, NoOffset(), NoOffset());")
            note = (f"tensor cores ({e}): ({bm}, {bn}) output tiles on {cfg.warps} warps, K in "
                    f"steps of {bk} through shared memory, fp32 accumulation")
        else:
            bm, bn, bk, t = min(FMA_BM, m), min(FMA_BN, n), min(FMA_BK, k), THREADS
            tm, tn = fma_micro_tile(1, bm, bn, t)
            e, eb = "float", 4
            product = (f"tile_fma<1, {bm}, {bn}, {bk}, {t}, true, {tm}, {tn}>"
                       "(c_s, a_s, b_s, NoOffset(), NoOffset());")
            note = (f"float32 FMA: ({bm}, {bn}) output tiles on {t} threads ({tm} x {tn} "
                    f"outputs each), K in steps of {bk} through shared memory")
        if -(-m // bm) > 65535:
            raise CodegenError(f"kernel #{self.index}: matmul with {m} rows needs more than "
                               "65535 row tiles (grid.y)")
        a_bytes, b_bytes = bm * bk * eb, bk * bn * eb
        # bounds checks only where a tile can reach past the edge
        row_ok = "" if m % bm == 0 else f"row < {m}"
        col_ok = "" if n % bn == 0 else f"col < {n}"
        k_ok = "" if k % bk == 0 else f"kk < {k}"
        done = " && ".join(x for x in (row_ok, col_ok) if x)
        body = ["extern __shared__ __align__(1024) unsigned char smem[];",
                f"{e}* const a_s = reinterpret_cast<{e}*>(smem);  // ({bm}, {bk})",
                f"{e}* const b_s = reinterpret_cast<{e}*>(smem + {a_bytes});  // ({bk}, {bn})",
                f"float* const c_s = reinterpret_cast<float*>(smem + {a_bytes + b_bytes});"
                f"  // ({bm}, {bn})",
                f"const int r0 = blockIdx.y * {bm}, n0 = blockIdx.x * {bn};",
                f"for (int bt = blockIdx.z; bt < {nb}; bt += gridDim.z) {{",
                *("  " + d for d in decls),
                f"  const {self.params[0].ctype}* A = {mm['a_ptr']};",
                f"  const {self.params[1].ctype}* B = {mm['b_ptr']};",
                f"  for (int i = threadIdx.x; i < {bm * bn}; i += {t}) c_s[i] = 0.0f;",
                f"  for (int k0 = 0; k0 < {k}; k0 += {bk}) {{",
                f"    for (int i = threadIdx.x; i < {bm * bk}; i += {t}) {{",
                f"      const int row = r0 + i / {bk}, kk = k0 + i % {bk};",
                f"      store(a_s + i, {_guarded([row_ok, k_ok], f'to_float(A[{a_at}])')});",
                "    }",
                f"    for (int i = threadIdx.x; i < {bk * bn}; i += {t}) {{",
                f"      const int kk = k0 + i / {bn}, col = n0 + i % {bn};",
                f"      store(b_s + i, {_guarded([k_ok, col_ok], f'to_float(B[{b_at}])')});",
                "    }",
                "    __syncthreads();",
                f"    {product}",
                "    __syncthreads();", "  }",
                f"  for (int i = threadIdx.x; i < {bm * bn}; i += {t}) {{",
                f"    const int row = r0 + i / {bn}, col = n0 + i % {bn};",
                f"    {'if (' + done + ') ' if done else ''}store({self.out.cname} + {c_at}, "
                "c_s[i]);",
                "  }",
                "  __syncthreads();  // c_s is zeroed again for the next batch entry",
                "}"]
        spec = self.spec((-(-n // bn), -(-m // bm), min(nb, 65535)), (t, 1, 1),
                         a_bytes + b_bytes + bm * bn * 4)
        return self.finish(spec, body, note + "; grid z runs over the batch")


def emit_kernel_op(op: KernelOp, index: int, device: DevicePlan,
                   kernel: str, tensor_cores: bool = True) -> tuple[str, LaunchSpec]:
    return KernelOpEmitter(op, index, device, kernel, tensor_cores).emit()
