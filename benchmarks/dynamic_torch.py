"""Shapes that vary through the PyTorch frontend: a tiny Llama compiled once, called at new shapes.

A transformers ``LlamaForCausalLM`` (2 layers, hidden 64, 4 heads of 16 with 2 KV heads, FFN
128, vocabulary 128, random weights, float32, ``use_cache=False``) is compiled at input (1, 16)
with ``mp.compile(dynamic=...)`` and called at other shapes on the CPU (the μGraph interpreter).
For each configuration: the first compile's seconds and searches; per call at a new shape its
seconds, the searches so far and the error against eager (norm-wise relative). Rows:

* ``static``: ``dynamic=False`` (one search per shape -- the first compile is today's static one);
* ``dynamic=True`` and ``dynamic=None`` over the held-out shapes (1, 17), (1, 23), (1, 40),
  (2, 16), (3, 29), (1, 1);
* on the ``dynamic=True`` module, after those: a sweep over lengths 2-64 at batch 1 and
  batches 1-4 at length 24, then ``generate(max_new_tokens=32)`` (greedy) with transformers'
  KV cache and without it, at two prompt lengths, against eager ``generate`` with its default
  cache.

``python -m benchmarks.dynamic_torch [--quick | --held-out LAYERS --out ...]``; ``database=False`` throughout (no answers
from earlier runs). Writes ``benchmarks/results/dynamic_torch.{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from datetime import date

from benchmarks._results import RESULTS, write_results

HELD_OUT = [(1, 17), (1, 23), (1, 40), (2, 16), (3, 29), (1, 1)]


def _model(layers: int):
    import torch
    import transformers
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, num_hidden_layers=layers,
                                   vocab_size=128, max_position_embeddings=128,
                                   rms_norm_eps=1e-6)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def _ids(b: int, s: int, seed: int):
    import torch
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 128, (b, s), generator=g)


def _compile(model, dynamic):
    import mirage_py as mp
    from mirage_py.frontend_torch.runtime import clear_cache
    clear_cache()
    t0 = time.perf_counter()
    cm = mp.compile(model, (_ids(1, 16, 0),), {"use_cache": False}, dynamic=dynamic,
                    database=False, progress=False)
    return cm, time.perf_counter() - t0


def _call(cm, model, b: int, s: int) -> dict:
    import torch
    x = _ids(b, s, b * 1000 + s)
    t0 = time.perf_counter()
    with torch.no_grad():
        got = cm(x, use_cache=False).logits
    dt = time.perf_counter() - t0
    with torch.no_grad():
        want = model(x, use_cache=False).logits
    return {"shape": [b, s], "seconds": round(dt, 3), "searches": cm.searches(),
            "error": float((got - want).norm() / want.norm())}


def _config(model, dynamic, shapes) -> tuple[dict, object]:
    cm, first = _compile(model, dynamic)
    row = {"dynamic": dynamic, "first_compile_s": round(first, 2),
           "first_searches": cm.searches(), "calls": []}
    for b, s in shapes:
        row["calls"].append(_call(cm, model, b, s))
        print(f"  dynamic={dynamic} {b}x{s}: {row['calls'][-1]}", flush=True)
    return row, cm


def _generate(cm, model, new_tokens: int, use_cache: bool) -> dict:
    """``generate`` greedy through ``cm`` (with transformers' own KV cache or recomputing the
    prefix) against eager ``generate`` with its default cache; then a second prompt length."""
    import torch
    out = {"new_tokens": new_tokens, "use_cache": use_cache, "runs": []}
    for length, seed in ((16, 0), (11, 1)):
        ids = _ids(1, length, seed)
        with torch.no_grad():
            t0 = time.perf_counter()
            want = model.generate(ids, max_new_tokens=new_tokens, do_sample=False)
            eager_s = time.perf_counter() - t0
        searched = cm.searches()
        with torch.no_grad():
            t0 = time.perf_counter()
            got = cm.generate(ids, max_new_tokens=new_tokens, do_sample=False,
                              use_cache=use_cache)
            gen_s = time.perf_counter() - t0
        out["runs"].append({"prompt": length, "generate_s": round(gen_s, 2),
                            "searches": cm.searches() - searched,
                            "tokens_equal_eager": bool(torch.equal(got, want)),
                            "eager_generate_s": round(eager_s, 3)})
    return out


def run(quick: bool) -> dict:
    model = _model(1 if quick else 2)
    doc = {"date": str(date.today()), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
           "layers": 1 if quick else 2, "configs": []}
    static, _ = _config(model, False, [] if quick else [(1, 17)])
    doc["configs"].append(static)
    auto, _ = _config(model, None, HELD_OUT)
    always, cm = _config(model, True, HELD_OUT)
    doc["configs"] += [always, auto]
    # the dynamic=True module goes on: the sweep and generate() after the held-out calls
    lengths = [1, 2, 3, 5, 8, 13, 21, 34, 55, 64] if quick else list(range(2, 65))
    doc["sweep"] = {"first_compile_s": always["first_compile_s"],
                    "searches_before": cm.searches(),
                    "lengths": [_call(cm, model, 1, s) for s in lengths],
                    "batches": [_call(cm, model, b, 24) for b in (1, 2, 3, 4)]}
    doc["generate"] = [_generate(cm, model, 8 if quick else 32, use_cache=True),
                       _generate(cm, model, 8 if quick else 32, use_cache=False)]
    return doc


def held_out(layers: int) -> dict:
    """The issue's held-out check alone at ``layers`` layers: the static first compile and the
    ``dynamic=True`` module's first compile and held-out calls (no sweep, no generate())."""
    model = _model(layers)
    doc = {"date": str(date.today()), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
           "layers": layers, "configs": []}
    static, _ = _config(model, False, [])
    always, _ = _config(model, True, HELD_OUT)
    doc["configs"] += [static, always]
    return doc


def markdown(doc: dict) -> str:
    static = doc["configs"][0]
    lines = ["# Shapes that vary through `mp.compile`: a tiny Llama at new shapes", "",
             f"Made by `python -m benchmarks.dynamic_torch` on {doc['date']} ({doc['machine']}; "
             f"CPU, the μGraph interpreter; `database=False`). transformers `LlamaForCausalLM`, "
             f"{doc['layers']} layer(s), hidden 64, 4 heads of 16 (2 KV heads), FFN 128, "
             "vocabulary 128, random weights, float32, `use_cache=False`, compiled at (1, 16). "
             "A call at a new shape captures again (torch.export) and runs a shape family's "
             "bucket where the region is an instance of one (docs/torch.md). Error: norm-wise "
             "relative against eager PyTorch.", "",
             "| dynamic | first compile s (searches) | call | s | / first compile | searches "
             "so far | error |", "|---|---|---|---|---|---|---|"]
    for c in doc["configs"]:
        head = f"| {c['dynamic']} | {c['first_compile_s']} ({c['first_searches']}) "
        if not c["calls"]:
            lines.append(head + "| - | - | - | - | - |")
        for i, k in enumerate(c["calls"]):
            lines.append((head if i == 0 else "| | ") +
                         f"| {tuple(k['shape'])} | {k['seconds']:.2f} | "
                         f"{k['seconds'] / c['first_compile_s']:.3f} | {k['searches']} | "
                         f"{k['error']:.1e} |")
    lines.append("")
    for c in doc["configs"][1:]:
        calls = c["calls"]
        no_one = [k for k in calls if 1 not in k["shape"][1:]]
        mean = statistics.mean(k["seconds"] for k in calls) / c["first_compile_s"]
        lines.append(f"- dynamic={c['dynamic']}: mean call / first compile {mean:.3f} over all "
                     f"held-out shapes; {statistics.mean(k['seconds'] for k in no_one) / c['first_compile_s']:.3f}"
                     f" without length 1 (where PyTorch specialises the graph: no causal mask); "
                     f"first compile {c['first_compile_s'] / static['first_compile_s']:.2f}x "
                     "the static one; searches in all "
                     f"{calls[-1]['searches'] if calls else c['first_searches']}.")
    if "sweep" not in doc:  # the held-out check alone (--held-out)
        return "\n".join(lines + [""])
    sw = doc["sweep"]
    ls, bs = sw["lengths"], sw["batches"]
    lines += ["", f"**Sweep**, the `dynamic=True` module after the held-out calls "
              f"({sw['searches_before']} search(es) so far): lengths {ls[0]['shape'][1]}-"
              f"{ls[-1]['shape'][1]} at batch 1 ({len(ls)} calls): mean "
              f"{statistics.mean(k['seconds'] for k in ls):.2f} s "
              f"({statistics.mean(k['seconds'] for k in ls) / sw['first_compile_s']:.3f} of the "
              f"first compile), max {max(k['seconds'] for k in ls):.2f} s, worst error "
              f"{max(k['error'] for k in ls):.1e}; batches 1-4 at length 24: mean "
              f"{statistics.mean(k['seconds'] for k in bs):.2f} s, worst error "
              f"{max(k['error'] for k in bs):.1e}; searches after the sweep: "
              f"{bs[-1]['searches']}."]
    lines += ["", "**generate()**, greedy, on the same module, then again with another prompt "
              "length; tokens against eager `generate()` with its default cache. With the KV "
              "cache: transformers' own `DynamicCache` through compiled prefill and decode steps "
              "(their first use searches their two families); without: every step recomputes the "
              "prefix through the compiled module (docs/torch.md).", "",
              "| KV cache | new tokens | prompt | s | searches | tokens equal eager | eager s |",
              "|---|---|---|---|---|---|---|"]
    for g in doc["generate"]:
        for r in g["runs"]:
            lines.append(f"| {'yes' if g['use_cache'] else 'no'} | {g['new_tokens']} | "
                         f"{r['prompt']} | {r['generate_s']} | {r['searches']} | "
                         f"{r['tokens_equal_eager']} | {r['eager_generate_s']} |")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 layer, fewer lengths")
    ap.add_argument("--out", default=str(RESULTS / "dynamic_torch"))
    ap.add_argument("--held-out", type=int, metavar="LAYERS", default=None,
                    help="only the held-out check (static and dynamic=True compiles and the "
                         "held-out calls) of a LAYERS-layer model")
    ap.add_argument("--render", action="store_true",
                    help="rewrite the .md from the .json already written (no run)")
    args = ap.parse_args(argv)
    if args.render:
        import json
        from pathlib import Path
        doc = json.loads(Path(args.out + ".json").read_text())
        Path(args.out + ".md").write_text(markdown(doc))
        return
    doc = held_out(args.held_out) if args.held_out else run(args.quick)
    print(write_results(args.out, doc, markdown))


if __name__ == "__main__":
    main()
