"""``verify(program, ugraph)``: random testing over finite fields with a false-acceptance bound.

Each test draws a field (a safe prime ``p = 2q + 1`` from :data:`~.field.SAFE_PRIMES`, a random
generator ``g`` of the order-q subgroup, fresh uninterpreted functions) and fresh uniformly random
inputs, evaluates the program (``Program.evaluate``) and the μGraph (``ugraph.run``) on the same
field backend and compares every output element exactly.

The per-test bound comes from degrees (:mod:`.degree`): both graphs are run once on degree
records, giving for each output the degree ``d`` of the polynomial that must vanish for a
non-equivalent pair to agree (numerator of ``ref - cand`` plus every denominator that a zero
divisor could hit), and ``d_E``, the largest exp-argument degree. Schwartz--Zippel then gives

    eps = (d + d_E) / q_min     if either graph uses exp
    eps = d / p_min             otherwise

per test, and ``eps ** n`` after n independent passing tests. By default n is the smallest with
``eps ** n <= 1e-9``. The derivation and its assumptions (the exp model especially) are in
docs/verifier.md.

A test where the graphs disagree but some division hit a zero divisor is *inconclusive* (the
disagreement may come from ``0^-1 = 0``) and is replaced by a fresh test; passing tests count
whether or not a zero divisor occurred (the bound already charges for denominators vanishing).
"""

from __future__ import annotations

import math
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ..errors import MirageError
from ..lax.ops import OPS
from ..lax.program import Program
from ..ugraph.bind import bind
from ..ugraph.graph import KernelGraph
from ..ugraph.interp import run
from ..ugraph.validate import validate
from .degree import DegreeBackend, Shaped, pair_degree
from .errors import (InterfaceMismatchError, NestedExpError, UnverifiableOperatorError,
                     VerifierArgumentError, VerifierMemoryError)
from .field import (SAFE_PRIMES, FieldBackend, FieldParams, FieldValue, random_indices,
                    random_input)
from .memory import require_memory

DEFAULT_BOUND = 1e-9
_MODULI = tuple(SAFE_PRIMES) + tuple((p - 1) // 2 for p in SAFE_PRIMES)
MAX_TESTS = 64
#: the random inputs all verifiers of one process keep between candidates, together: a search
#: keeps one verifier per structure (superopt's ``Run.verifier``), and a per-verifier budget
#: let a layer's dozen structures hold a gigabyte each
CACHE_BYTES = 1 << 30


class _InputCache:
    """The process-wide budget of kept test inputs (:data:`CACHE_BYTES`), least recently used
    verifier evicted first: its tests' inputs are drawn again (the same seeds, the same
    values) when it next needs them; the program's outputs stay cached."""

    def __init__(self) -> None:
        self.kept: OrderedDict[int, tuple[weakref.ref, int]] = OrderedDict()

    def total(self) -> int:
        return sum(n for ref, n in self.kept.values() if ref() is not None)

    def touch(self, v: "Verifier") -> None:
        if id(v) in self.kept:
            self.kept.move_to_end(id(v))

    def admit(self, v: "Verifier", size: int, budget: int) -> bool:
        """Make room for ``size`` more bytes of ``v``'s (evicting other verifiers' inputs,
        oldest first); False when it cannot fit in ``budget`` even so."""
        if size > budget:
            return False
        for key in list(self.kept):
            ref, n = self.kept[key]
            other = ref()
            if other is None:
                del self.kept[key]
                continue
            if self.total() + size <= budget:
                break
            if other is not v:
                other._drop_inputs()
                del self.kept[key]
        if self.total() + size > budget:
            return False
        ref, n = self.kept.pop(id(v), (weakref.ref(v), 0))
        self.kept[id(v)] = (ref, n + size)
        return True

    def forget(self, v: "Verifier") -> None:
        self.kept.pop(id(v), None)


_INPUTS = _InputCache()


@dataclass
class Mismatch:
    """Where a candidate disagreed with the program in a conclusive test."""

    output: str
    index: tuple[int, ...]
    expected: int  # the program's value there, canonical residue mod p
    got: int  # the μGraph's value
    count: int  # elements that differ in this output
    size: int
    test: int
    p: int

    def __str__(self) -> str:
        return (f"output {self.output!r} differs at {self.index} (program {self.expected}, "
                f"μGraph {self.got} mod p={self.p}; {self.count} of {self.size} elements differ; "
                f"test {self.test})")


@dataclass
class VerifyResult:
    """Outcome of :func:`verify`.

    ``bound`` is an upper bound on the probability that a non-equivalent candidate passes every
    test that was run (``per_test_bound ** tests_passed``; 1.0 when no test passed or the
    per-test bound is vacuous); it is meaningful when ``equivalent`` is True. On rejection
    ``mismatch`` says which output and where, or ``reason`` why.
    """

    equivalent: bool
    bound: float
    tests_run: int
    seconds: float
    per_test_bound: float
    tests_needed: int
    degree: int
    exp_degree: int
    uses_exp: bool
    primes: list[int] = field(default_factory=list)
    inconclusive: int = 0
    zero_divisor_tests: int = 0
    mismatch: Mismatch | None = None
    reason: str = ""
    # long extents -> the shrunk extents the tests ran at (verification at shrunk sizes,
    # shrink.py); empty when the tests ran at full size
    shrunk: dict[int, int] = field(default_factory=dict)
    # why the shrunk check did not apply (full size was checked instead)
    full_size_why: str = ""

    def __bool__(self) -> bool:
        return self.equivalent

    @classmethod
    def refused(cls, reason: str) -> "VerifyResult":
        """A candidate not accepted because it could not be checked (``reason``), no test run:
        what a search records for a check that cannot fit in memory."""
        return cls(False, 1.0, 0, 0.0, 1.0, 0, 0, 0, False, reason=reason)

    def __str__(self) -> str:
        head = "equivalent" if self.equivalent else "NOT equivalent"
        s = (f"{head}: {self.tests_run} test(s) in {self.seconds:.3f}s, bound {self.bound:.3g} "
             f"(per test {self.per_test_bound:.3g}; degree {self.degree}"
             f"{f', exp-argument degree {self.exp_degree}' if self.uses_exp else ''})")
        if self.inconclusive:
            s += f"; {self.inconclusive} inconclusive test(s) replaced"
        if self.shrunk:
            s += ("; at shrunk sizes " +
                  ", ".join(f"{e}->{n}" for e, n in sorted(self.shrunk.items())))
        if self.mismatch is not None:
            s += f"\n  {self.mismatch}"
        elif self.reason:
            s += f"\n  {self.reason}"
        return s


def check_interface(program: Program, graph: KernelGraph) -> None:
    """Raise :class:`InterfaceMismatchError` unless inputs and outputs agree in names and shapes."""
    if not isinstance(program, Program):
        raise InterfaceMismatchError(f"expected a Program, got {type(program).__name__}")
    if not isinstance(graph, KernelGraph):
        raise InterfaceMismatchError(f"expected a KernelGraph, got {type(graph).__name__}")
    p_in = {t.name: t.shape for t in program.inputs}
    g_in = {t.name: t.shape for t in graph.inputs}
    problems = []
    for n in p_in:
        if n not in g_in:
            problems.append(f"input {n!r} {p_in[n]} of the program is not an input of the μGraph")
        elif g_in[n] != p_in[n]:
            problems.append(f"input {n!r}: program {p_in[n]}, μGraph {g_in[n]}")
    for n in g_in:
        if n not in p_in:
            problems.append(f"input {n!r} {g_in[n]} of the μGraph is not an input of the program")
    p_out = {o.name: o.shape for o in program.outputs}
    tensors = graph.tensors()
    for n, shape in p_out.items():
        if n not in graph.outputs:
            problems.append(f"output {n!r} {shape} of the program is not an output of the μGraph")
        elif n not in tensors:
            problems.append(f"output {n!r} is never produced by the μGraph")
        elif tensors[n].shape != shape:
            problems.append(f"output {n!r}: program {shape}, μGraph {tensors[n].shape}")
    for n in graph.outputs:
        if n not in p_out:
            problems.append(f"output {n!r} of the μGraph is not an output of the program")
    if problems:
        raise InterfaceMismatchError(f"program {program.name!r} and μGraph {graph.name!r} do not "
                                     "match: " + "; ".join(problems))


def _check_program(program: Program) -> None:
    if not isinstance(program, Program):
        raise InterfaceMismatchError(f"expected a Program to verify against, got "
                                     f"{type(program).__name__}")
    nested = program.nested_exp()
    if nested:
        raise NestedExpError(f"program {program.name!r} nests exp inside exp "
                             f"({len(nested)} node(s)); the field verifier needs the Lax fragment")
    if not program.verifiable:
        bad = sorted({t.op for t in program.nodes()
                      if not (OPS[t.op].is_lax or OPS[t.op].elementwise)})
        raise UnverifiableOperatorError(f"program {program.name!r} uses operators outside the "
                                       f"verifiable fragment: {bad}")


def needed_tests(eps: float, target: float = DEFAULT_BOUND) -> int:
    """Smallest n with ``eps ** n <= target`` (MAX_TESTS when eps is vacuous)."""
    if eps <= 0:
        return 1
    if eps >= 1:
        return MAX_TESTS
    return max(1, math.ceil(math.log(target) / math.log(eps) - 1e-12))


class Verifier:
    """Verifies candidates against one program, caching what does not depend on the candidate
    (the program's degrees, and per test the program's outputs and -- within ``cache_bytes``,
    shared by every verifier of the process (:data:`CACHE_BYTES`), least recently used evicted
    first -- the random inputs, plus memoised kernels of earlier candidates). :func:`verify`
    builds one per call; a search that checks many candidates of the same program keeps one."""

    def __init__(self, program: Program, *, seed: int = 0, target: Any = "h100",
                 bound_target: float = DEFAULT_BOUND, cache_bytes: int | None = None,
                 sizes: Mapping[str, int] | None = None, shrink: bool = True):
        _check_program(program)
        # a padded program's masks name its valid sizes: verify it for the binding ``sizes``
        self.sizes = dict(sizes or {})
        if program.params:
            missing = sorted(set(program.params) - set(self.sizes))
            if missing:
                raise VerifierArgumentError(f"verify: program {program.name!r} needs the size of "
                                            f"{', '.join(missing)} (sizes=...)")
            program = program.at(self.sizes)
        self.program = program
        self.index_bounds = program.index_bounds()
        self.seed = int(seed)
        self.target = target
        self.bound_target = bound_target
        self.cache_bytes = CACHE_BYTES if cache_bytes is None else int(cache_bytes)
        deg = DegreeBackend(_MODULI)
        self.ref_degrees = program.evaluate({t.name: Shaped(t.shape) for t in program.inputs},
                                            backend=deg)
        self.ref_exp_arg = deg.max_exp_arg
        self.ref_exp = deg.exp_count > 0
        self.ref_uf_arg = deg.max_uf_arg
        # verification at shrunk sizes (shrink.py): one verifier per size map
        self.shrink = shrink
        self._shrunk: dict[tuple, Verifier] = {}
        self._tests: dict[int, tuple[FieldParams, dict[str, FieldValue] | None,
                                     dict[str, np.ndarray], bool, dict]] = {}
        self._cached_bytes = 0

    # -- per-test data --------------------------------------------------------------------------
    def params(self, test: int) -> FieldParams:
        return FieldParams(SAFE_PRIMES[(self.seed + test) % len(SAFE_PRIMES)], self.seed, test)

    def inputs(self, params: FieldParams, test: int) -> dict[str, FieldValue | np.ndarray]:
        """Fresh random field values per input; an index input (token ids) is known data,
        valid indices drawn per test (``random_indices``), as masks are known 0/1 data."""
        return {t.name: (random_indices(t.name, t.shape, self.index_bounds[t.name], self.seed,
                                        test)
                         if t.name in self.index_bounds else
                         random_input(params, t.name, t.shape, self.seed, test))
                for t in self.program.inputs}

    def _reference(self, test: int) -> tuple[FieldParams, dict[str, FieldValue],
                                             dict[str, np.ndarray], bool, dict | None]:
        """Field, inputs, canonical program outputs, whether a zero divisor reached them, and
        the kernel memo of this test (None when the inputs are too big to keep)."""
        hit = self._tests.get(test)
        _INPUTS.touch(self)
        if hit is not None:
            params, inputs, ref, zero, memo = hit
            if inputs is None:
                return params, self.inputs(params, test), ref, zero, None
            return params, inputs, ref, zero, memo
        params = self.params(test)
        inputs = self.inputs(params, test)
        be = FieldBackend(params)
        out = self.program.evaluate(inputs, backend=be)
        ref = {n: be.canonical(v) for n, v in out.items()}
        zero = any(v.zero for v in out.values())
        size = sum(v.nbytes if isinstance(v, np.ndarray) else
                   v.p.nbytes + (v.q.get()[0].nbytes if v.q is not None and v.q.forced else 0)
                   for v in inputs.values())
        keep = _INPUTS.admit(self, size, self.cache_bytes)
        if keep:
            self._cached_bytes += size
        self._tests[test] = (params, inputs if keep else None, ref, zero, {} if keep else None)
        return params, inputs, ref, zero, self._tests[test][4]

    def _drop_inputs(self) -> None:
        """Let the kept inputs and kernel memos go (the process budget needs the room)."""
        for test, (params, inputs, ref, zero, memo) in list(self._tests.items()):
            self._tests[test] = (params, None, ref, zero, None)
        self._cached_bytes = 0

    def __del__(self) -> None:
        _INPUTS.forget(self)

    def forget_kernels(self) -> None:
        """Drop the memoised kernel results (the program side stays cached)."""
        for entry in self._tests.values():
            if entry[4] is not None:
                entry[4].clear()

    # -- the check ------------------------------------------------------------------------------
    def _degrees(self, graph: KernelGraph) -> tuple[int, int, bool, int]:
        """The check's degree bounds for a bound, valid ``graph``: the difference's, the exp
        arguments' (0 without exp), whether exp is used, the function arguments'."""
        deg = DegreeBackend(_MODULI)
        cand = run(graph, {t.name: Shaped(t.shape) for t in graph.inputs}, target=self.target,
                   backend=deg)
        d = max(pair_degree(self.ref_degrees[n], cand[n]) for n in self.ref_degrees)
        uses_exp = self.ref_exp or deg.exp_count > 0
        # E1 - E2 for two exp arguments of degree <= a has a numerator of degree <= 2a
        d_exp = 2 * max(self.ref_exp_arg, deg.max_exp_arg) if uses_exp else 0
        return d, d_exp, uses_exp, max(self.ref_uf_arg, deg.max_uf_arg)

    def shrinks(self, graph: KernelGraph) -> bool:
        """Will :meth:`check` try ``graph`` at shrunk sizes (shrink.py)? Its degree bounds and
        the shrunk pair, without a test: milliseconds, where a full-size check of a model-size
        structure can take seconds. (The shrunk check still falls back to full size where the
        degree bound differs at the shrunk size.)"""
        return self.shrunk_sizes(graph) is not None

    def shrunk_sizes(self, graph: KernelGraph) -> dict[int, int] | None:
        """The extents :meth:`check` will shrink ``graph``'s check to (long extent -> shrunk
        extent, shrink.py), or None when it runs at full size (see :meth:`shrinks`)."""
        if not self.shrink:
            return None
        from .shrink import shrink
        graph = bind(graph, self.sizes)
        try:
            check_interface(self.program, graph)
            validate(graph, self.target)
            d, d_exp, _, d_uf = self._degrees(graph)
        except MirageError:
            return None
        got = shrink(self.program, graph, max(d, d_exp, d_uf), self.target)
        return dict(got.sizes) if got else None

    def check(self, graph: KernelGraph, tests: int | None = None) -> VerifyResult:
        """Verify ``graph`` against the program (``tests`` random tests; by default as many
        as the bound target needs). A check that cannot fit in memory raises
        :class:`VerifierMemoryError` -- refused before it starts where the estimate says so
        (memory.py), or when an allocation fails during it (an estimate is not a promise):
        never a bare NumPy error, never a verdict. superopt rejects that candidate and goes on
        (``superopt.local.checked``)."""
        start = time.perf_counter()
        try:
            return self._check(graph, tests, start)
        except VerifierMemoryError:
            raise
        except MemoryError as e:
            raise VerifierMemoryError(f"verify: checking {self.program.name!r} ran out of memory "
                                      f"({e})") from e

    def _check(self, graph: KernelGraph, tests: int | None, start: float) -> VerifyResult:
        graph = bind(graph, self.sizes)
        check_interface(self.program, graph)
        validate(graph, self.target)
        d, d_exp, uses_exp, d_uf = self._degrees(graph)
        # smallest variable domain: the order-q subgroup (exp values), nonzero residues mod q
        # (function values' q parts), F_p; without exp only the p parts matter
        q_min = min((p - 1) // 2 for p in SAFE_PRIMES) - 1
        p_min = min(SAFE_PRIMES) - 1
        eps = (d + d_exp) / q_min if uses_exp else d / p_min
        needed = needed_tests(eps, self.bound_target)
        n_tests = needed if tests is None else int(tests)
        if n_tests < 1:
            raise VerifierArgumentError(f"verify: tests must be >= 1, got {tests!r}")
        why = ""
        if self.shrink:
            small, why = self._check_shrunk(graph, n_tests, d, d_exp, d_uf)
            if small is not None:
                small.seconds = time.perf_counter() - start
                return small
        require_memory(self.program, why)
        result = VerifyResult(False, 1.0, 0, 0.0, eps, needed, d, d_exp, uses_exp,
                              full_size_why=why)
        passed = 0
        test = 0
        max_inconclusive = max(8, n_tests)
        while passed < n_tests:
            params, inputs, ref, ref_zero, memo = self._reference(test)
            result.primes.append(params.p_int)
            be = FieldBackend(params)
            result.tests_run += 1
            try:
                out = run(graph, inputs, target=self.target, backend=be, memo=memo)
            except NestedExpError as e:
                result.reason = f"the μGraph is outside the Lax fragment: {e}"
                break
            zeros = ref_zero or any(out[n].zero for n in ref)
            bad = self._compare(ref, out, be, test, params)
            test += 1
            if zeros:
                result.zero_divisor_tests += 1
            if bad is None:
                passed += 1
                continue
            if zeros and result.inconclusive < max_inconclusive:
                result.inconclusive += 1  # may be 0^-1 = 0 at work: draw a fresh test
                continue
            result.mismatch = bad
            if zeros:
                result.reason = (f"{result.inconclusive + 1} tests differed after a "
                                 "division by zero; giving up")
            break
        else:
            result.equivalent = True
        if result.equivalent:
            result.bound = min(1.0, eps ** passed) if eps > 0 else 0.0
        result.seconds = time.perf_counter() - start
        return result

    def _check_shrunk(self, graph: KernelGraph, tests: int, d: int, d_exp: int,
                      d_uf: int) -> tuple[VerifyResult | None, str]:
        """The check at shrunk sizes (shrink.py; docs/verifier.md "Verification at shrunk
        sizes") when the argument applies and its degree bound is the full size's; else None and
        why not (then the full size is checked)."""
        from .shrink import shrink
        sh = shrink(self.program, graph, max(d, d_exp, d_uf), self.target)
        if not sh:
            return None, sh.why
        key = tuple(sorted(sh.sizes.items()))
        small = self._shrunk.get(key)
        if small is None:
            small = self._shrunk[key] = Verifier(
                sh.program, seed=self.seed, target=self.target, bound_target=self.bound_target,
                cache_bytes=self.cache_bytes, shrink=False)
        try:
            r = small.check(sh.graph, tests)
        except VerifierMemoryError as e:
            raise VerifierMemoryError(f"{e}; shrunk to {sh.sizes}, the other long extents "
                                      f"pinned (sliced, joined or reshaped)") from None
        if r.degree != d or r.exp_degree != d_exp or small.ref_uf_arg != self.ref_uf_arg:
            return None, (f"the degree bound depends on the extents (full size {d}/{d_exp}, "
                          f"shrunk {r.degree}/{r.exp_degree})")
        r.shrunk = dict(sh.sizes)
        return r, ""

    @staticmethod
    def _compare(ref: Mapping[str, np.ndarray], out: Mapping[str, FieldValue], be: FieldBackend,
                 test: int, params: FieldParams) -> Mismatch | None:
        for name, r in ref.items():
            got = be.canonical(out[name])
            if got.shape != r.shape:  # validated graphs cannot get here
                raise InterfaceMismatchError(f"output {name!r}: μGraph computed {got.shape}, "
                                             f"program {r.shape}")
            if not np.array_equal(got, r):
                diff = got != r
                where = tuple(int(i) for i in np.argwhere(diff)[0])
                return Mismatch(name, where, int(r[where]), int(got[where]),
                                int(np.count_nonzero(diff)), int(r.size), test, params.p_int)
        return None


def verify(program: Program, ugraph: KernelGraph, *, tests: int | None = None, seed: int = 0,
           target: Any = "h100", bound: float = DEFAULT_BOUND,
           sizes: Mapping[str, int] | None = None) -> VerifyResult:
    """Check that ``ugraph`` computes ``program`` by random testing over finite fields.

    ``tests``: how many passing tests to require (default: enough for ``result.bound <= bound``,
    1e-9). Inputs are fresh random field elements per test, seeded by ``seed``. Raises
    :class:`~.errors.InterfaceMismatchError` when inputs or outputs differ in names or shapes,
    :class:`~mirage_py.errors.ValidationError` for an invalid μGraph, and
    :class:`~.errors.NestedExpError` when the *program* nests exp (a candidate that does is
    simply rejected). ``sizes`` binds the dims a padded program's masks name (lax/family.py):
    the claim is for that binding.

    >>> import mirage_py as mp
    >>> p = mp.Program("scale")
    >>> X = p.input("X", (4, 8)); W = p.input("W", (8, 2))
    >>> p.output((X @ W) / 4.0, name="Y")
    >>> r = mp.verify(p, mp.ugraph.naive_lowering(p))
    >>> r.equivalent, r.bound <= 1e-9
    (True, True)
    """
    return Verifier(program, seed=seed, target=target, bound_target=bound,
                    sizes=sizes).check(ugraph, tests)


__all__ = ["verify", "Verifier", "VerifyResult", "Mismatch", "check_interface", "needed_tests"]
