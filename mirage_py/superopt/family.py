"""``superopt`` of a symbolic program: one search serves every size in its dims' ranges.

A symbolic program (``mp.dim``, lax/shapes.py) is a family of programs. Its answer:

1. **Buckets.** Each dim's range is cut into buckets (powers of two, or the sizes the caller
   gives, like vLLM's capture sizes). A bucket is one *padded* program (lax/family.py): every
   dim at the bucket's size, inputs zero-filled past the valid sizes, which only its masks name.
2. **One search**, at the representative bucket (the one holding ``representative``, default a
   middle size), with the valid sizes bound to the bucket's: the ordinary superopt (regions,
   search, tuning, verification, cover), whose answer is one graph for the whole bucket -- its
   masks keep the valid sizes as expressions, bound when it runs.
3. **The family check.** The representative's chosen pieces are verified again with the valid
   sizes bound to the bucket's edge cases (a partial last tile, half the bucket, the dim's
   smallest size): the same graph must be right wherever the valid part ends
   (docs/verifier.md, "Shape families").
4. **Other buckets without searching.** The first call at a new bucket builds its padded
   program and *replays* the representative's cover: the same pieces at the same places, each
   region's schedule replayed with every tile and loop chunk kept (only part counts change,
   ``generator.kernel_search.rescale_trace``), verified for that bucket; a region whose replay
   does not apply -- a bucket of size 1, where a dim has no label -- is searched there alone.
   Buckets are kept, so a sequence of calls searches once per structure.

``FamilyProgram.run_numpy`` binds the sizes from the inputs, picks the bucket, zero-fills the
inputs, runs the bucket's graph with the valid sizes bound and cuts the outputs back.
"""

from __future__ import annotations

import time
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
    """The answer for a symbolic program (module docstring): ``answer`` is the representative
    bucket's OptimizedProgram; ``instance(bucket)`` any other bucket's, replayed."""

    def __init__(self, program: Program, buckets_by_dim: dict[str, tuple[int, ...]],
                 representative: dict[str, int], answer: Any, options: dict[str, Any],
                 family_checks: list, search_seconds: float):
        self.program = program
        self.buckets = buckets_by_dim
        self.representative = representative
        self.answer = answer
        self.options = options
        self.family_checks = family_checks
        self.search_seconds = search_seconds
        self.instances: dict[tuple, Any] = {self._key(representative): answer}
        self.instance_seconds: dict[tuple, float] = {}

    # -- buckets --------------------------------------------------------------------------------
    @staticmethod
    def _key(bucket: Mapping[str, int]) -> tuple:
        return tuple(sorted(bucket.items()))

    def bucket(self, sizes: Mapping[str, int]) -> dict[str, int]:
        """The bucket that holds ``sizes`` (dim name -> size)."""
        return {n: bucket_of(int(sizes[n]), self.buckets[n], n) for n in self.buckets}

    def instance(self, bucket: Mapping[str, int]) -> Any:
        """The bucket's OptimizedProgram (a padded program), replayed from the representative
        the first time it is asked for."""
        key = self._key(bucket)
        if key not in self.instances:
            from . import superopt
            t0 = time.perf_counter()
            prog = padded(self.program, bucket)
            # sizes of 1 drop no-ops (a max over one element): another structure, searched
            same = _outline(prog) == _outline(self.answer.program)
            self.instances[key] = superopt(prog, sizes=dict(bucket),
                                           replay=self.answer if same else None, **self.options)
            self.instance_seconds[key] = time.perf_counter() - t0
        return self.instances[key]

    # -- running --------------------------------------------------------------------------------
    def run_numpy(self, inputs: Mapping[str, Any], precision: str = "gpu") -> dict[str, Any]:
        """Run on the CPU interpreter at the inputs' sizes (module docstring)."""
        arrays = self.program.check_inputs(inputs)
        sizes = self.program.bind({n: a.shape for n, a in arrays.items()})
        bucket = self.bucket(sizes)
        inst = self.instance(bucket)
        out = inst.graph.run(pad_inputs(self.program, arrays, bucket), precision=precision,
                             sizes=sizes)
        return {n: np.asarray(v) for n, v in cut_outputs(self.program, out, sizes).items()}

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

    @property
    def verification(self) -> list:
        return self.answer.verification

    @property
    def searches(self) -> int:
        """Region structures searched, over every bucket built so far."""
        return sum(p.searched for inst in self.instances.values() for p in inst.parts)

    def summary(self) -> str:
        dims = ", ".join(f"{d.name} in {d.lo} .. {d.hi}" for d in self.program.dims.values())
        rep = ", ".join(f"{n}={v}" for n, v in self.representative.items())
        lines = [f"mirage_py superopt: {self.program.name} (symbolic: {dims})",
                 f"  one search at the bucket {rep} ({self.search_seconds:.2f} s); "
                 f"buckets: " + "; ".join(f"{n}: {', '.join(map(str, b))}"
                                          for n, b in self.buckets.items()),
                 f"  family check: {len(self.family_checks)} binding(s) of the valid sizes, "
                 f"all equivalent"]
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


def _representative(program: Program, given: Mapping[str, int] | None,
                    by_dim: dict[str, tuple[int, ...]]) -> dict[str, int]:
    out = {}
    for n, d in program.dims.items():
        size = int(given[n]) if given and n in given else min(d.hi, max(d.lo, REPRESENTATIVE))
        d.check(size, f"superopt: representative of {program.name!r}")
        out[n] = bucket_of(size, by_dim[n], n)
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


def _family_check(answer: Any, dims: Mapping[str, Dim], bucket: Mapping[str, int],
                  seed: int, target: Any) -> list:
    """Every region piece of the representative's answer verified again at the edge-case
    bindings; a failure is a ShapeError naming the region and the sizes."""
    from ..verifier import Verifier
    checks = []
    for sizes in family_bindings(dims, bucket):
        for part in answer.parts:
            for piece in part.pieces:
                if piece.kind != "region":
                    continue
                r = piece.result
                v = Verifier(r.program, seed=seed, target=target, sizes=sizes).check(r.graph)
                if not v.equivalent:
                    raise ShapeError(f"superopt: the answer for region {r.program.name!r} at "
                                     f"the bucket {dict(bucket)} is wrong for the valid sizes "
                                     f"{sizes}: {v.reason or v.mismatch}")
                checks.append((sizes, v))
    return checks


def superopt_family(program: Program, options: dict[str, Any],
                    bucket_sizes: Mapping[str, Any] | None,
                    representative: Mapping[str, int] | None) -> FamilyProgram:
    """``superopt`` of a symbolic program (module docstring); ``options`` are superopt's."""
    from . import superopt
    dims = program.dims
    unknown = set(bucket_sizes or {}) - set(dims)
    if unknown:
        raise OptionError(f"superopt: buckets for dims {sorted(unknown)} that program "
                          f"{program.name!r} does not have (its dims: {sorted(dims)})")
    by_dim = {n: buckets(d, (bucket_sizes or {}).get(n)) for n, d in dims.items()}
    rep = _representative(program, representative, by_dim)
    t0 = time.perf_counter()
    answer = superopt(padded(program, rep), sizes=dict(rep), **options)
    checks = _family_check(answer, dims, rep, options.get("seed", 0),
                           options.get("target", "h100"))
    return FamilyProgram(program, by_dim, rep, answer, options, checks,
                         time.perf_counter() - t0)


__all__ = ["FamilyProgram", "superopt_family", "family_bindings", "REPRESENTATIVE"]
