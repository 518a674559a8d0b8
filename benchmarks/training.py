"""Forward + backward of a Llama decoder layer through the training path (issue #33, item 3)::

    python -m benchmarks.training                      # 8B size: hidden 4096, SwiGLU 14336
    python -m benchmarks.training --size mid --seq 64  # hidden 1024, SwiGLU 3584

One transformers ``LlamaDecoderLayer`` (random weights, fixed seed, bfloat16, batch 1, causal
attention with the rotary embedding) is traced by AOTAutograd as a training call of
``mp.compile`` traces it (:func:`mirage_py.frontend_torch.training.trace_training`: the
min-cut partitioner's forward and backward graphs). Each graph is captured and superoptimised at
the real size -- regions, search, verification -- without running its regions on the CPU
interpreter (too slow at this size): an eager run of the two aten graphs records their inputs.
Reported per pass: regions, kernels naive -> found, predicted time (analytic cost model,
target h100; the operators left to PyTorch are not priced), saved activations, the operators
left to PyTorch, search seconds with the machine's load. Beside it, torch.compile (Inductor, on
this CPU) on the same layer's forward + backward: its generated kernels
(``torch._inductor.metrics.generated_kernel_count``) and its calls to external kernels (matmuls:
``extern_kernels.*`` in the generated code), which on a GPU would be one launch each too.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import re
import time
from pathlib import Path

import torch

from benchmarks._results import write_results

SIZES = {
    "8b": dict(hidden=4096, inter=14336, heads=32, kv_heads=8, head_dim=128),
    "mid": dict(hidden=1024, inter=3584, heads=8, kv_heads=2, head_dim=128),
    "tiny": dict(hidden=64, inter=128, heads=4, kv_heads=2, head_dim=16),
}


class Layer(torch.nn.Module):
    """A ``LlamaDecoderLayer`` called as ``LlamaModel`` calls it: rotary (cos, sin) given,
    causal attention (no mask tensor)."""

    def __init__(self, cfg):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer
        self.layer = LlamaDecoderLayer(cfg, layer_idx=0)

    def forward(self, hidden, cos, sin):
        out = self.layer(hidden, position_embeddings=(cos, sin))
        return out[0] if isinstance(out, tuple) else out


def build(size: str, seq: int, dtype: torch.dtype, seed: int = 0):
    import transformers
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    s = SIZES[size]
    cfg = transformers.LlamaConfig(hidden_size=s["hidden"], intermediate_size=s["inter"],
                                   num_attention_heads=s["heads"],
                                   num_key_value_heads=s["kv_heads"], head_dim=s["head_dim"],
                                   num_hidden_layers=1, rms_norm_eps=1e-5)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    layer = Layer(cfg).to(dtype)
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(1, seq, s["hidden"], generator=g)).to(dtype).requires_grad_(True)
    cos, sin = LlamaRotaryEmbedding(cfg)(h.float(), torch.arange(seq)[None])
    return cfg, layer, (h, cos.to(dtype), sin.to(dtype))


def ours(layer, args, budget_s: float, workers: int) -> dict:
    from mirage_py.frontend_torch.training import trace_training
    opts = dict(workers=workers, time_budget_s=budget_s, progress=False, database=False)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    aot = trace_training(layer, args, opts)
    seconds = time.perf_counter() - t0
    passes = {}
    for p in aot.passes():
        (g,) = p.graphs.values()
        passes[p.which.value] = {
            **_summary(g.region_rows(), g.eager_rows()),
            "saved_activations": p.saved if p.which.value == "forward" else None,
        }
    return {"passes": passes, "seconds": round(seconds, 1), "load_before": round(load, 2),
            "load_after": round(os.getloadavg()[0], 2), "budget_s": budget_s,
            "workers": workers}


def _summary(rows: list[dict], eager: list[dict]) -> dict:
    """One graph's regions (``region_rows``) and eager operators (``eager_rows``) as a table
    row: regions with kernels, kernels and predicted time naive -> found, verified, search."""
    return {"regions": sum(1 for r in rows if r["kernels"]),
            "kernels_naive": sum(r["kernels_naive"] for r in rows),
            "kernels": sum(r["kernels"] for r in rows),
            "predicted_naive_us": round(sum(r["naive_us"] for r in rows), 1),
            "predicted_us": round(sum(r["us"] for r in rows), 1),
            "verified": all(r["verified"] for r in rows),
            "eager_ops": sorted({e["op"] for e in eager}),
            "eager_count": len(eager),
            "search_s": round(sum(r["search_seconds"] for r in rows), 1)}


def inference(layer, args, budget_s: float, workers: int) -> dict:
    """The same layer's forward as an inference capture (``mp.compile`` with the examples, no
    gradients): what the forward costs without saving activations, with fused attention."""
    import mirage_py as mp
    t0 = time.perf_counter()
    cm = mp.compile(layer, tuple(a.detach() for a in args), workers=workers,
                    time_budget_s=budget_s, progress=False, database=False)
    eager = cm.eager_ops()
    return {**_summary(cm.regions(), eager),
            "eager_reasons": sorted({e["reason"] for e in eager}),
            "seconds": round(time.perf_counter() - t0, 1)}


def inductor(layer, args) -> dict:
    """torch.compile (Inductor, CPU) on the layer's forward + backward: generated kernels and
    external kernel calls in the generated code."""
    from torch._inductor import metrics
    from torch._inductor.utils import run_and_get_code
    torch._dynamo.reset()
    metrics.reset()
    compiled = torch.compile(layer)
    args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    cot = torch.randn(args[0].shape, generator=torch.Generator().manual_seed(1)).to(args[0].dtype)

    def step():
        out = compiled(*args)
        out.backward(cot)
        return out

    t0 = time.perf_counter()
    _, codes = run_and_get_code(step)
    seconds = time.perf_counter() - t0
    calls = [c[c.find("def call("):] for c in codes]
    return {"generated_kernels": metrics.generated_kernel_count,
            "extern_calls": sum(len(re.findall(r"extern_kernels\.\w+\(", c)) for c in calls),
            "graphs": len(codes), "seconds": round(seconds, 1)}


def run(size: str, seq: int, budget_s: float, workers: int, with_inductor: bool) -> dict:
    cfg, layer, args = build(size, seq, torch.bfloat16)
    res = {"date": _dt.date.today().isoformat(), "size": size, "seq": seq,
           "config": SIZES[size], "dtype": "bfloat16", "target": "h100",
           "params_m": round(sum(p.numel() for p in layer.parameters()) / 1e6, 1),
           "cpus": os.cpu_count(), "mirage": ours(layer, args, budget_s, workers)}
    res["inference"] = inference(layer, args, budget_s, workers)
    if with_inductor:
        res["inductor"] = inductor(layer, args)
    return res


def markdown(res: dict) -> str:
    c = res["config"]
    m = res["mirage"]
    lines = ["# Training: forward + backward of a Llama decoder layer", "",
             f"`python -m benchmarks.training --size {res['size']} --seq {res['seq']}`, "
             f"{res['date']}: one transformers `LlamaDecoderLayer` ({res['params_m']}M "
             f"parameters: hidden {c['hidden']}, {c['heads']} heads of {c['head_dim']} "
             f"({c['kv_heads']} key/value heads), SwiGLU {c['inter']}), bfloat16, batch 1 x "
             f"{res['seq']} tokens, causal attention with rotary. AOTAutograd's forward and "
             "backward graphs (min-cut partition), each captured and superoptimised at this "
             f"size (target {res['target']}, analytic cost model; operators left to PyTorch "
             "not priced). Search: one budget of "
             f"{m['budget_s']} s per graph, {m['workers']} workers on {res['cpus']} cores, "
             f"load (1 min) {m['load_before']} before / {m['load_after']} after; "
             f"{m['seconds']} s in all (eager trace, captures, searches, verification).", "",
             "| pass | regions | kernels naive -> found | predicted us naive -> found | "
             "verified | saved activations | operators left to PyTorch | search s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, p in m["passes"].items():
        eager = (f"{p['eager_count']}: " + ", ".join(p["eager_ops"])) if p["eager_count"] \
            else "0"
        lines.append(f"| {name} | {p['regions']} | {p['kernels_naive']} -> {p['kernels']} | "
                     f"{p['predicted_naive_us']} -> {p['predicted_us']} | {p['verified']} | "
                     f"{p['saved_activations'] if p['saved_activations'] is not None else '-'}"
                     f" | {eager} | {p['search_s']} |")
    tot_n = sum(p["kernels_naive"] for p in m["passes"].values())
    tot = sum(p["kernels"] for p in m["passes"].values())
    us_n = sum(p["predicted_naive_us"] for p in m["passes"].values())
    us = sum(p["predicted_us"] for p in m["passes"].values())
    lines.append(f"| **forward + backward** | | **{tot_n} -> {tot}** | **{us_n:.1f} -> "
                 f"{us:.1f}** | | | | |")
    inf = res.get("inference")
    if inf:
        eager = (f"{inf['eager_count']}: " + ", ".join(inf["eager_ops"])) if \
            inf["eager_count"] else "0"
        lines.append(f"| inference forward (same layer, no gradients; for comparison) | "
                     f"{inf['regions']} | {inf['kernels_naive']} -> {inf['kernels']} | "
                     f"{inf['predicted_naive_us']} -> {inf['predicted_us']} | "
                     f"{inf['verified']} | - | {eager} | {inf['search_s']} |")
        if inf["eager_count"]:
            lines += ["", "Why the inference forward's operators were left to PyTorch: " +
                      "; ".join(inf["eager_reasons"])]
    ind = res.get("inductor")
    if ind:
        lines += ["", "torch.compile (Inductor, on this machine's CPU) on the same layer, "
                  f"forward + backward ({ind['graphs']} generated modules, compiled and run "
                  f"in {ind['seconds']} s): **{ind['generated_kernels']} generated kernels** "
                  f"(fused C++ loops) + **{ind['extern_calls']} external kernel calls** "
                  "(matmuls and the like), i.e. "
                  f"{ind['generated_kernels'] + ind['extern_calls']} launches on a GPU against "
                  f"mirage_py's {tot} kernels (plus its operators left to PyTorch)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="8b")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--budget", type=float, default=300.0,
                    help="search budget per graph (forward, backward), seconds")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-inductor", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    out = args.out or str(Path(__file__).parent / "results" / "training")
    print(write_results(out, run(args.size, args.seq, args.budget, args.workers,
                                 not args.no_inductor), markdown))


if __name__ == "__main__":
    main()
