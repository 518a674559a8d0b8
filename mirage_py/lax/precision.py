"""How values are computed and kept: a matmul's math, and the storage of intermediates.

**Matmul math.** How a matmul multiplies: the operand type the tensor cores take, or float32 on
CUDA cores.

A program's dtype says what its values are; the matmul *math* says what the hardware multiplies.
The rule is PyTorch's: a float16 or bfloat16 matmul runs on tensor cores with operands of its own
type and float32 accumulation; a float32 matmul keeps float32 accuracy unless the user allows
less, with PyTorch's names (``torch.set_float32_matmul_precision``):

=============  ==============================================================================
``highest``    float32 products (CUDA-core FMA) -- the default
``high``       TF32 tensor cores: operands rounded to 10 mantissa bits, float32 exponent range,
               float32 accumulation
``medium``     bfloat16 tensor cores: operands rounded to bfloat16, float32 accumulation
=============  ==============================================================================

A program records the choice per matmul node (``matmul(a, b, precision=...)``, only on float32
matmuls, absent for ``highest``); ``superopt(float32_matmul=...)`` sets it on the float32 matmuls
that do not say. μGraph matmuls (block and pre-defined kernel operators) carry the resulting
:class:`MatmulMath` as their ``math`` attribute; one without it (every 16-bit graph) follows the
operand rule of the tensor cores: bfloat16 where an operand is stored as bfloat16, else float16.

**Storage of intermediates.** A value one kernel writes and a later one reads is stored in the
program's dtype, except the *statistics* of a 16-bit program, which are kept in float32 as
PyTorch's norms and softmax compute them (:func:`storage_dtype`): sum reductions (they grow with
their count: softmax denominators, a norm's sum of squares), squares and higher powers (x^2
overflows float16 where x does not: an activation of 300 squares to 90000), and element-wise
values computed from statistics and constants only (``sum / n + eps``, its square root). Every
other value (matmul products, activations, probabilities) is what PyTorch keeps in 16 bits too.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from ..errors import OptionError
from .ops import OPS


class Float32Matmul(str, Enum):
    """What a float32 matmul may lose for speed (PyTorch's ``float32_matmul_precision``)."""

    HIGHEST = "highest"
    HIGH = "high"
    MEDIUM = "medium"

    @classmethod
    def parse(cls, value: Any, who: str = "float32_matmul") -> "Float32Matmul":
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value))
        except ValueError:
            raise OptionError(f"{who}={value!r}: expected one of "
                              f"{', '.join(repr(m.value) for m in cls)} (PyTorch's "
                              "float32_matmul_precision names)") from None


class MatmulMath(str, Enum):
    """How one matmul multiplies (its products are summed in float32 in every case)."""

    FP16 = "fp16"  # tensor cores, float16 operands
    BF16 = "bf16"  # tensor cores, bfloat16 operands
    TF32 = "tf32"  # tensor cores, TF32 operands (float32 range, 10 mantissa bits)
    FP32 = "fp32"  # CUDA cores, float32 operands (FMA)

    @property
    def tensor_cores(self) -> bool:
        return self is not MatmulMath.FP32

    @property
    def rank(self) -> int:
        """Accuracy order: a wider math never loses what a narrower one keeps."""
        return {"fp16": 0, "bf16": 0, "tf32": 1, "fp32": 2}[self.value]


def matmul_math(dtype: str, precision: Float32Matmul | str | None = None) -> MatmulMath:
    """The math of a program matmul of ``dtype`` (its result dtype: float32 as soon as one
    operand is float32) at ``precision`` (None: ``highest``)."""
    if dtype == "float16":
        return MatmulMath.FP16
    if dtype == "bfloat16":
        return MatmulMath.BF16
    p = Float32Matmul.parse(precision or Float32Matmul.HIGHEST, "precision")
    return {Float32Matmul.HIGHEST: MatmulMath.FP32, Float32Matmul.HIGH: MatmulMath.TF32,
            Float32Matmul.MEDIUM: MatmulMath.BF16}[p]


def operand_math(dtype_a: str, dtype_b: str) -> MatmulMath:
    """The tensor cores' rule for a μGraph matmul without a ``math`` attribute: bfloat16 where
    an operand is stored as bfloat16, else float16 (16-bit programs)."""
    return MatmulMath.BF16 if "bfloat16" in (dtype_a, dtype_b) else MatmulMath.FP16


def op_math(attrs: Any, dtype_a: str, dtype_b: str) -> MatmulMath:
    """The math of a μGraph matmul operator with ``attrs`` (a dict or attribute pairs) whose
    operand tiles or tensors are stored as ``dtype_a`` / ``dtype_b``."""
    m = dict(attrs).get("math")
    return MatmulMath(m) if m is not None else operand_math(dtype_a, dtype_b)


def math_attrs(math: MatmulMath | None) -> tuple[tuple[str, str], ...]:
    """The ``math`` attribute pair a μGraph matmul carries (none for 16-bit programs, whose
    operand rule needs no attribute)."""
    return () if math is None else (("math", math.value),)


def program_matmul_math(program: Any) -> MatmulMath | None:
    """The math every tile matmul of a fused kernel for ``program`` must keep, or None when the
    program has no float32 matmul (16-bit programs follow the operand rule).

    The generator cannot tell which program matmul a block matmul computes (regrouped products
    such as ``(x / r) @ W`` have no node of their own), so a program that mixes precisions gets
    one that keeps what each of them keeps: float32 if any matmul asks for it, else TF32 if one
    does or if float16 and bfloat16 products meet (TF32 has float16's mantissa and bfloat16's
    range), else bfloat16."""
    maths = {matmul_math(t.dtype, t.attr("precision")) for t in program.nodes()
             if t.op == "matmul"}
    if not any(t.op == "matmul" and t.dtype == "float32" for t in program.nodes()):
        return None
    if MatmulMath.FP32 in maths:
        return MatmulMath.FP32
    if MatmulMath.TF32 in maths or {MatmulMath.FP16, MatmulMath.BF16} <= maths:
        return MatmulMath.TF32
    return MatmulMath.BF16


def is_statistic(t: Any, memo: dict[str, bool] | None = None) -> bool:
    """Does program node ``t`` hold a statistic (module doc: sums, squares and powers above
    one, and element-wise values of statistics and constants)? An explicit ``cast`` never does:
    the program asked for that storage."""
    memo = {} if memo is None else memo
    hit = memo.get(t.digest)
    if hit is not None:
        return hit
    if t.op == "sum" or t.op == "square":
        out = True
    elif t.op == "pow":
        out = abs(float(t.attr("exponent"))) > 1 or is_statistic(t.inputs[0], memo)
    elif t.op == "mul" and len(t.inputs) == 2 and t.inputs[0].digest == t.inputs[1].digest:
        out = True  # x * x
    elif t.op != "cast" and OPS[t.op].elementwise:
        tensors = [i for i in t.inputs if i.op != "const"]
        out = bool(tensors) and all(is_statistic(i, memo) for i in tensors)
    else:
        out = False
    memo[t.digest] = out
    return out


def storage_dtype(t: Any, memo: dict[str, bool] | None = None) -> str:
    """The dtype an intermediate program value is stored in between kernels: float32 for the
    statistics of a 16-bit program (:func:`is_statistic`), else its own dtype."""
    if t.dtype == "float32" or not is_statistic(t, memo):
        return t.dtype
    return "float32"


# micro-tiles (rows, columns) a thread of the float32 FMA tile matmul (``tile_fma``, prelude.cuh)
# may own, most reuse first; the cost model and code generation split the work the same way
FMA_MICRO_TILES = ((8, 8), (8, 4), (4, 4), (4, 2), (2, 2), (2, 1), (1, 1))


def fma_micro_tile(batch: int, m: int, n: int, threads: int) -> tuple[int, int]:
    """The outputs (TM, TN) each thread of a float32 FMA tile matmul computes: the largest
    micro-tile that divides the (m, n) output and still gives every thread one (shared-memory
    loads per FMA fall as 1/TM + 1/TN); one output each when there are fewer than threads."""
    for tm, tn in FMA_MICRO_TILES:
        if m % tm == 0 and n % tn == 0 and batch * (m // tm) * (n // tn) >= threads:
            return tm, tn
    return 1, 1


__all__ = ["FMA_MICRO_TILES", "fma_micro_tile", "is_statistic", "storage_dtype", "Float32Matmul", "MatmulMath", "matmul_math", "operand_math", "op_math",
           "math_attrs", "program_matmul_math"]
