"""The nine reference benchmark programs (fp16), with the shapes of the Mirage paper.

``get_program(name, bs)`` builds one; ``NAMES`` lists them. bs is the batch size (1, 8 or 16 in
the published tables; any positive int works).
"""

from __future__ import annotations

import mirage_py as mp

NAMES = ("gqa", "qknorm_gqa", "mha", "mqa", "rmsnorm_linear", "lora", "gated_mlp", "ntrans",
         "exp_matmul")


def _attention(p: mp.Program, q, k, v, heads: int, rows: int, norm: bool = False,
               kv: "int | mp.Dim" = 4096) -> None:
    Q = p.input("Q", (heads, rows, 64), q)
    K = p.input("K", (heads, 64, kv), k)
    V = p.input("V", (heads, kv, 64), v)
    if norm:
        # rms_norm over the 64-wide head dim: Q rows are (.., rows, 64); K is stored (.., 64, seq)
        # with unit-RMS rows the logits have standard deviation sqrt(64) = 8 and exp overflows
        # float16 for any input; real attention applies the 1/sqrt(head_dim) softmax scale, so we
        # fold it into the normalised Q
        Q = mp.rms_norm(Q) * 0.125
        K = mp.transpose(mp.rms_norm(mp.transpose(K, (0, 2, 1))), (0, 2, 1))
    E = mp.exp(Q @ K)
    p.output(E / mp.sum(E, axis=-1, keepdims=True) @ V, name="O")


ATTENTION = ("gqa", "qknorm_gqa", "mha", "mqa")


def get_program(name: str, bs: int = 1, dtype: str = "float16",
                kv: "int | mp.Dim" = 4096) -> mp.Program:
    """Build benchmark ``name`` at batch size ``bs``; ``kv``: the KV length of the attention
    programs (``ATTENTION``; 4096 in the paper's tables), a size or a dim (``mp.dim``)."""
    if name not in NAMES:
        raise mp.ProgramError(f"unknown benchmark {name!r}; choose one of {', '.join(NAMES)}")
    if kv != 4096 and name not in ATTENTION:
        raise mp.ProgramError(f"benchmark {name!r} has no KV length; kv= is for "
                              f"{', '.join(ATTENTION)}")
    if not isinstance(bs, int) or isinstance(bs, bool) or bs < 1:
        raise mp.ProgramError(f"benchmark {name!r}: batch size must be a positive int, got {bs!r}")
    p = mp.Program(name)
    if name == "gqa":
        _attention(p, dtype, dtype, dtype, 2 * bs, 256, kv=kv)
    elif name == "qknorm_gqa":
        _attention(p, dtype, dtype, dtype, 2 * bs, 256, norm=True, kv=kv)
    elif name == "mha":
        _attention(p, dtype, dtype, dtype, 32 * bs, 16, kv=kv)
    elif name == "mqa":
        _attention(p, dtype, dtype, dtype, bs, 1024, kv=kv)
    elif name == "rmsnorm_linear":
        X = p.input("X", (2 * bs, 4096), dtype)
        W = p.input("W", (4096, 6144), dtype)
        p.output(mp.rms_norm(X) @ W, name="Y")
    elif name == "lora":
        X = p.input("X", (16, 256), dtype)
        W = p.input("W", (256, 4096), dtype)
        A = p.input("A", (256, 16), dtype)
        B = p.input("B", (16, 4096), dtype)
        p.output(X @ W + (X @ A) @ B, name="Y")
    elif name == "gated_mlp":
        X = p.input("X", (8 * bs, 4096), dtype)
        W1 = p.input("W1", (4096, 4096), dtype)
        W2 = p.input("W2", (4096, 4096), dtype)
        p.output(mp.silu(X @ W1) * (X @ W2), name="Y")
    elif name == "ntrans":
        H = p.input("H", (8 * bs, 4096), dtype)
        X = p.input("X", (8 * bs, 4096), dtype)
        alpha = p.input("alpha", (8 * bs, 4096), dtype)
        p.output(mp.rms_norm(X + alpha * (mp.rms_norm(H) - X)), name="Y")
    elif name == "exp_matmul":
        X = p.input("X", (8, 8, 4096), dtype)
        A = p.input("A", (8, 4096, 4096), dtype)
        B = p.input("B", (8, 4096, 4096), dtype)
        p.output(mp.exp(X @ A) @ B, name="Y")
    return p


def get_inputs(name: str, bs: int = 1, seed: int = 0) -> dict:
    """Realistic float64 inputs for benchmark ``name``: normal activations, weights scaled by
    1/sqrt(fan_in) (standard initialisation), and attention Q, K scaled so that the logits
    Q@K are of order 1 -- the regime the fp16 kernels are written for."""
    import numpy as np

    p = get_program(name, bs)
    rng = np.random.default_rng(seed)
    out = {}
    for t in p.inputs:
        x = rng.standard_normal(t.shape)
        if name in ("gqa", "qknorm_gqa", "mha", "mqa") and t.name in ("Q", "K"):
            x *= 64 ** -0.25
        elif name == "exp_matmul" and t.name in ("X", "A"):
            x *= t.shape[-1 if t.name == "X" else -2] ** -0.25
        elif t.name in ("W", "W1", "W2", "B") and name != "exp_matmul":
            x /= np.sqrt(t.shape[0])
        out[t.name] = x
    return out
