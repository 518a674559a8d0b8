"""Seen before means no search, across processes (issue #27, item 7).

Each workload is compiled in a fresh Python process three times over one results database: the
first process searches, the next two find everything there. Timed: the compile call alone (the
imports and the model's construction are outside it), split into capture (``torch.export`` and
decompositions, or the kept graph: ``frontend_torch/capture_cache.py``), region analysis and
superopt.

* ``tiny Llama``: transformers ``LlamaForCausalLM`` (2 layers, hidden 64, 4 heads of 16 with 2
  KV heads, FFN 128, vocabulary 128, random weights, float32) through ``mp.compile`` at (1, 16)
  -- goal: <= 1 s from the database;
* ``8B decode layer``: ``benchmarks.compositions.decoder_block`` at Llama-3-8B size (hidden 4096,
  32 heads of 128, KV 4096, FFN 14336, float16, one token) through ``mp.superopt`` (Program API)
  -- goal: <= 2 s from the database.

``python -m benchmarks.seen_before`` writes ``benchmarks/results/seen_before.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import date

from benchmarks._results import RESULTS, table, write_results

_TINY_LLAMA = """
import json, sys, time, warnings
warnings.filterwarnings("ignore")
import torch, transformers
import mirage_py as mp
cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=16, num_hidden_layers=2,
                               vocab_size=128, max_position_embeddings=64, rms_norm_eps=1e-6)
cfg._attn_implementation = "sdpa"
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(cfg).eval()
ids = torch.randint(0, 128, (1, 16))
t0 = time.perf_counter()
cm = mp.compile(model, (ids,), {"use_cache": False}, workers=1, progress=False,
                database=sys.argv[1])
total = time.perf_counter() - t0
g = next(iter(cm.graphs.values()))
with torch.no_grad():
    want = model(ids, use_cache=False).logits
    got = cm(ids, use_cache=False).logits
err = ((got - want).norm() / want.norm()).item()
print(json.dumps({"compile_s": total, "capture_s": g.cap.seconds, "cached": g.cap.cached,
                  "analyse_s": g.capture_seconds, "superopt_s": g.superopt_seconds,
                  "searches": cm.searches(), "error": err}))
"""

_DECODE_8B = """
import json, sys, time
import mirage_py as mp
from benchmarks.compositions import decoder_block
p = decoder_block(b=1, kv=4096, d=4096, heads=32, hd=128, f=14336, name="llama8b_decode").program
t0 = time.perf_counter()
opt = mp.superopt(p, target="h100", database=sys.argv[1], workers=1, progress=False)
total = time.perf_counter() - t0
print(json.dumps({"compile_s": total, "superopt_s": total, "origin": opt.origin,
                  "kernels": opt.num_kernels, "predicted_us": opt.estimated_time_us}))
"""

WORKLOADS = {"tiny Llama (mp.compile)": _TINY_LLAMA, "8B decode layer (Program API)": _DECODE_8B}


def _run(script: str, db: str, timeout: float) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root] + sys.path)}
    out = subprocess.run([sys.executable, "-c", script, db], env=env, capture_output=True,
                         text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"benchmark process failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(processes: int = 3, timeout: float = 3600.0) -> dict:
    rows = []
    for name, script in WORKLOADS.items():
        with tempfile.TemporaryDirectory() as tmp:
            db = os.path.join(tmp, "results.sqlite")
            for i in range(processes):
                load = os.getloadavg()[0]
                r = _run(script, db, timeout)
                rows.append({"workload": name, "process": i + 1, "load": round(load, 2), **r})
                print(name, i + 1, {k: (round(v, 3) if isinstance(v, float) else v)
                                    for k, v in r.items()}, flush=True)
    return {"date": date.today().isoformat(), "machine": f"{platform.machine()}, "
            f"{os.cpu_count()} CPUs", "rows": rows}


def markdown(doc: dict) -> str:
    lines = ["# Seen before: a compile answered from the results database", "",
             f"Made by `python -m benchmarks.seen_before` on {doc['date']} ({doc['machine']}). "
             "Each row is a fresh Python process over one results database per workload; the "
             "first searches. Seconds are the compile call alone (imports and model "
             "construction outside it). *capture*: torch.export + decompositions, or the kept "
             "graph (`frontend_torch/capture_cache.py`).", ""]
    rows = ([r["workload"], r["process"], f"{r['compile_s']:.2f}",
             f"{r['capture_s']:.2f}" if "capture_s" in r else "-",
             ("yes" if r["cached"] else "no") if "cached" in r else "-",
             f"{r['superopt_s']:.2f}",
             f"{r['searches']} searches" if "searches" in r else r.get("origin", ""), r["load"]]
            for r in doc["rows"])
    lines += table(["workload", "process", "compile s", "capture s", "kept graph",
                    "superopt s", "searches / origin", "load"], rows)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS / "seen_before"))
    args = ap.parse_args(argv)
    print(write_results(args.out, run(args.processes), markdown))


if __name__ == "__main__":
    main()
