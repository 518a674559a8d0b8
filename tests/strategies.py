"""Hypothesis strategies shared by the tests: random tensor programs."""

from hypothesis import strategies as st

import mirage_py as mp

SHAPES = [(3, 3), (3,), (2, 3, 3), (1, 3), (3, 1), (2, 1, 3)]
UNARY = {"neg": lambda a: -a, "exp": mp.exp, "square": mp.square, "sqrt": mp.sqrt,
         "silu": mp.silu, "gelu": mp.gelu, "relu": mp.relu, "sigmoid": mp.sigmoid,
         "tanh": mp.tanh, "mish": mp.mish, "clamp": lambda a: mp.clamp(a, -1.0, 2.0),
         "leaky_relu": lambda a: mp.leaky_relu(a, 0.1), "pow": lambda a: a ** 3,
         "cast": lambda a: mp.cast(a, "float32"), "softmax": mp.softmax,
         "logsumexp": lambda a: mp.logsumexp(a, -1, keepdims=True),
         "rotate": lambda a: mp.concat([-a[..., 2:], a[..., :2]], -1),
         "causal": lambda a: mp.where(mp.causal_mask(*a.shape[-2:]), a, -9.0)}
BINARY = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
          "div": lambda a, b: a / b, "maximum": mp.maximum, "minimum": mp.minimum}
KINDS = list(UNARY) + ["exp", "exp"] + list(BINARY) + ["matmul", "matmul", "sum", "mean", "max",
                                                       "rms_norm", "reshape", "transpose"]


@st.composite
def random_programs(draw):
    """A random DAG over 1-3 inputs with up to 14 operators from the whole vocabulary.

    Names are drawn from t<k> on purpose: the partitioner names crossing values t<id> too."""
    p = mp.Program("rand")
    names = draw(st.lists(st.sampled_from(["t0", "t1", "t2", "t3", "x", "y"]), min_size=1,
                          max_size=3, unique=True))
    pool = [p.input(n, draw(st.sampled_from(SHAPES)),
                    draw(st.sampled_from(["float32", "float16", "bfloat16"]))) for n in names]
    for _ in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(KINDS))
        # prefer recent values so that chains (and nested exps) are common
        a = pool[-1 - draw(st.integers(0, len(pool) - 1))]
        try:
            if kind in UNARY:
                t = UNARY[kind](a)
            elif kind in BINARY:
                b = draw(st.one_of(st.sampled_from(pool), st.sampled_from([2.0, 0.5, -1.0, 3])))
                t = BINARY[kind](*((a, b) if draw(st.booleans()) else (b, a)))
            elif kind == "matmul":
                t = a @ draw(st.sampled_from(pool))
            elif kind in ("sum", "mean", "max"):
                axis = draw(st.none() | st.integers(-a.ndim, a.ndim - 1)) if a.ndim else None
                t = {"sum": mp.sum, "mean": mp.mean, "max": mp.max}[kind](
                    a, axis=axis, keepdims=draw(st.booleans()))
            elif kind == "rms_norm":
                t = mp.rms_norm(a, eps=draw(st.sampled_from([1e-6, 0.5])))
            elif kind == "reshape":
                t = mp.reshape(a, draw(st.sampled_from([(-1,), a.shape[::-1], (1,) + a.shape])))
            else:
                t = mp.transpose(a, draw(st.permutations(range(a.ndim))))
        except (mp.ShapeError, mp.DTypeError, IndexError, TypeError):
            continue  # operands that do not fit (a scalar has no rows to mask): draw another
        pool.append(t)
    candidates = pool[len(names):] or pool
    outs = draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=3))
    onames = draw(st.lists(st.sampled_from(["t4", "t5", "t6", "t7", "t8", "z"]),
                           min_size=len(outs), max_size=len(outs), unique=True))
    for t, n in zip(outs, onames):
        p.output(t, name=n)
    return p
