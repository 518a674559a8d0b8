"""Programs built by chaining the benchmark patterns, with sizes drawn at random: the composition
bank the region layer is tested on (tests/test_regions.py) and the whole-program benchmark
(benchmarks/whole_programs.py) draws from.

Every composition comes with

* ``program``: the chained program (float16 storage, as the benchmarks);
* ``reference(inputs)``: the same computation written directly in NumPy, float64 -- an
  evaluation that shares no code with mirage_py;
* ``pieces``: each pattern of the chain as a program of its own (same shapes), so a test can
  superoptimise the pieces alone and compare their summed predicted time with the composition's;
* ``inputs(seed)``: inputs at realistic scales (weights 1/sqrt(fan-in), logits of order 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

import mirage_py as mp

EPS_RMS = 1e-6
EPS_LN = 1e-5


# ---- the patterns, as Program operators and as NumPy -------------------------------------

def rms(x):
    return mp.rms_norm(x, eps=EPS_RMS)


def np_rms(x):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS_RMS)


def layernorm(x):
    m = mp.mean(x, axis=-1, keepdims=True)
    c = x - m
    return c / mp.sqrt(mp.mean(c * c, axis=-1, keepdims=True) + EPS_LN)


def np_layernorm(x):
    c = x - x.mean(axis=-1, keepdims=True)
    return c / np.sqrt((c * c).mean(axis=-1, keepdims=True) + EPS_LN)


def np_silu(x):
    return x / (1.0 + np.exp(-x))


def attention(q, k, v):
    e = mp.exp(q @ k)
    return (e / mp.sum(e, axis=-1, keepdims=True)) @ v


def np_attention(q, k, v):
    e = np.exp(q @ k)
    return (e / e.sum(axis=-1, keepdims=True)) @ v


@dataclass
class Composition:
    name: str
    program: mp.Program
    reference: Callable[[dict], dict]
    pieces: list
    scales: dict  # input name -> standard deviation of its random values

    def inputs(self, seed: int = 0) -> dict:
        rng = np.random.default_rng(seed)
        return {t.name: self.scales.get(t.name, 1.0) * rng.standard_normal(t.shape)
                for t in self.program.inputs}


class _Builder:
    """Declares inputs once for the composition and once per piece."""

    def __init__(self, name: str):
        self.p = mp.Program(name)
        self.scales: dict = {}
        self.shapes: dict = {}

    def input(self, name: str, shape: tuple, scale: float = 1.0):
        self.scales[name] = scale
        self.shapes[name] = shape
        return self.p.input(name, shape)

    def piece(self, name: str, inputs: dict, fn) -> mp.Program:
        """A program of its own computing ``fn`` on inputs of the given shapes."""
        q = mp.Program(name)
        ts = {n: q.input(n, s) for n, s in inputs.items()}
        q.output(fn(**ts), name="out")
        return q


def mlp_block(rng, b=None, d=None, f=None) -> Composition:
    """norm -> gated MLP -> down projection -> residual: ``x + (silu(n@Wg) * (n@Wu)) @ Wd``."""
    b = b or int(rng.choice([1, 4, 8]))
    d = d or int(rng.choice([128, 256]))
    f = f or int(rng.choice([256, 384, 512]))
    B = _Builder(f"mlp_block_{b}x{d}x{f}")
    x = B.input("x", (b, d))
    wg = B.input("Wg", (d, f), d ** -0.5)
    wu = B.input("Wu", (d, f), d ** -0.5)
    wd = B.input("Wd", (f, d), f ** -0.5)
    n = rms(x)
    B.p.output(x + (mp.silu(n @ wg) * (n @ wu)) @ wd, name="y")

    def ref(i):
        nn = np_rms(i["x"])
        return {"y": i["x"] + (np_silu(nn @ i["Wg"]) * (nn @ i["Wu"])) @ i["Wd"]}
    pieces = [B.piece("gated", {"x": (b, d), "Wg": (d, f), "Wu": (d, f)},
                      lambda x, Wg, Wu: mp.silu(rms(x) @ Wg) * (rms(x) @ Wu)),
              B.piece("down_residual", {"a": (b, f), "Wd": (f, d), "x": (b, d)},
                      lambda a, Wd, x: x + a @ Wd)]
    return Composition(B.p.name, B.p, ref, pieces, B.scales)


def layernorm_lora(rng, b=None, d=None, n=None, r=16) -> Composition:
    """LayerNorm -> linear -> LoRA projection + residual:
    ``h = LN(x) @ W1``, ``y = h + h @ W2 + (h @ A) @ B``."""
    b = b or int(rng.choice([2, 8]))
    d = d or int(rng.choice([128, 256]))
    n = n or int(rng.choice([128, 256]))
    B = _Builder(f"ln_lora_{b}x{d}x{n}")
    x = B.input("x", (b, d))
    w1 = B.input("W1", (d, n), d ** -0.5)
    w2 = B.input("W2", (n, n), n ** -0.5)
    a = B.input("A", (n, r), n ** -0.5)
    bb = B.input("B", (r, n), r ** -0.5)
    h = layernorm(x) @ w1
    B.p.output(h + h @ w2 + (h @ a) @ bb, name="y")

    def ref(i):
        hh = np_layernorm(i["x"]) @ i["W1"]
        return {"y": hh + hh @ i["W2"] + (hh @ i["A"]) @ i["B"]}
    pieces = [B.piece("ln_linear", {"x": (b, d), "W1": (d, n)},
                      lambda x, W1: layernorm(x) @ W1),
              B.piece("lora_residual", {"h": (b, n), "W2": (n, n), "A": (n, r), "B": (r, n)},
                      lambda h, W2, A, B: h + h @ W2 + (h @ A) @ B)]
    return Composition(B.p.name, B.p, ref, pieces, B.scales)


def attention_block(rng, b=None, d=None, heads=None, kv=None, hd=64) -> Composition:
    """norm -> per-head q projection -> attention over a KV cache -> output projection summed
    over heads -> residual."""
    b = b or int(rng.choice([1, 2]))
    heads = heads or int(rng.choice([2, 4]))
    d = d or heads * hd
    kv = kv or int(rng.choice([128, 256]))
    B = _Builder(f"attention_block_{b}x{d}h{heads}kv{kv}")
    x = B.input("x", (b, d))
    wq = B.input("Wq", (heads, d, hd), d ** -0.5 * hd ** -0.25)
    k = B.input("K", (heads, hd, kv), hd ** -0.25)
    v = B.input("V", (heads, kv, hd))
    wo = B.input("Wo", (heads, hd, d), (heads * hd) ** -0.5)
    q = rms(x) @ wq
    o = attention(q, k, v)
    B.p.output(mp.sum(o @ wo, axis=0) + x, name="y")

    def ref(i):
        qq = np_rms(i["x"]) @ i["Wq"]
        oo = np_attention(qq, i["K"], i["V"])
        return {"y": (oo @ i["Wo"]).sum(axis=0) + i["x"]}
    pieces = [B.piece("q_proj", {"x": (b, d), "Wq": (heads, d, hd)},
                      lambda x, Wq: rms(x) @ Wq),
              B.piece("attention", {"q": (heads, b, hd), "K": (heads, hd, kv),
                                    "V": (heads, kv, hd)}, lambda q, K, V: attention(q, K, V)),
              B.piece("o_proj_residual", {"o": (heads, b, hd), "Wo": (heads, hd, d),
                                          "x": (b, d)},
                      lambda o, Wo, x: mp.sum(o @ Wo, axis=0) + x)]
    return Composition(B.p.name, B.p, ref, pieces, B.scales)


def residual_norm_linears(rng, b=None, d=None, n=None) -> Composition:
    """norm -> linear -> residual -> norm -> linear (a norm after a residual add)."""
    b = b or int(rng.choice([1, 8]))
    d = d or int(rng.choice([128, 256]))
    B = _Builder(f"residual_norm_linears_{b}x{d}")
    x = B.input("x", (b, d))
    w1 = B.input("W1", (d, d), d ** -0.5)
    w2 = B.input("W2", (d, d), d ** -0.5)
    h = x + rms(x) @ w1
    B.p.output(rms(h) @ w2, name="y")

    def ref(i):
        hh = i["x"] + np_rms(i["x"]) @ i["W1"]
        return {"y": np_rms(hh) @ i["W2"]}
    pieces = [B.piece("norm_linear_residual", {"x": (b, d), "W1": (d, d)},
                      lambda x, W1: x + rms(x) @ W1),
              B.piece("norm_linear", {"h": (b, d), "W2": (d, d)},
                      lambda h, W2: rms(h) @ W2)]
    return Composition(B.p.name, B.p, ref, pieces, B.scales)


def decoder_block(b: int = 1, kv: int = 1024, d: int = 512, heads: int = 8, hd: int = 64,
                  f: int = 1408, layers: int = 1, name: str | None = None) -> Composition:
    """The decode-step decoder block of the whole-programs issue (``layers`` of them stacked):
    ``rms_norm(x)*g1`` -> q projection (heads x hd) -> attention over a KV cache of ``kv`` ->
    output projection summed over heads -> residual -> ``rms_norm*g2`` -> SwiGLU MLP
    (d -> f -> d) -> residual. ``b`` tokens: 1 for decode, 8 for a batch of 8, 512 for a
    prefill chunk attending to the cache."""
    B = _Builder(name or f"decoder_b{b}" + (f"_x{layers}" if layers > 1 else ""))
    x = B.input("X", (b, d))
    h = x
    weights = []
    for li in range(layers):
        s = f"{li}" if layers > 1 else ""
        g1 = B.input(f"g1{s}", (d,))
        wq = B.input(f"Wq{s}", (heads, d, hd), d ** -0.5)
        k = B.input(f"K{s}", (heads, hd, kv), hd ** -0.25)
        v = B.input(f"V{s}", (heads, kv, hd))
        wo = B.input(f"Wo{s}", (heads, hd, d), (heads * hd) ** -0.5)
        g2 = B.input(f"g2{s}", (d,))
        wg = B.input(f"Wg{s}", (d, f), d ** -0.5)
        wu = B.input(f"Wu{s}", (d, f), d ** -0.5)
        wd = B.input(f"Wd{s}", (f, d), f ** -0.5)
        weights.append(s)
        q = (mp.rms_norm(h, g1) @ wq) * (hd ** -0.5 * hd ** 0.25)
        o = attention(q, k, v)
        h = mp.sum(o @ wo, axis=0) + h
        n = mp.rms_norm(h, g2)
        h = (mp.silu(n @ wg) * (n @ wu)) @ wd + h
    B.p.output(h, name="Y")

    def ref(i):
        hh = i["X"]
        for s in weights:
            qq = (np_rms(hh) * i[f"g1{s}"] @ i[f"Wq{s}"]) * (hd ** -0.5 * hd ** 0.25)
            oo = np_attention(qq, i[f"K{s}"], i[f"V{s}"])
            hh = (oo @ i[f"Wo{s}"]).sum(axis=0) + hh
            nn = np_rms(hh) * i[f"g2{s}"]
            hh = (np_silu(nn @ i[f"Wg{s}"]) * (nn @ i[f"Wu{s}"])) @ i[f"Wd{s}"] + hh
        return {"Y": hh}
    return Composition(B.p.name, B.p, ref, [], B.scales)


BANK = (mlp_block, layernorm_lora, attention_block, residual_norm_linears)


def bank(seed: int = 0, n: int | None = None) -> list[Composition]:
    """The composition bank: every builder with sizes drawn from ``seed`` (``n`` per builder,
    default one)."""
    rng = np.random.default_rng(seed)
    return [f(rng) for _ in range(n or 1) for f in BANK]
