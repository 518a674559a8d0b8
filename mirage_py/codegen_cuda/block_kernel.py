"""Emit one ``__global__`` function for a graph-defined kernel (a block graph).

The kernel body follows the stage schedule of :mod:`mirage_py.layout.schedule`: loads and
operators of loop-invariant tiles, accumulators set to zero, the for-loop over iterations, the
epilogue and the output savers, with one ``__syncthreads()`` between stages. Every tile is a
dense row-major array in dynamic shared memory at the offset the shared-memory plan gives, in its
tile dtype (loaded tiles keep the device dtype, everything else fp32). Element loops give element
``i`` of a tile to thread ``i % threads``; a fused thread graph runs per element in registers.

Index arithmetic (iterator of input shape S, grid split part P = S[d] / grid[a], tile T)::

    element c of the tile in block (bx, by, bz), iteration it  ->  S-coordinate
    c[d] + b[a] * P[d]  (imap[a] == d)  + it * T[d]  (fmap == d)
"""

from __future__ import annotations

from ..layout.plan import KernelPlan
from ..layout.schedule import ACCUMULATE, COMPUTE, INIT, LOAD, RESCALE, SAVE, Step
from ..layout.tensors import DevicePlan
from ..targets import Target
from ..lax.ops import OPS
from ..ugraph.graph import (AXES, Accum, BlockOp, Fused, GraphKernel, InputIter, MaskIter,
                            OutputSaver)
from ..ugraph.bind import op_params
from ..ugraph.printing import format_block
from ..ugraph.phase import Phase
from .cexpr import (CTYPES, REDUCE_INIT, Names, broadcast_coords, declare_coords, elementwise,
                    flit, linear, mask_value, prod, prune_unused, reduce_step, row_major)
from .errors import CodegenError
from .extents import KernelCounts
from .launch import KernelParam, LaunchSpec, TensorMapParam
from ..layout.mma import fma_micro_tile, tile_matmul, wgmma_operands
from ..layout.swizzle import Swizzle

BLOCK_IDX = ("blockIdx.x", "blockIdx.y", "blockIdx.z")


_declare = declare_coords


def _const_ints(decls: list[str]) -> list[str]:
    return [f"const int {', '.join(decls)};"] if decls else []


class BlockKernelEmitter:
    def __init__(self, gk: GraphKernel, kplan: KernelPlan, device: DevicePlan, kernel: str,
                 tensor_cores: bool = True, target: Target | None = None,
                 counts: KernelCounts | None = None):
        self.gk, self.bg, self.plan, self.device = gk, gk.block, kplan, device
        # grid and trip counts computed at launch (a padded graph; codegen_cuda/extents.py)
        self.counts = counts or KernelCounts()
        self.trips = "mp_trips" if self.counts.loop is not None else str(gk.block.forloop)
        self.target = target
        self.tensor_cores = tensor_cores
        self.info = kplan.info
        self.uses_wgmma = tensor_cores and bool(wgmma_operands(gk.block, kplan.info))
        self.kernel = kernel
        self.T, self.F = self.bg.threads, self.bg.forloop
        for n in (*gk.inputs, *(t.name for t in gk.outputs)):
            if device.layouts[n].extent >= 2**31:
                raise CodegenError(f"graph kernel #{kplan.index}: tensor {n!r} has 2^31 or more "
                                   "elements; graph-defined kernels index with 32-bit ints")
        self.tile = Names("s_")
        self.reg_acc = kplan.schedule.registers  # accumulator -> RegisterAccumulator
        pnames = Names("g_")
        self.in_params = [KernelParam(n, CTYPES[device.layouts[n].dtype], True, pnames(f"{n}#{i}")
                                      if n in gk.inputs[:i] else pnames(n))
                          for i, n in enumerate(gk.inputs)]
        self.out_params = [KernelParam(t.name, CTYPES[t.dtype], False, pnames(t.name))
                           for t in gk.outputs]
        tnames = Names("tm_")
        self.tensor_maps = {t: TensorMapParam(c.tensor, tnames(t), c)
                            for t, c in kplan.tma.items()}
        # TMA tiles loaded once per block use mbarrier 0; the pipeline's stages follow
        self.tma_once = [t for t in kplan.tma if t not in kplan.pipelined]
        self.stage_bar0 = 1 if self.tma_once else 0

    def regs(self, acc: str) -> str:
        return "r_" + self.tile(acc)[2:]

    # -- small pieces ---------------------------------------------------------------------------
    def shape(self, tile: str) -> tuple[int, ...]:
        return self.info.shapes[tile]

    def sw(self, tile: str, off: str) -> str:
        """Where logical element ``off`` of ``tile`` is stored (its XOR swizzle, if any)."""
        s = self.plan.swizzles.get(tile)
        return off if s is None else f"{swizzle_type(s)}::at({off})"

    def read(self, tile: str, off: str) -> str:
        e = f"{self.tile(tile)}[{self.sw(tile, off)}]"
        return e if self.info.dtypes[tile] == "float32" else f"to_float({e})"

    def loop(self, n: int, body: list[str], var: str = "i") -> list[str]:
        """Spread ``n`` work items over the block's T threads. With n <= T each thread has at
        most one item and gets no loop: ptxas cannot know blockDim.x == T, and unrolling a
        grid-stride loop it cannot bound made it spill in the combine kernels. Larger n keep the
        grid-stride loop (a counted, unrolled form made the attention kernels spill instead)."""
        inner = ["  " + b for b in body]
        if n > self.T:
            return [f"for (int {var} = threadIdx.x; {var} < {n}; {var} += {self.T}) {{", *inner,
                    "}"]
        head = f"  const int {var} = threadIdx.x;"
        return ["{" if n == self.T else f"if (threadIdx.x < {n}) {{", head, *inner, "}"]

    def operand_offset(self, tile: str, out_shape: tuple[int, ...],
                       out_coords: list[str] | None) -> str:
        """Offset into ``tile`` for output element ``i`` (NumPy broadcasting)."""
        shape = self.shape(tile)
        if (1,) * (len(out_shape) - len(shape)) + tuple(shape) == tuple(out_shape):
            return "i"
        assert out_coords is not None
        cs = broadcast_coords(out_coords, shape)
        return linear(list(zip(cs, row_major(shape))))

    def needs_coords(self, operands: list[str], out_shape: tuple[int, ...]) -> bool:
        return any((1,) * (len(out_shape) - len(self.shape(t))) + tuple(self.shape(t)) !=
                   tuple(out_shape) for t in operands)

    # -- steps ----------------------------------------------------------------------------------
    def emit_step(self, st: Step) -> list[str]:
        n = st.node
        if st.kind == LOAD:
            return self.emit_load(st)
        if st.kind == INIT and n.out in self.reg_acc:
            return [f"// {n.out} = accum.{n.kind}({n.input}): in registers (mma fragments) "
                    "until the loop ends",
                    f"float {self.regs(n.out)}{self.reg_acc[n.out].dims} = {{}};"]
        if st.kind == INIT:
            start = {"sum": "zero", "max": "-inf", "min": "+inf"}[n.kind]
            return [f"// {n.out} = accum.{n.kind}({n.input}): start at {start}",
                    *self.loop(prod(self.shape(n.out)),
                               [f"{self.tile(n.out)}[i] = {REDUCE_INIT[n.kind]};"])]
        if st.kind == ACCUMULATE and n.running and self.rescaled(n.out):
            return self.emit_running(st)
        if st.kind == RESCALE:
            return self.emit_rescale(st)
        if st.kind == ACCUMULATE:
            step = reduce_step(n.kind, f"{self.tile(n.out)}[i]", self.read(n.input, "i"))
            return [f"// {n.out} = {n.kind}({n.out}, {n.input})" if n.kind != "sum" else
                    f"// {n.out} += {n.input}", *self.loop(prod(self.shape(n.out)), [step + ";"])]
        if st.kind == SAVE:
            return self.emit_save(st)
        assert st.kind == COMPUTE
        if isinstance(n, Fused) or OPS.get(n.op) is not None and OPS[n.op].elementwise:
            return self.emit_elementwise(st)
        if n.op == "matmul":
            return self.emit_matmul(st)
        if n.op in ("sum", "max", "min"):
            return self.emit_reduce(st)
        if n.op in ("concat", "slice", "reshape", "transpose"):
            return self.emit_concat(st)
        raise NotImplementedError(f"block operator {n.op!r}")

    # -- online softmax -------------------------------------------------------------------------
    def rescaled(self, running: str) -> list[Accum]:
        """The sums a running accumulator rescales."""
        return [o for o in self.bg.ops if isinstance(o, Accum) and o.rescale == running]

    def emit_running(self, st: Step) -> list[str]:
        """A running max / min that sums are rescaled by: the new value, and after it (second
        half of the tile) this iteration's factor ``exp(m_old - m_new)`` -- 0 on the first
        iteration, where the sums are still zero."""
        n: Accum = st.node
        size = prod(self.shape(n.out))
        m = self.tile(n.out)
        op = "maxf" if n.kind == "max" else "minf"
        body = [f"const float m_old = {m}[i];",
                f"const float m_new = {op}(m_old, {self.read(n.input, 'i')});",
                f"{m}[i] = m_new;",
                f"{m}[{size} + i] = m_old == {REDUCE_INIT[n.kind]} ? 0.0f : "
                "expf(m_old - m_new);"]
        names = ", ".join(a.out for a in self.rescaled(n.out))
        return [f"// {n.out} = {n.kind}({n.out}, {n.input}), running; rescale factor of "
                f"{names} after it", *self.loop(size, body)]

    def emit_rescale(self, st: Step) -> list[str]:
        """``acc *= exp(m_old - m_new)`` before this iteration adds into the sum: in shared
        memory, or on the fragments where the sum stays in registers."""
        n: Accum = st.node
        shape = self.shape(n.out)
        decls, cs = _declare("i", shape)
        off = self.operand_offset(n.rescale, shape, cs)
        factor = f"{self.tile(n.rescale)}[{prod(self.shape(n.rescale))} + {off}]"
        uses = _const_ints(decls) if off != "i" else []
        head = f"// {n.out} *= exp({n.rescale}_old - {n.rescale}_new): the running " \
               f"{n.rescale} moved"
        if st.frag is not None:
            return [head + " (on the fragments in registers)",
                    *self.fragment_loop(self.reg_acc[n.out],
                                        [*uses, f"{self.regs(n.out)}[fr][fj][fi] *= {factor};"])]
        dst = f"{self.tile(n.out)}[{self.sw(n.out, 'i')}]"
        return [head, *self.loop(prod(shape), [*uses, f"{dst} *= {factor};"])]

    def emit_load(self, st: Step, iteration: str = "it", dst: str | None = None) -> list[str]:
        """The copy of an iterator's tile; ``iteration`` / ``dst``: which loop iteration's tile,
        and where it goes (the software pipeline prefetches into one of its buffers)."""
        if isinstance(st.node, MaskIter):
            return self.emit_mask(st, iteration)
        it: InputIter = st.node
        if it.gather >= 0:
            return self.emit_gather(st, iteration)
        inp = self.gk.inputs[it.input]
        lay = self.device.layouts[inp]
        shape = self.shape(it.out)
        terms: list[tuple[str, int]] = []
        for a in range(3):
            d = it.imap[a]
            if d >= 0 and self.bg.grid[a] > 1:
                terms.append((BLOCK_IDX[a], lay.shape[d] // self.bg.grid[a] * lay.strides[d]))
        if it.fmap >= 0 and self.F > 1:
            terms.append((iteration, shape[it.fmap] * lay.strides[it.fmap]))
        imap = ", ".join(f"{AXES[a]}->{it.imap[a]}" for a in range(3) if it.imap[a] >= 0)
        fmap = f" fmap={it.fmap}" if it.fmap >= 0 else ""
        head = f"// {it.out} = iter {inp} imap={{{imap}}}{fmap}"
        src = self.in_params[it.input].cname
        if st.vector > 1 and st.into:
            v = st.vector
            decls, cs = _declare("i", shape)
            off = linear(terms + list(zip(cs, lay.strides)))
            body = [f"const int i = v * {v};", *_const_ints(decls),
                    f"add16({self.tile(st.writes)} + i, {src} + {off});"]
            return [head + f", added into {st.writes}: 16-byte loads of {v} elements",
                    *self.loop(prod(shape) // v, body, var="v")]
        if st.vector > 1:
            v = st.vector
            decls, cs = _declare("i", shape)
            off = linear(terms + list(zip(cs, lay.strides)))
            body = [f"const int i = v * {v};", *_const_ints(decls),
                    f"cp_async16({dst or self.tile(it.out)} + {self.sw(it.out, 'i')}, "
                    f"{src} + {off});"]
            return [head + f": 16-byte asynchronous copies (cp.async) of {v} elements",
                    *self.loop(prod(shape) // v, body, var="v")]
        decls, cs = _declare("i", shape)
        off = linear(terms + list(zip(cs, lay.strides)))
        return self._element_copy(st, head, decls, f"{src}[{off}]")

    def _element_copy(self, st: Step, head: str, decls: list, value: str) -> list[str]:
        """An input tile element by element (element ``i``'s ``value``, its coordinates
        declared by ``decls``): stored into the tile, or added into the accumulator a step
        writes into."""
        it = st.node
        shape = self.shape(it.out)
        if st.into:
            acc = self.tile(st.writes)
            return [head + f", added into {st.writes}",
                    *self.loop(prod(shape), [*_const_ints(decls),
                                             f"{acc}[i] += to_float({value});"])]
        return [head, *self.loop(prod(shape), [*_const_ints(decls),
                                               f"{self.tile(it.out)}[{self.sw(it.out, 'i')}] = "
                                               f"{value};"])]

    def emit_gather(self, st: Step, iteration: str = "it") -> list[str]:
        """The tile of a gathering iterator: element (g..., r...) of the gathered tensor is
        element (ids[g...], r...) of the table, each row's address read from the indices
        (element by element: the schedule gives gathers no 16-byte copies)."""
        it: InputIter = st.node
        table, ids = self.gk.inputs[it.input], self.gk.inputs[it.gather]
        lay, ilay = self.device.layouts[table], self.device.layouts[ids]
        k = len(ilay.shape)
        gshape = tuple(ilay.shape) + tuple(lay.shape[1:])
        shape = self.shape(it.out)
        decls, cs = _declare("i", shape)
        coords = []
        for d in range(len(gshape)):
            parts = [cs[d]] if cs[d] != "0" else []
            for a in range(3):
                if it.imap[a] == d and self.bg.grid[a] > 1:
                    ext = gshape[d] // self.bg.grid[a]
                    parts.append(BLOCK_IDX[a] if ext == 1 else f"{BLOCK_IDX[a]} * {ext}")
            if it.fmap == d and self.F > 1:
                parts.append(f"{iteration} * {shape[d]}")
            coords.append(" + ".join(parts) if parts else "0")
        idx = self.in_params[it.gather].cname
        row = f"(long long){idx}[{linear(list(zip(coords[:k], ilay.strides)))}]"
        rest = linear(list(zip(coords[k:], lay.strides[1:])))
        off = f"{row} * {lay.strides[0]}" + (f" + {rest}" if rest != "0" else "")
        src = self.in_params[it.input].cname
        imap = ", ".join(f"{AXES[a]}->{it.imap[a]}" for a in range(3) if it.imap[a] >= 0)
        fmap = f" fmap={it.fmap}" if it.fmap >= 0 else ""
        head = (f"// {it.out} = iter {table}[{ids}] imap={{{imap}}}{fmap}: rows gathered by "
                f"the indices, element by element")
        return self._element_copy(st, head, decls, f"{src}[{off}]")

    def _result(self, st: Step, value: str) -> list[str]:
        """Store an element-wise step's ``value`` for element ``i`` (inside a fragment loop:
        into a register accumulator where the schedule keeps one)."""
        if st.frag and st.writes in self.reg_acc:  # a register tile of the same tiling:
            op = "+=" if self.reg_acc[st.writes].carried else "="  # a running sum, or the value
            return [f"{self.regs(st.writes)}[fr][fj][fi] {op} {value};"]
        op = "+=" if st.into else "="
        store = f"{self.tile(st.writes)}[{self.sw(st.writes, 'i')}] {op}"
        if st.also is None:
            return [f"{store} {value};"]
        return [f"const float f_val = {value};", f"{store} f_val;",
                f"{self.regs(st.also)}[fr][fj][fi] += f_val;  // {st.also} += {st.node.out}"]

    def _header(self, st: Step, text: str) -> str:
        return f"// {text}" + (f", added into {st.writes}" if st.into else "")

    def emit_elementwise(self, st: Step) -> list[str]:
        n = st.node
        out_shape = self.shape(n.out)
        regs = {t for t in n.operands if isinstance(t, str) and st.frag and t in self.reg_acc}
        tiles = [o for o in n.operands if isinstance(o, str) and o not in regs]
        body: list[str] = []
        out_coords = None
        if self.needs_coords(tiles, out_shape):
            decls, out_coords = _declare("i", out_shape)
            body += _const_ints(decls)
        if isinstance(n, Fused):
            text = f"{n.out} = thread[{n.thread.describe()}]({', '.join(n.operands)})"
            for k, t in enumerate(n.operands):
                val = f"{self.regs(t)}[fr][fj][fi]" if t in regs else \
                    self.read(t, self.operand_offset(t, out_shape, out_coords))
                body.append(f"const float in{k} = {val};")
            vals = Names("v_", {f"in{k}" for k in range(len(n.operands))})
            env = {f"in{k}": f"in{k}" for k in range(len(n.operands))}
            for t in n.thread.ops:
                args = [env[o] if isinstance(o, str) else flit(o) for o in t.operands]
                consts = tuple(None if isinstance(o, str) else o for o in t.operands)
                env[t.out] = vals(t.out)
                body.append(f"const float {env[t.out]} = "
                            f"{elementwise(t.op, args, consts, t.attrs)};")
            body += self._result(st, env[n.thread.ops[-1].out])
        else:
            text = f"{n.out} = {n.op}({', '.join(map(str, n.operands))})"
            args = []
            for o in n.operands:
                if o in regs:
                    args.append(f"{self.regs(o)}[fr][fj][fi]")
                elif isinstance(o, str):
                    args.append(self.read(o, self.operand_offset(o, out_shape, out_coords)))
                else:
                    args.append(flit(o))
            consts = tuple(None if isinstance(o, str) else o for o in n.operands)
            body += self._result(st, elementwise(n.op, args, consts, n.attrs))
        if st.frag:
            reg = self.reg_acc.get(st.writes)
            keep = reg is not None and not reg.carried and not st.into
            decl = [f"float {self.regs(st.writes)}{reg.dims} = {{}};"] if keep else []
            where = " (kept in registers: its readers take the fragments)" if keep else ""
            return [self._header(st, text + f", from {st.frag}'s fragments in registers{where}"),
                    *decl, *self.fragment_loop(self.reg_acc[st.frag], body)]
        return [self._header(st, text), *self.loop(prod(out_shape), body)]

    def fragment_loop(self, ra, body: list[str]) -> list[str]:
        """Run ``body`` for every output element this thread holds as an mma fragment of a
        register accumulator with tiling ``ra``; ``i`` is the element's offset in the tile."""
        m, n = ra.m, ra.n
        # fully unrolled: the register array must only ever be indexed by constants
        return ["{", f"  using FT = MmaTiling<{ra.tiling}>;",
                "#pragma unroll",
                "  for (int fr = 0; fr < FT::ROUNDS; ++fr) {",
                "    if (!FT::owns(fr)) continue;",
                "    const int fu = FT::unit(fr), fm0 = FT::row0(fu), fc0 = FT::col0(fu);",
                "#pragma unroll",
                f"    for (int fj = 0; fj < {ra.cfg.ng}; ++fj)",
                "#pragma unroll",
                "      for (int fi = 0; fi < 4; ++fi) {",
                f"        const int frow = FragCoord<{n}>::row(fm0, fi);",
                f"        const int fcol = FragCoord<{n}>::col(fc0, fj, fi);",
                f"        if (frow >= {m} || fcol >= {n}) continue;",
                f"        const int i = FT::batch(fu) * {m * n} + frow * {n} + fcol;",
                *("        " + b for b in body), "      }", "  }", "}"]

    def emit_matmul(self, st: Step) -> list[str]:
        n: BlockOp = st.node
        a, b = n.operands
        sa, sb, so = self.shape(a), self.shape(b), self.shape(n.out)
        m, k, nn = sa[-2], sa[-1], sb[-1]
        batch = so[:-2]
        acc = "true" if st.into else "false"
        args = f"{self.tile(st.writes)}, {self.tile(a)}, {self.tile(b)}"
        if prod(batch) == 1:
            offsets = ("NoOffset()", "NoOffset()")
        else:
            decls, bc = _declare("bt", batch, prefix="b")
            defs = dict(d.split(" = ", 1) for d in decls)

            def batch_offset(shape: tuple[int, ...]) -> str:
                cs = broadcast_coords(bc, shape[:-2])
                off = linear(list(zip(cs, row_major(shape)[:-2])))
                if off == "0":
                    return "NoOffset()"
                used = [f"{c} = {defs[c]}" for c in cs if c in defs]
                pre = f"const int {', '.join(used)}; " if used else ""
                return f"[](int bt) {{ {pre}return {off}; }}"
            offsets = (batch_offset(sa), batch_offset(sb))
        tm = tile_matmul(n, self.info, self.T, self.bg)
        mma = tm.cfg if self.tensor_cores else None
        if st.frag is not None:
            return self.emit_matmul_register_a(st, tm, offsets[1])
        if mma is None:
            tmi, tni = fma_micro_tile(prod(batch), m, nn, self.T)
            head = self._header(st, f"{n.out} = matmul({a}, {b}): {sa} @ {sb}, fp32 FMA "
                                    f"({tmi} x {tni} outputs a thread)")
            tparams = f"{prod(batch)}, {m}, {nn}, {k}, {self.T}, {acc}, {tmi}, {tni}"
            if prod(batch) == 1:
                return [head, f"tile_fma<{tparams}>({args}, NoOffset(), NoOffset());"]
            return [head, f"tile_fma<{tparams}>(", f"    {args},", f"    {offsets[0]},",
                    f"    {offsets[1]});"]
        how = "warpgroup MMA on sm_90a, else mma.sync" if mma.wgmma else "tensor cores"
        head = self._header(st, f"{n.out} = matmul({a}, {b}): {sa} @ {sb}, {how} "
                                f"({mma.etype}, {mma.warps} warps x units of 16 x {8 * mma.ng})")
        swz = [self.plan.swizzles.get(t) for t in (a, b)]
        swz_args = ""
        if any(swz) or mma.wgmma:
            swz_args = ", " + ", ".join("NoSwizzle" if z is None else swizzle_type(z)
                                        for z in swz)
        if mma.wgmma:
            return self.into_fragments(
                st, head, tm, f"tile_wgmma<{self.tiling(tm)}, {mma.etype}{swz_args}>(",
                [f"{self.tile(a)}, {self.tile(b)},", f"{offsets[0]},", f"{offsets[1]});"])
        if st.writes in self.reg_acc:
            reg = self.reg_acc[st.writes]
            tparams = f"{reg.tiling}, {mma.etype}{swz_args}"
            decl = [] if reg.carried else [f"float {self.regs(st.writes)}{reg.dims} = {{}};"]
            return [head + " (registers)", *decl, f"tile_mma_regs<{tparams}>(",
                    f"    {self.regs(st.writes)}, {self.tile(a)}, {self.tile(b)},",
                    f"    {offsets[0]},", f"    {offsets[1]});"]
        tparams = f"{prod(batch)}, {m}, {nn}, {k}, {mma.warps}, {mma.ng}, {acc}, {mma.etype}"
        return [head, f"tile_mma<{tparams}{swz_args}>(", f"    {args},", f"    {offsets[0]},",
                f"    {offsets[1]});"]

    def emit_matmul_register_a(self, st: Step, tm, b_offset: str) -> list[str]:
        """A tile matmul whose A operand is the fragments of register tile ``st.frag`` (same
        row tiling, unit for unit): ``tile_mma_rega``; the product stays in registers where the
        schedule keeps it, else goes to shared memory once."""
        n: BlockOp = st.node
        a, b = n.operands
        mma = tm.cfg
        sb = self.plan.swizzles.get(b)
        head = self._header(st, f"{n.out} = matmul({a}, {b}): {self.shape(a)} @ {self.shape(b)}, "
                                f"tensor cores with A from {a}'s fragments in registers "
                                f"({mma.etype}, {mma.warps} warps x units of 16 x {tm.n})")
        call = f"tile_mma_rega<{self.tiling(tm)}, {mma.etype}, " + \
            ("NoSwizzle" if sb is None else swizzle_type(sb)) + ">("
        return self.into_fragments(st, head, tm, call,
                                   [f"{self.regs(a)}, {self.tile(b)},", f"{b_offset});"])

    @staticmethod
    def tiling(tm) -> str:
        """The template arguments ``BATCH, M, N, K, WARPS`` of a tile matmul in units of
        16 x N (warpgroup MMA, A from registers)."""
        return f"{tm.batch}, {tm.m}, {tm.n}, {tm.k}, {tm.cfg.warps}"

    def into_fragments(self, st: Step, head: str, tm, call: str, args: list[str]) -> list[str]:
        """A tensor-core product in units of 16 x N: ``call`` (a template call's opening) with
        the accumulator and then ``args`` (argument lines, the last closing the call). The
        product lands in the register tile the schedule keeps for it, or in a temporary that
        goes to (or is added into) shared memory once."""
        if st.writes in self.reg_acc:
            reg = self.reg_acc[st.writes]
            decl = [] if reg.carried else [f"float {self.regs(st.writes)}{reg.dims} = {{}};"]
            return [head + " (registers)", *decl, call,
                    f"    {self.regs(st.writes)}, {args[0]}", *("    " + x for x in args[1:])]
        mma = tm.cfg
        dims = f"[{mma.rounds(tm.batch, tm.m, tm.n)}][{mma.ng}][4]"
        acc = "true" if st.into else "false"
        return [head, "{", f"  float w_acc{dims} = {{}};", f"  {call}",
                f"      w_acc, {args[0]}", *("      " + x for x in args[1:]),
                f"  frags_to_smem<{self.tiling(tm)}, {mma.ng}, {acc}>({self.tile(st.writes)}, "
                "w_acc);", "}"]

    def emit_mask(self, st: Step, iteration: str = "it") -> list[str]:
        """A mask iterator's tile: each element's 0/1 value from its row and column in the
        mask (the tile's start: the block's part along grid-split dims, the iteration's along
        the loop's)."""
        mk: MaskIter = st.node
        shape = self.shape(mk.out)
        decls, cs = _declare("i", shape)
        pos = []
        for d in range(2):
            terms = [cs[d]] if cs[d] != "0" else []
            for a in range(3):
                if mk.imap[a] == d and self.bg.grid[a] > 1:
                    terms.append(f"{BLOCK_IDX[a]} * {mk.shape[d] // self.bg.grid[a]}")
            if mk.fmap == d and self.F > 1:
                terms.append(f"{iteration} * {shape[d]}")
            pos.append(" + ".join(terms) or "0")
        value = mask_value(pos[0], pos[1], mk.offset, mk.window, mk.valid)
        head = (f"// {mk.out} = mask {tuple(mk.shape)} offset={mk.offset} window={mk.window}: "
                "0/1 from indices")
        return [head, *self.loop(prod(shape), [
            *_const_ints(decls), f"store({self.tile(mk.out)} + {self.sw(mk.out, 'i')}, {value});"])]

    def emit_reduce(self, st: Step) -> list[str]:
        n: BlockOp = st.node
        src = n.operands[0]
        op = n.op
        if st.frag is not None:  # row sums of a register tile's fragments
            reg = self.reg_acc[st.frag]
            return [self._header(st, f"{n.out} = sum({src}) over its rows, from {src}'s "
                                     "fragments in registers (quad shuffles)"),
                    f"frag_row_sums<{reg.batch}, {reg.m}, {reg.n}, {reg.cfg.warps}, "
                    f"{'true' if st.into else 'false'}>({self.tile(st.writes)}, "
                    f"{self.regs(src)});"]
        shape = self.shape(src)
        axes = tuple(sorted(n.attr("axes")))
        kept = [d for d in range(len(shape)) if d not in axes]
        nout = prod(shape[d] for d in kept)
        red = prod(shape[d] for d in axes)
        strides = row_major(shape)
        kdecls, kc = _declare("o", tuple(shape[d] for d in kept), prefix="k")
        rdecls, rc = _declare("r", tuple(shape[d] for d in axes), prefix="r")
        off = linear(list(zip(kc, [strides[d] for d in kept])) +
                     list(zip(rc, [strides[d] for d in axes])))
        dst = f"{self.tile(st.writes)}[o] {'+=' if st.into else '='} acc;"
        head = self._header(st, f"{n.out} = {op}({src}) axes={axes} keepdims="
                                f"{bool(n.attr('keepdims', True))}")
        what = {"sum": "sums", "max": "maxima", "min": "minima"}[op]
        init = f"float acc = {REDUCE_INIT[op]};"

        def inner(start: str, step: str) -> list[str]:
            return [f"for (int r = {start}; r < {red}; r += {step}) {{",
                    *("  " + d for d in _const_ints(rdecls)),
                    f"  {reduce_step(op, 'acc', self.read(src, off))};", "}"]
        g = 1
        while g * 2 <= min(32, self.T // nout if nout else 1):
            g *= 2
        if g == 1:
            body = [*_const_ints(kdecls), init, *inner("0", "1"), dst]
            return [head + f": {nout} {what} of {red} elements",
                    *self.loop(nout, body, var="o")]
        guard = self.T // g > nout
        red_loop = [*_const_ints(kdecls), *inner("lane", str(g))]
        lines = [head + f": {nout} {what} of {red} elements, {g} threads each", "{",
                 f"  const int o = threadIdx.x / {g}, lane = threadIdx.x % {g};",
                 f"  {init}"]
        if guard:
            lines += [f"  if (o < {nout}) {{", *("    " + s for s in red_loop), "  }"]
        else:
            lines += ["  " + s for s in red_loop]
        s = g // 2
        while s >= 1:
            lines.append(f"  {reduce_step(op, 'acc', f'__shfl_xor_sync(0xffffffffu, acc, {s})')};")
            s //= 2
        cond = f"o < {nout} && lane == 0" if guard else "lane == 0"
        lines += [f"  if ({cond}) {dst}", "}"]
        return lines

    def emit_concat(self, st: Step) -> list[str]:
        """Concatenation (each element reads the operand that holds it), slices (a
        concatenation of one operand, read from an offset), reshapes (a copy) and transposes
        (a copy with permuted strides)."""
        n: BlockOp = st.node
        out_shape = self.shape(n.out)
        if n.op == "reshape":  # both tiles row-major: element i is element i
            src = n.operands[0]
            return [self._header(st, f"{n.out} = reshape({src}) {self.shape(src)} -> "
                                     f"{out_shape}"),
                    *self.loop(prod(out_shape), self._result(st, self.read(src, "i")))]
        if n.op == "transpose":  # output dim k is source dim perm[k]
            src = n.operands[0]
            perm = tuple(n.attr("perm"))
            decls, cs = _declare("i", out_shape)
            strides = row_major(self.shape(src))
            off = linear([(cs[k], strides[p]) for k, p in enumerate(perm)])
            return [self._header(st, f"{n.out} = transpose({src}, {perm})"),
                    *self.loop(prod(out_shape),
                               [*_const_ints(decls), *self._result(st, self.read(src, off))])]
        if n.op == "slice":
            ax, start = n.attr("axis"), n.attr("start")
            decls, cs = _declare("i", out_shape)
            src = n.operands[0]
            tcs = list(cs)
            tcs[ax] = f"({cs[ax]} + {start})" if cs[ax] != "0" else str(start)
            off = linear(list(zip(tcs, row_major(self.shape(src)))))
            body = [*_const_ints(decls), *self._result(st, self.read(src, off))]
            return [self._header(st, f"{n.out} = {src}[{start}:{n.attr('stop')}] along axis "
                                     f"{ax}"), *self.loop(prod(out_shape), body)]
        ax = n.attr("axis", -1) % len(out_shape)
        decls, cs = _declare("i", out_shape)
        cax = cs[ax]
        body = [*_const_ints(decls), "float v;"]
        lo = 0
        for j, t in enumerate(n.operands):
            shape = self.shape(t)
            tcs = list(cs)
            tcs[ax] = f"({cax} - {lo})" if lo else cax
            off = linear(list(zip(tcs, row_major(shape))))
            hi = lo + shape[ax]
            kw = "if" if j == 0 else "else if"
            cond = f"{kw} ({cax} < {hi}) " if j < len(n.operands) - 1 else "else "
            body.append(f"{cond if len(n.operands) > 1 else ''}v = {self.read(t, off)};")
            lo = hi
        body += self._result(st, "v")
        return [self._header(st, f"{n.out} = concat({', '.join(n.operands)}) axis={ax}"),
                *self.loop(prod(out_shape), body)]

    def emit_save(self, st: Step) -> list[str]:
        n: OutputSaver = st.node
        out = self.gk.outputs[n.output]
        lay = self.device.layouts[out.name]
        shape = self.shape(n.input)
        terms = []
        for a in range(3):
            d = n.omap[a]
            if d >= 0 and self.bg.grid[a] > 1:
                terms.append((BLOCK_IDX[a], shape[d] * lay.strides[d]))
        decls, cs = _declare("i", shape)
        off = linear(terms + list(zip(cs, lay.strides)))
        omap = ", ".join(f"{AXES[a]}->{n.omap[a]}" for a in range(3) if n.omap[a] >= 0)
        dst = self.out_params[n.output].cname
        head = f"// save {n.input} -> {out.name} omap={{{omap}}}"
        if st.vector > 1:
            per = st.vector
            body = [f"const int i = v * {per};", *_const_ints(decls),
                    f"store16({dst} + {off}, {self.tile(n.input)} + {self.sw(n.input, 'i')});"]
            return [head + f": 16-byte stores of {per} elements",
                    *self.loop(prod(shape) // per, body, var="v")]
        return [head, *self.loop(prod(shape), [*_const_ints(decls),
                                               f"store({dst} + {off}, {self.read(n.input, 'i')});"])]

    # -- the cp.async software pipeline ---------------------------------------------------------
    def stage_buffers(self, tile: str) -> str:
        return f"{self.tile(tile)}_stages"

    def buffer(self, tile: str, iteration: str) -> str:
        n = prod(self.shape(tile))
        return f"{self.stage_buffers(tile)} + ({iteration}) % {self.plan.pipeline} * {n}"

    def prefetch(self, steps: list[Step], iteration: str) -> list[str]:
        """The copies of ``iteration``'s pipelined tiles into their buffers: 16-byte cp.async
        copies, or -- where TMA is compiled in -- one TMA copy per qualifying tile, issued by
        thread 0 on the stage's mbarrier."""
        def cp_async(sts: list[Step]) -> list[str]:
            out = []
            for st in sts:
                out += self.emit_load(st, iteration, f"({self.buffer(st.writes, iteration)})")
            return out
        tma = [st for st in steps if st.writes in self.tensor_maps]
        if not tma:
            return cp_async(steps)
        bar = self.stage_bar(f"({iteration})")
        issue = self.tma_issue(tma, iteration, bar,
                               {st.writes: self.buffer(st.writes, iteration) for st in tma})
        return ["#ifdef MIRAGE_TMA", *issue, *cp_async([st for st in steps if st not in tma]),
                "#else", *cp_async(steps), "#endif"]

    def stage_bar(self, iteration: str) -> str:
        """The mbarrier of the pipeline stage of ``iteration`` (a parenthesised expression)."""
        base = f"tma_bar + {self.stage_bar0}" if self.stage_bar0 else "tma_bar"
        return f"{base} + {iteration} % {self.plan.pipeline}"

    def tma_issue(self, steps: list[Step], iteration: str, bar: str,
                  dst: dict[str, str]) -> list[str]:
        """Thread 0 arms mbarrier ``bar`` with the bytes of ``steps``' tiles and issues one
        TMA copy per tile into ``dst[tile]``."""
        lines = ["if (threadIdx.x == 0) {  // one thread arms the mbarrier and issues",
                 f"  mbar_expect_tx({bar}, "
                 f"{sum(self.tensor_maps[st.writes].copy.nbytes for st in steps)});"]
        for st in steps:
            c = self.tensor_maps[st.writes].copy
            coords = ", ".join(self.tma_coords(st, iteration))
            lines.append(f"  tma_load<{c.rank}>({dst[st.writes]}, "
                         f"{self.tensor_maps[st.writes].cname}, {bar}, {coords});  "
                         f"// {st.writes}: box {c.box} of {c.tensor}"
                         + (f", {16 << c.swizzle}B swizzle" if c.swizzle else ""))
        return lines + ["}"]

    def tma_coords(self, st: Step, iteration: str) -> list[str]:
        """The tile's start in the tensor, one coordinate per tensor-map dim (innermost
        first): the block's part along grid-split dims plus the iteration's along the loop's."""
        it: InputIter = st.node
        lay = self.device.layouts[self.gk.inputs[it.input]]
        out = []
        for d in self.tensor_maps[st.writes].copy.logical:
            terms = [f"{BLOCK_IDX[a]} * {lay.shape[d] // self.bg.grid[a]}"
                     if lay.shape[d] > self.bg.grid[a] else BLOCK_IDX[a] for a in range(3)
                     if it.imap[a] == d and self.bg.grid[a] > 1]
            if it.fmap == d and self.F > 1:
                terms.append(f"({iteration}) * {self.shape(it.out)[d]}")
            out.append(" + ".join(terms) or "0")
        return out

    def pipeline_wait(self) -> list[str]:
        """Wait until this iteration's pipelined tiles have landed."""
        s = self.plan.pipeline
        cp = ["cp_async_commit();", f"cp_async_wait_group<{s - 1}>();  // this iteration's tiles landed"]
        if not self.tensor_maps:
            return cp
        rest = [t for t in self.plan.pipelined if t not in self.tensor_maps]
        return ["#ifdef MIRAGE_TMA", *(cp if rest else []),
                f"mbar_wait({self.stage_bar('it')}, (it / {s}) & 1);  // this iteration's TMA "
                "tiles landed", "#else", *cp, "#endif"]

    def emit_stage(self, stage: int) -> list[str]:
        steps = self.plan.schedule.in_stage(stage)
        piped = [st for st in steps if st.kind == LOAD and st.writes in self.plan.pipelined]
        once = [st for st in steps if st.kind == LOAD and st.writes in self.tma_once]
        out: list[str] = []
        for st in steps:
            if st not in piped and st not in once:
                out += self.emit_step(st)
        if once:  # tiles loaded once per block: TMA on mbarrier 0 (phase 0), else cp.async
            cp = [x for st in once for x in self.emit_load(st)]
            others = any(st.kind == LOAD and st.vector > 1 and not st.into and st not in once
                         for st in steps)
            out += ["#ifdef MIRAGE_TMA",
                    *self.tma_issue(once, "0", "tma_bar", {st.writes: self.tile(st.writes)
                                                           for st in once}),
                    *(["cp_async_wait_all();  // this thread's copies landed"] if others else []),
                    "mbar_wait(tma_bar, 0);  // the TMA tiles landed",
                    "#else", *cp, "cp_async_wait_all();  // this thread's copies landed",
                    "#endif"]
        elif piped:
            s, ahead = self.plan.pipeline, f"it + {self.plan.pipeline - 1}"
            out += [f"if ({ahead} < {self.trips}) {{  // prefetch iteration {ahead} "
                    f"({s} stages in flight)",
                    *("  " + x for x in self.prefetch(piped, ahead)), "}",
                    *self.pipeline_wait()]
        elif any(st.kind == LOAD and st.vector > 1 and not st.into for st in steps):
            out.append("cp_async_wait_all();  // this thread's copies landed")
        return out

    def pipeline_prologue(self) -> list[str]:
        piped = [st for st in self.plan.schedule.steps
                 if st.kind == LOAD and st.writes in self.plan.pipelined]
        out = [f"// software pipeline: iterations 0..{self.plan.pipeline - 2} of "
               f"{', '.join(self.plan.pipelined)} in flight before the loop"]
        commit = ["cp_async_commit();"]
        if piped and all(st.writes in self.tensor_maps for st in piped):
            commit = ["#ifndef MIRAGE_TMA", *commit, "#endif"]  # no cp.async group to close
        for j in range(self.plan.pipeline - 1):
            copies = self.prefetch(piped, str(j))
            if self.counts.loop is not None and j:  # no copy past the last iteration run
                copies = [f"if ({j} < mp_trips) {{", *("  " + x for x in copies), "}"]
            out += [*copies, *commit]
        return out

    def tma_barriers(self) -> list[str]:
        """The mbarriers of the TMA copies -- one for the tiles loaded once, one per pipeline
        stage -- set up by thread 0."""
        piped = any(t in self.plan.pipelined for t in self.tensor_maps)
        n = self.stage_bar0 + (self.plan.pipeline if piped else 0)
        what = ", ".join(x for x in (("1 for the tiles loaded once" if self.stage_bar0 else ""),
                                     (f"{self.plan.pipeline} for the pipeline stages"
                                      if piped else "")) if x)
        return ["#ifdef MIRAGE_TMA",
                "unsigned long long* const tma_bar = reinterpret_cast<unsigned long long*>"
                f"(smem + {self.plan.barriers});  // {n} mbarriers: {what}",
                "if (threadIdx.x == 0) {", f"  for (int s = 0; s < {n}; ++s) mbar_init(tma_bar + s, 1);",
                "  mbar_fence_init();", "}", "__syncthreads();  // the mbarriers are set up",
                "#endif"]

    # -- the kernel -----------------------------------------------------------------------------
    def barrier(self) -> str:
        """A block barrier; with warpgroup MMAs each thread first makes its shared-memory writes
        visible to the async proxy wgmma reads through."""
        if self.uses_wgmma:
            return "fence_view_async_shared(); __syncthreads();"
        return "__syncthreads();"

    def one_block_per_sm(self, smem_bytes: int) -> bool:
        """Promise ptxas one resident block per SM (``__launch_bounds__(T, 1)``)? Yes when
        threads or shared memory leave room for only one anyway, and when the kernel keeps
        register tiles in a block of 512 threads or more: those are sized against the whole
        per-thread share of one block (``layout.mma.register_budget``), while ptxas, told only
        the thread count, budgets for two such blocks -- 64 registers -- and spilled (superopt's
        one-kernel qknorm_gqa, 512 threads, 24 bytes)."""
        if self.reg_acc and self.T >= 512:
            return True
        t = self.target
        if t is None:
            return False
        blocks = t.max_threads_per_sm // self.T
        if smem_bytes:
            blocks = min(blocks, t.smem_per_sm // (smem_bytes + t.smem_reserved_per_block))
        return blocks <= 1

    def emit(self) -> tuple[str, LaunchSpec]:
        sched, smem = self.plan.schedule, self.plan.smem
        loop = self.counts.loop
        dims = tuple(sorted(set(op_params(self.gk)) | set(loop.dims if loop else ())))
        spec = LaunchSpec(self.kernel, self.plan.index, self.bg.grid, (self.T, 1, 1),
                          smem.total_bytes, tuple(self.in_params + self.out_params),
                          1 if self.one_block_per_sm(smem.total_bytes) else 0,
                          tuple(self.tensor_maps.values()), dims, self.counts.grid)
        lines = [f"// {'-' * 94}", f"// graph-defined kernel #{self.plan.index}: "
                 f"grid {self.bg.grid}, {self.T} threads, for-loop of {self.F}"]
        outs = ", ".join(f"{t.name}: {t.shape} {t.dtype}" for t in self.gk.outputs)
        lines.append(f"//   {outs} = graph_kernel({', '.join(self.gk.inputs)}):")
        lines += ["// " + s for s in format_block(self.bg, self.gk.inputs,
                                                  tuple(t.name for t in self.gk.outputs))]
        lines.append(f"// shared memory: {smem.total_bytes} bytes "
                     f"(validate() bound {self.info.smem_bytes}); "
                     f"barriers per block: {sched.barriers(self.F)}")
        lines += [f"// {'-' * 94}", spec.signature() + " {"]
        body: list[str] = []
        if smem.buffers:
            # one alignment for every kernel of a translation unit (nvcc warns on two); the
            # dynamic window starts 1 KB aligned, which wgmma's swizzle atoms rely on
            body.append("extern __shared__ __align__(1024) unsigned char smem[];")
        for buf in sorted(smem.buffers, key=lambda b: (smem.offsets[b.name], b.name)):
            ct = CTYPES[self.info.dtypes[buf.name]]
            z = self.plan.swizzles.get(buf.name)
            piped = buf.name in self.plan.pipelined
            name = self.stage_buffers(buf.name) if piped else self.tile(buf.name)
            body.append(f"{ct}* const {name} = reinterpret_cast<{ct}*>"
                        f"(smem + {smem.offsets[buf.name]});  // {self.shape(buf.name)} "
                        f"{self.info.dtypes[buf.name]}, stages {buf.start}-{buf.end}"
                        + (f", {self.plan.pipeline} pipeline buffers" if piped else "")
                        + (f", stored with {z}" if z else "")
                        + (", by TMA" if buf.name in self.tensor_maps else ""))
        if self.tensor_maps:
            body += self.tma_barriers()
        indent = ""
        for kind, arg in sched.program():
            if kind == "stage":
                seg = next(s.segment for s in sched.in_stage(arg))
                body.append("")
                body.append(f"{indent}// == stage {arg} ({_SEGMENT_TEXT[seg]}) ==")
                body += [indent + s for s in self.emit_stage(arg)]
            elif kind == "barrier":
                body.append(f"{indent}{self.barrier()}  // {arg}")
            elif kind == "loop":
                if loop is not None:
                    body += ["", f"// iterations that run: those not wholly past {loop.valid!r} "
                                 f"(tiles of {loop.part}; at most {self.F}, at least 1)",
                             f"const int mp_trips_left = {loop.c_unclamped()};",
                             f"const int mp_trips = {loop.clamp('mp_trips_left')};"]
                if self.plan.pipelined:
                    body.append("")
                    body += self.pipeline_prologue()
                if self.F > 1:
                    body.append("")
                    body.append(f"for (int it = 0; it < {self.trips}; ++it) {{")
                    indent = "  "
                    for t in self.plan.pipelined:
                        ct = CTYPES[self.info.dtypes[t]]
                        body.append(f"  {ct}* const {self.tile(t)} = {self.buffer(t, 'it')};")
            elif kind == "end_loop":
                if self.F > 1:
                    indent = ""
                    body.append("}")
                for acc in sched.spilled:
                    body += [f"// {acc}: the accumulator's fragments to shared memory, once",
                             f"frags_to_smem<{self.reg_acc[acc].tiling}>({self.tile(acc)}, "
                             f"{self.regs(acc)});"]
                if sched.spilled and sched.loop_barrier:
                    body.append(f"{self.barrier()}  // accumulators are complete")
        lines += ["  " + s if s else "" for s in prune_unused(body)]
        lines.append("}")
        return "\n".join(lines) + "\n", spec


def swizzle_type(s: Swizzle) -> str:
    """The prelude's ``Swizzle<B, M, S>`` struct for ``s``."""
    return f"Swizzle<{s.bits}, {s.base}, {s.shift}>"


_SEGMENT_TEXT = {Phase.PRE: "before the loop", Phase.BODY: "loop body",
                 Phase.POST: "after the loop"}


def emit_block_kernel(gk: GraphKernel, kplan: KernelPlan, device: DevicePlan,
                      kernel: str, tensor_cores: bool = True,
                      target: Target | None = None,
                      counts: KernelCounts | None = None) -> tuple[str, LaunchSpec]:
    return BlockKernelEmitter(gk, kplan, device, kernel, tensor_cores, target, counts).emit()
