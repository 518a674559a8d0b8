"""``superopt`` of a symbolic program: one search serves every size in its dims' ranges.

A symbolic program (``mp.dim``, lax/shapes.py) is a family of programs. Its answer:

1. **Buckets.** Each dim's range is cut into buckets (powers of two, or the sizes the caller
   gives, like vLLM's capture sizes). A bucket is one *padded* program (lax/family.py): every
   dim at the bucket's size, inputs zero-filled past the valid sizes, which only its masks name.
2. **One search**, at the representative bucket (the one holding ``representative``, default a
   middle size), with the valid sizes bound to the bucket's: the ordinary superopt (regions,
   search, tuning, verification, cover), whose answer is one graph for the whole bucket -- its
   masks keep the valid sizes as expressions, bound when it runs. ``representative`` may list
   several sizes: one search each (a short KV cache is best served by one kernel, a long one by
   a split reduction; a structure found at one size does not become the other by rescaling).
3. **The family check.** The representatives' chosen pieces are verified again with the valid
   sizes bound to the bucket's edge cases (a partial last tile, half the bucket, the dim's
   smallest size): the same graph must be right wherever the valid part ends
   (docs/verifier.md, "Shape families").
4. **Other buckets without searching.** The first call at a new bucket builds its padded
   program and *replays* each representative's cover: the same pieces at the same places, each
   region's schedule replayed keeping its tiles and loop chunks or its part counts, the cheaper
   under the cost model (``generator.kernel_search.rescale_trace``), verified for that bucket;
   the cheapest replay is kept. Labels are matched by the dims they name
   (``generator.labels.label_correspondences``), so a representative of size 1 -- a batch of one,
   whose dim has no label -- replays to the larger buckets with that dim grown from 1. A region
   whose replay does not apply -- a bucket of size 1 from a larger representative, where a dim
   loses its label -- is searched there alone; so a dim whose representatives are all longer
   than 1 has no bucket of size 1 (unless the caller gives the buckets): size 1 runs padded in
   the next bucket. Buckets are kept, so a sequence of
   calls searches once per structure.
5. **Every size that runs is verified.** The first call at a binding of the valid sizes runs
   the finite-field check of its bucket's graph there (``check_sizes``, kept): the stated bound
   holds at each size a call used, not only at the checked edges.

``FamilyProgram.run_numpy`` binds the sizes from the inputs, picks the bucket, checks the sizes
(5.), zero-fills the inputs, runs the bucket's graph with the valid sizes bound and cuts the
outputs back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..errors import OptionError, ShapeError
from ..lax.family import bucket_of, buckets, cut_outputs, pad_inputs, padded
from ..lax.program import Program
from ..lax.shapes import Dim

#: the default representative size of a dim (clamped to its range): large enough that a
#: structure found there tiles and loops the way long sizes need, small enough to search fast
REPRESENTATIVE = 512


class FamilyProgram:
    """The answer for a symbolic program (module docstring): ``answers`` are the searched
    representative buckets' OptimizedPrograms (``answer``, ``representative``: the first);
    ``instance(bucket)`` any other bucket's, replayed."""

    def __init__(self, program: Program, buckets_by_dim: dict[str, tuple[int, ...]],
                 answers: dict[tuple, Any], options: dict[str, Any],
                 family_checks: list, search_seconds: float, verify_sizes: bool = True):
        self.program = program
        self.buckets = buckets_by_dim
        self.answers = answers
        first = next(iter(answers))
        self.representative = dict(first)
        self.answer = answers[first]
        self.options = options
        self.family_checks = family_checks
        self.search_seconds = search_seconds
        self.instances: dict[tuple, Any] = dict(answers)
        self.instance_seconds: dict[tuple, float] = {}
        # every binding of the valid sizes a call has used, verified once (verify_sizes)
        self.verify_sizes = verify_sizes
        self.size_checks: dict[tuple, SizeCheck] = {}
        self._compiled: dict[tuple, Any] = {}  # bucket -> its CompiledGraph (GPU calls)

    # -- buckets --------------------------------------------------------------------------------
    @staticmethod
    def _key(bucket: Mapping[str, int]) -> tuple:
        return tuple(sorted(bucket.items()))

    def bucket(self, sizes: Mapping[str, int]) -> dict[str, int]:
        """The bucket that holds ``sizes`` (dim name -> size)."""
        return {n: bucket_of(int(sizes[n]), self.buckets[n], n) for n in self.buckets}

    def instance(self, bucket: Mapping[str, int]) -> Any:
        """The bucket's OptimizedProgram (a padded program), built the first time it is asked
        for: each representative's answer replayed there, the cheapest kept."""
        key = self._key(bucket)
        if key not in self.instances:
            from . import superopt
            t0 = time.perf_counter()
            prog = padded(self.program, bucket)
            # sizes of 1 drop no-ops (a max over one element): another structure, searched
            outline = _outline(prog)
            same = [a for a in self.answers.values() if _outline(a.program) == outline]
            built = [superopt(prog, sizes=dict(bucket), replay=a, **self.options)
                     for a in same] or [superopt(prog, sizes=dict(bucket), **self.options)]
            self.instances[key] = min(built, key=lambda o: o.estimated_time_us)
            self.instance_seconds[key] = time.perf_counter() - t0
        return self.instances[key]

    def check_sizes(self, sizes: Mapping[str, int]) -> SizeCheck:
        """The finite-field check of the bucket graph that serves ``sizes`` at exactly these
        valid sizes, run the first time they are used and kept: every size a call runs at is
        verified to ``DEFAULT_BOUND`` (a ShapeError where the graph is wrong there)."""
        key = self._key({n: int(v) for n, v in sizes.items() if n in self.buckets})
        hit = self.size_checks.get(key)
        if hit is None:
            t0 = time.perf_counter()
            checks = verify_at(self.instance(self.bucket(dict(key))), dict(key),
                               self.options.get("seed", 0), self.options.get("target", "h100"))
            hit = self.size_checks[key] = SizeCheck(
                key, min(1.0, sum(v.bound for _, v in checks)),
                sum(v.tests_run for _, v in checks), time.perf_counter() - t0)
        return hit

    # -- running --------------------------------------------------------------------------------
    def _serving(self, arrays: Mapping[str, Any]) -> tuple[dict, dict, Any]:
        """What serves a call on ``arrays``: the sizes bound from their shapes, the bucket that
        holds them and its answer (built if new), the sizes verified first if they are new
        (unless ``verify_sizes`` is off)."""
        sizes = self.program.bind({n: tuple(a.shape) for n, a in arrays.items()})
        bucket = self.bucket(sizes)
        inst = self.instance(bucket)
        if self.verify_sizes:
            self.check_sizes(sizes)
        return sizes, bucket, inst

    def run_numpy(self, inputs: Mapping[str, Any], precision: str = "gpu") -> dict[str, Any]:
        """Run on the CPU interpreter at the inputs' sizes (module docstring); a binding of the
        sizes met for the first time is verified first (:meth:`check_sizes`) unless
        ``verify_sizes`` is off."""
        arrays = self.program.check_inputs(inputs)
        sizes, bucket, inst = self._serving(arrays)
        out = inst.graph.run(pad_inputs(self.program, arrays, bucket), precision=precision,
                             sizes=sizes)
        return {n: np.asarray(v) for n, v in cut_outputs(self.program, out, sizes).items()}

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Run on the GPU (compiled CUDA through CuPy; inputs CuPy arrays or DLPack tensors):
        sizes bound from the inputs, checked once (``check_sizes``), the bucket's graph --
        compiled once per bucket, the valid sizes passed to its kernels, which size their grids
        and loops from them (codegen_cuda/extents.py) -- run on the inputs
        zero-filled on the device, the outputs cut back (views of the bucket's outputs)."""
        from ..codegen_cuda import CompiledGraph, emit_cuda
        from ..codegen_cuda.extents import PaddedExtents
        from ..codegen_cuda.runtime import _cupy, _to_cupy
        cp = _cupy()
        missing = [t.name for t in self.program.inputs if t.name not in inputs]
        if missing:
            raise ShapeError(f"FamilyProgram {self.program.name!r}: missing input(s) {missing}")
        arrays = {t.name: _to_cupy(inputs[t.name], cp) for t in self.program.inputs}
        sizes, bucket, inst = self._serving(arrays)
        key = self._key(bucket)
        compiled = self._compiled.get(key)
        if compiled is None:
            # grids and trip counts from the valid sizes: work wholly past them left out
            src = emit_cuda(inst.annotated, inst.target,
                            extents=PaddedExtents.of_program(self.program))
            compiled = self._compiled[key] = CompiledGraph(src, inst.target)
        out = compiled(pad_inputs(self.program, arrays, bucket, xp=cp), sizes=sizes)
        return cut_outputs(self.program, out, sizes)

    # -- reports --------------------------------------------------------------------------------
    @property
    def num_kernels(self) -> int:
        return self.answer.num_kernels

    @property
    def naive_num_kernels(self) -> int:
        return self.answer.naive_num_kernels

    @property
    def estimated_time_us(self) -> float:
        """The representative bucket's predicted time."""
        return self.answer.estimated_time_us

    def estimated_time_at(self, sizes: Mapping[str, int]) -> float:
        """The predicted time of a call at the valid ``sizes``: the bucket's graph (built if
        new) with each kernel's grid and loop as launched there (codegen_cuda/extents.py: blocks
        and iterations wholly past the valid sizes left out where the rule allows; other
        kernels, pre-defined ones included, at the bucket's size) -- what the GPU path runs.
        A learned cost model prices the bucket's graph whole (``cost_model.predict_launched``)."""
        from ..codegen_cuda.extents import PaddedExtents, launch_work
        from ..cost_model import predict_launched
        missing = sorted(set(self.buckets) - set(sizes))
        if missing:
            raise ShapeError(f"FamilyProgram {self.program.name!r}: estimated_time_at needs a "
                             f"size for dim(s) {missing}, got {dict(sizes)}")
        sizes = {n: int(sizes[n]) for n in self.buckets}
        for n, v in sizes.items():
            self.program.dims[n].check(v, f"FamilyProgram {self.program.name!r}")
        inst = self.instance(self.bucket(sizes))
        work = launch_work(inst.graph, PaddedExtents.of_program(self.program), sizes)
        return predict_launched(inst.model, inst.annotated, inst.target, work)

    @property
    def naive_estimated_time_us(self) -> float:
        """The representative bucket's predicted time with one kernel per operator."""
        return self.answer.naive_estimated_time_us

    @property
    def verification(self) -> list:
        return self.answer.verification

    @property
    def representatives(self) -> list[dict[str, int]]:
        """The searched buckets."""
        return [dict(k) for k in self.answers]

    @property
    def searches(self) -> int:
        """Region structures searched, over every bucket built so far."""
        return sum(p.searched for inst in self.instances.values() for p in inst.parts)

    def summary(self) -> str:
        dims = ", ".join(f"{d.name} in {d.lo} .. {d.hi}" for d in self.program.dims.values())
        rep = "; ".join(", ".join(f"{n}={v}" for n, v in r.items())
                        for r in self.representatives)
        lines = [f"mirage_py superopt: {self.program.name} (symbolic: {dims})",
                 f"  {len(self.answers)} search(es), at the bucket(s) {rep} "
                 f"({self.search_seconds:.2f} s); "
                 f"buckets: " + "; ".join(f"{n}: {', '.join(map(str, b))}"
                                          for n, b in self.buckets.items()),
                 f"  family check: {len({tuple(sorted(b.items())) for b, _ in self.family_checks})}"
                 f" edge binding(s) of the valid sizes, all equivalent"]
        if self.size_checks:
            worst = max(c.bound for c in self.size_checks.values())
            spent = sum(c.seconds for c in self.size_checks.values())
            lines.append(f"  sizes run: {len(self.size_checks)}, each verified on first use "
                         f"(bound <= {worst:.1e}; {spent:.2f} s in all)")
        for key, inst in self.instances.items():
            b = ", ".join(f"{n}={v}" for n, v in key)
            extra = f", built in {self.instance_seconds[key]:.2f} s" \
                if key in self.instance_seconds else " (searched)"
            lines.append(f"  bucket {b}: kernels {inst.naive_num_kernels} naive -> "
                         f"{inst.num_kernels}, {inst.estimated_time_us:.1f} us{extra}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"FamilyProgram({self.program.name!r}, dims {sorted(self.program.dims)}, "
                f"{len(self.instances)} bucket(s) built)")


def _outline(program: Program) -> list:
    """A padded program's operators without their sizes: equal outlines replay each other."""
    return [(t.op, tuple(k for k, _ in t.attrs)) for t in program.nodes()]


def _representatives(program: Program, given: Any,
                     by_dim: dict[str, tuple[int, ...]]) -> list[dict[str, int]]:
    """The buckets to search: those holding ``given`` (dim name -> size, or a list of them;
    a dim not named: ``REPRESENTATIVE`` clamped to its range), each once."""
    out: list[dict[str, int]] = []
    for one in (given if isinstance(given, (list, tuple)) else [given]):
        if one is not None and not isinstance(one, Mapping):
            raise OptionError(f"superopt: representative must map dim names to sizes (or be a "
                              f"list of such), got {one!r}")
        unknown = set(one or {}) - set(program.dims)
        if unknown:
            raise OptionError(f"superopt: representative names dims {sorted(unknown)} that "
                              f"program {program.name!r} does not have")
        rep = {}
        for n, d in program.dims.items():
            size = int(one[n]) if one and n in one else min(d.hi, max(d.lo, REPRESENTATIVE))
            d.check(size, f"superopt: representative of {program.name!r}")
            rep[n] = bucket_of(size, by_dim[n], n)
        if rep not in out:
            out.append(rep)
    return out


def family_bindings(dims: Mapping[str, Dim], bucket: Mapping[str, int]) -> list[dict[str, int]]:
    """The valid sizes a bucket's graph is checked at besides its full size: for each dim in
    turn, a partial last tile (bucket - 1), a bit over half (bucket / 2 + 1) and its smallest
    size, the other dims full -- where padding begins inside a tile, after whole tiles, and
    almost everywhere."""
    full = dict(bucket)
    out: list[dict[str, int]] = []
    for n, d in dims.items():
        p = bucket[n]
        for v in (p - 1, p // 2 + 1, d.lo):
            b = {**full, n: v}
            if d.lo <= v <= min(d.hi, p) and v != p and b not in out:
                out.append(b)
    return out


@dataclass(frozen=True)
class SizeCheck:
    """One binding of the valid sizes verified for the bucket graph that serves it: the union
    bound of its region pieces (each verified to its share of ``DEFAULT_BOUND``)."""

    sizes: tuple  # ((dim name, size), ...)
    bound: float
    tests: int
    seconds: float


def verify_at(answer: Any, sizes: Mapping[str, int], seed: int, target: Any) -> list:
    """Every region piece of a bucket's answer verified for the valid sizes ``sizes``, each to
    its share of ``DEFAULT_BOUND`` so that their union bound is within it: ``[(sizes,
    VerifyResult), ...]``. A piece that is wrong there is a ShapeError naming the region and the
    sizes (docs/verifier.md, "Shape families")."""
    from ..verifier import Verifier
    from ..verifier.equivalence import DEFAULT_BOUND
    pieces = [pc.result for part in answer.parts for pc in part.pieces if pc.kind == "region"]
    share = DEFAULT_BOUND / max(1, len(pieces))
    checks = []
    for r in pieces:
        v = Verifier(r.program, seed=seed, target=target, sizes=sizes,
                     bound_target=share).check(r.graph)
        if not v.equivalent:
            raise ShapeError(f"superopt: the answer for region {r.program.name!r} is wrong for "
                             f"the valid sizes {dict(sizes)}: {v.reason or v.mismatch}")
        checks.append((dict(sizes), v))
    return checks


def _family_check(answer: Any, dims: Mapping[str, Dim], bucket: Mapping[str, int],
                  seed: int, target: Any) -> list:
    """The representative's answer verified at the bucket's edge-case bindings
    (:func:`family_bindings`)."""
    return [c for sizes in family_bindings(dims, bucket)
            for c in verify_at(answer, sizes, seed, target)]


def superopt_family(program: Program, options: dict[str, Any],
                    bucket_sizes: Mapping[str, Any] | None,
                    representative: Any, verify_sizes: bool = True) -> FamilyProgram:
    """``superopt`` of a symbolic program (module docstring); ``options`` are superopt's."""
    from . import superopt
    dims = program.dims
    unknown = set(bucket_sizes or {}) - set(dims)
    if unknown:
        raise OptionError(f"superopt: buckets for dims {sorted(unknown)} that program "
                          f"{program.name!r} does not have (its dims: {sorted(dims)})")
    by_dim = {n: buckets(d, (bucket_sizes or {}).get(n)) for n, d in dims.items()}
    reps = _representatives(program, representative, by_dim)
    for n, sizes in by_dim.items():
        # a bucket of size 1 is another structure (its no-ops dropped: a max over one element),
        # which only a search answers; unless a representative is there or the caller chose
        # the buckets, size 1 runs padded in the next bucket, replayed like the others
        if (bucket_sizes or {}).get(n) is None and len(sizes) > 1 and sizes[0] == 1 and \
                all(r[n] > 1 for r in reps):
            by_dim[n] = sizes[1:]
    t0 = time.perf_counter()
    answers, checks = {}, []
    for rep in reps:
        answer = answers[tuple(sorted(rep.items()))] = superopt(padded(program, rep),
                                                                sizes=dict(rep), **options)
        checks += _family_check(answer, dims, rep, options.get("seed", 0),
                                options.get("target", "h100"))
    return FamilyProgram(program, by_dim, answers, options, checks,
                         time.perf_counter() - t0, verify_sizes)


__all__ = ["FamilyProgram", "SizeCheck", "superopt_family", "family_bindings", "verify_at",
           "REPRESENTATIVE"]
