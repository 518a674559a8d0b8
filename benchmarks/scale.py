"""Whole decode steps at scale (issue #29, item 5): depth and width against search time, kernels,
predicted time per token and peak memory::

    python -m benchmarks.scale                      # the default cases, one process each
    python -m benchmarks.scale --cases 8b:1 70b:1   # some of them
    python -m benchmarks.scale --merge              # add the cases to the committed table

The program is ``benchmarks.compositions.decoder_block`` with one token (decode), a 4096-token
KV cache, heads of 128, float16, at the widths of Llama-3-8B (hidden 4096, 32 heads, FFN 14336),
-70B (8192, 64, 28672) and -405B (16384, 128, 53248), ``layers`` of them stacked. Each case is
searched in a fresh child process (``superopt(..., database=False, workers=1)``, unhurried),
which reports its own peak resident memory (``getrusage`` max RSS: everything the search
touched, Python and NumPy included); cases run one after another, never two at once. The copy
floor moves every input and output once at the target's copy bandwidth
(``benchmarks.decode8b.floor_us``); the search shares the machine's cores, so the load average
is written beside its time. Results: ``benchmarks/results/scale.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks._results import RESULTS, table, write_results


@dataclass(frozen=True)
class Width:
    """A model width: hidden size, attention heads (of 128) and FFN size."""

    name: str
    d: int
    heads: int
    f: int


WIDTHS = {w.name: w for w in (Width("8b", 4096, 32, 14336), Width("70b", 8192, 64, 28672),
                              Width("405b", 16384, 128, 53248))}
#: depth 1/8/32/80 at the 8B width, the three widths at one layer
DEFAULT_CASES = ("8b:1", "8b:8", "8b:32", "8b:80", "70b:1", "405b:1")
KV = 4096
HEAD_DIM = 128


def parse_case(case: str) -> tuple[Width, int]:
    name, _, layers = case.partition(":")
    if name not in WIDTHS or not layers.isdigit() or int(layers) < 1:
        raise SystemExit(f"scale: a case is WIDTH:LAYERS with WIDTH one of {sorted(WIDTHS)}, "
                         f"got {case!r}")
    return WIDTHS[name], int(layers)


def child(case: str, target: str) -> dict:
    """Search one case here and return its row (run in a process of its own)."""
    import mirage_py as mp
    from benchmarks.compositions import decoder_block
    from benchmarks.decode8b import floor_us
    from mirage_py.targets import get_target
    w, layers = parse_case(case)
    c = decoder_block(b=1, kv=KV, d=w.d, heads=w.heads, hd=HEAD_DIM, f=w.f, layers=layers,
                      name=f"decode_{w.name}_x{layers}")
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    opt = mp.superopt(c.program, target=target, database=False, workers=1, progress=False)
    seconds = time.perf_counter() - t0
    floor = floor_us(c.program, get_target(target))
    return {"case": case, "width": w.name, "hidden": w.d, "heads": w.heads, "ffn": w.f,
            "layers": layers, "search_s": round(seconds, 1),
            "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2),
            "kernels_naive": opt.naive_num_kernels, "kernels": opt.num_kernels,
            "predicted_naive_us": round(opt.naive_estimated_time_us, 1),
            "predicted_us": round(opt.estimated_time_us, 1), "floor_us": round(floor, 1),
            "floor_ratio": round(floor / opt.estimated_time_us, 3),
            # Linux reports ru_maxrss in KiB
            "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9,
                                 2)}


def measure(case: str, target: str, timeout_s: float) -> dict:
    """One case in a fresh process; a row saying why when it does not finish."""
    root = Path(__file__).resolve().parent.parent
    cmd = [sys.executable, "-m", "benchmarks.scale", "--child", case, "--target", target]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"case": case, "error": f"not finished in {timeout_s:.0f} s"}
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        return {"case": case, "error": f"exit {proc.returncode}: {tail[0][:200]}",
                "wall_s": round(time.perf_counter() - t0, 1)}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def markdown(doc: dict) -> str:
    lines = ["# Decode steps at scale: depth and width", "",
             f"`python -m benchmarks.scale`, {doc['date']}, target {doc['target']}, analytic cost "
             "model; `decoder_block` (one token, KV cache 4096, heads of 128, float16), "
             "`database=False`, `workers=1`, each case in a fresh process on a "
             f"{doc['cpus']}-core machine shared with other work (load average beside the "
             "time). Peak RSS is the search process's max resident memory. The floor moves "
             "every input and output once at the copy bandwidth.", ""]
    rows = ([r["case"], "", r["error"]] + [""] * 6 if "error" in r else
            [f"{r['width']} (hidden {r['hidden']}, FFN {r['ffn']})", r["layers"], r["search_s"],
             f"{r['load_before']} / {r['load_after']}", f"{r['kernels_naive']} -> {r['kernels']}",
             f"{r['predicted_naive_us']} -> {r['predicted_us']}", r["floor_us"],
             f"{r['floor_ratio']:.1%}", r["peak_rss_gb"]] for r in doc["rows"])
    lines += table(["width", "layers", "search s", "load before / after",
                    "kernels naive -> found", "predicted us naive -> found", "floor us",
                    "floor / predicted", "peak RSS GB"], rows)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="*", default=list(DEFAULT_CASES),
                    help="WIDTH:LAYERS, e.g. 8b:32 (default: %(default)s)")
    ap.add_argument("--target", default="h100")
    ap.add_argument("--timeout", type=float, default=3600.0, help="per case, seconds")
    ap.add_argument("--merge", action="store_true",
                    help="keep the committed rows of cases not run now")
    ap.add_argument("--out", default=str(RESULTS / "scale"))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.target)))
        return
    for case in args.cases:
        parse_case(case)
    rows = {}
    out = Path(args.out)
    if args.merge and out.with_suffix(".json").exists():
        rows = {r["case"]: r for r in json.loads(out.with_suffix(".json").read_text())["rows"]}
    order = {c: i for i, c in enumerate(DEFAULT_CASES)}
    md = ""
    for case in args.cases:
        rows[case] = measure(case, args.target, args.timeout)
        print(json.dumps(rows[case]), flush=True)
        # written after every case: a long run that is stopped keeps the cases it finished
        doc = {"date": _dt.date.today().isoformat(), "target": args.target,
               "cpus": os.cpu_count(),
               "rows": sorted(rows.values(), key=lambda r: (order.get(r["case"], len(order)),
                                                            r["case"]))}
        md = write_results(out, doc, markdown)
    print(md)


if __name__ == "__main__":
    main()
