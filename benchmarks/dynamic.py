"""Shapes that vary: one search per program against one search per length.

The decode attentions of the nine benchmarks (``gqa``, ``qknorm_gqa``, ``mha``, ``mqa``) with a
symbolic KV length ``S`` in 1024 .. 32768 are superoptimised once (at the bucket of the paper's
4096) and asked for their answer at KV lengths over the range; each is compared with a static
search of the same program at exactly that length (the predicted time of each answer, h100
target, analytic cost model). Two configurations: *pow2*, the defaults (buckets at powers of
two, one search at 4096), and *fine*: buckets about 1/8 apart (:func:`fine_buckets`, multiples
of 512) and three searches (``FINE_REPRESENTATIVES``: a short cache's structure, the
paper's size and the longest cache's). A length inside a bucket runs the bucket's graph padded to the bucket's size, so its
predicted time is the bucket's::

    python -m benchmarks.dynamic            # writes benchmarks/results/dynamic.{json,md}
    python -m benchmarks.dynamic --quick    # three lengths, two programs (a smoke run)

Also reported: the one search's time, each bucket's replay (no search: the representative's
schedule at the bucket's sizes, verified there), and the first-use check of one length inside a
bucket (``FamilyProgram.check_sizes``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import platform
import time
from pathlib import Path

import mirage_py as mp
from benchmarks._results import RESULTS, write_results
from mirage_py.examples.programs import ATTENTION, get_program

LO, HI = 1024, 32768
POWERS = (1024, 2048, 4096, 8192, 16384, 32768)
INSIDE = (3072, 12288, 24576)  # halfway (in log) between two powers of two
REPRESENTATIVE = 4096
FINE_REPRESENTATIVES = ({"S": 1024}, {"S": 4096}, {"S": 32768})


def fine_buckets(lo: int = LO, hi: int = HI, step: float = 1.125, align: int = 512) -> list[int]:
    """Bucket sizes about ``step`` apart, rounded up to multiples of ``align``, from ``lo`` to
    ``hi``: a length pays at most about 1/8 of padding."""
    out, x = [], float(lo)
    while True:
        b = min(hi, int(math.ceil(x / align) * align))
        if not out or b > out[-1]:
            out.append(b)
        if b >= hi:
            return out
        x = b * step


def _opts() -> dict:
    return dict(workers=1, database=False, progress=False)


def family_rows(name: str, lengths: tuple[int, ...], schedule: str) -> tuple[dict, list[dict]]:
    S = mp.dim("S", LO, HI)
    p = get_program(name, kv=S)
    if schedule == "pow2":
        buckets, reps = None, {"S": REPRESENTATIVE}
    else:
        buckets, reps = {"S": fine_buckets()}, list(FINE_REPRESENTATIVES)
    t0 = time.perf_counter()
    fam = mp.superopt(p, representative=reps, buckets=buckets, **_opts())
    search_s = time.perf_counter() - t0
    head = {"program": name, "schedule": schedule, "search_s": round(search_s, 2),
            "buckets": list(fam.buckets["S"]), "kernels": fam.num_kernels,
            "representatives": [r["S"] for r in fam.representatives]}
    rows = []
    for n in lengths:
        bucket = fam.bucket({"S": n})
        new = fam._key(bucket) not in fam.instances
        t1 = time.perf_counter()
        inst = fam.instance(bucket)
        rows.append({"program": name, "schedule": schedule, "kv": n, "bucket": bucket["S"],
                     "predicted_us": round(inst.estimated_time_us, 3),
                     "launched_us": round(fam.estimated_time_at({"S": n}), 3),
                     "kernels": inst.num_kernels,
                     "build_s": round(time.perf_counter() - t1, 2) if new else None,
                     "searched": sum(pt.searched for pt in inst.parts)})
    inside = next((n for n in lengths if n not in fam.buckets["S"]), None)
    if inside is not None:
        c = fam.check_sizes({"S": inside})
        head.update(check_kv=inside, check_s=round(c.seconds, 2), check_bound=c.bound)
    head["searches"] = fam.searches
    return head, rows


def static_rows(name: str, lengths: tuple[int, ...]) -> list[dict]:
    rows = []
    for n in lengths:
        t0 = time.perf_counter()
        opt = mp.superopt(get_program(name, kv=n), **_opts())
        rows.append({"program": name, "kv": n, "predicted_us": round(opt.estimated_time_us, 3),
                     "kernels": opt.num_kernels,
                     "search_s": round(time.perf_counter() - t0, 2)})
    return rows


def run(names: tuple[str, ...], lengths: tuple[int, ...], log=print,
        static_from: dict | None = None) -> dict:
    """The families' rows, and the static searches' (or those of ``static_from``, an earlier
    results document of this script: the static answers do not depend on the families)."""
    doc = {"date": _dt.date.today().isoformat(), "machine": platform.machine(),
           "processor": platform.processor() or platform.machine(), "target": "h100",
           "range": [LO, HI], "representative": REPRESENTATIVE,
           "fine_representatives": list(FINE_REPRESENTATIVES), "families": [],
           "family_rows": [], "static_rows": []}
    for name in names:
        for schedule in ("pow2", "fine"):
            head, rows = family_rows(name, lengths, schedule)
            doc["families"].append(head)
            doc["family_rows"] += rows
            log(f"{name} {schedule}: search {head['search_s']} s, "
                f"{len(rows)} lengths, searches {head['searches']}")
        if static_from is None:
            doc["static_rows"] += static_rows(name, lengths)
            log(f"{name}: static searches done")
    if static_from is not None:
        doc["static_rows"] = [r for r in static_from["static_rows"]
                              if r["program"] in names and r["kv"] in lengths]
        doc["static_date"] = static_from["date"]
    return doc


def _launched(row: dict) -> float:
    """A family row's price as launched at its length (rows written before it existed: whole)."""
    return row.get("launched_us", row["predicted_us"])


def markdown(doc: dict) -> str:
    static = {(r["program"], r["kv"]): r for r in doc["static_rows"]}
    fam = {(r["program"], r["schedule"], r["kv"]): r for r in doc["family_rows"]}
    heads = {(h["program"], h["schedule"]): h for h in doc["families"]}
    names = sorted({r["program"] for r in doc["static_rows"]}, key=ATTENTION.index)
    lengths = sorted({r["kv"] for r in doc["static_rows"]})
    out = ["# Shapes that vary: a search or two per program against one per length", "",
           f"Made by `python -m benchmarks.dynamic` on {doc['date']} ({doc['processor']}; "
           f"predicted times, target `{doc['target']}`, analytic cost model -- no GPU ran "
           f"them). Each program's KV length is a dim `S` in {doc['range'][0]} .. "
           f"{doc['range'][1]}. *pow2*: buckets at powers of two, one search at "
           f"{doc['representative']}; *fine*: buckets about 1/8 apart, searches at "
           f"{', '.join(str(r['S']) for r in doc.get('fine_representatives', []))}. Each "
           f"configuration's answer at a length is its bucket's graph, padded to the bucket's "
           f"size, priced whole (the bucket's us) and as launched at that length (grids and "
           f"loop trip counts sized from the valid length at launch, codegen_cuda/extents.py; "
           f"`FamilyProgram.estimated_time_at`); *static*: a search of the program at exactly "
           f"that length"
           + (f" (static rows from this script's run of {doc['static_date']})"
              if "static_date" in doc else "")
           + ". Ratio = family as launched / static (1.00: as fast as a search at that "
           "length).", "",
           "| program | KV length | static us (search s) | pow2: bucket, us whole -> launched, "
           "ratio | fine: bucket, us whole -> launched, ratio |", "|---|---|---|---|---|"]
    for name in names:
        for n in lengths:
            s = static[(name, n)]
            cells = []
            for sch in ("pow2", "fine"):
                f = fam[(name, sch, n)]
                cells.append(f"{f['bucket']}, {f['predicted_us']:.1f} -> "
                             f"{_launched(f):.1f}, {_launched(f) / s['predicted_us']:.2f}")
            out.append(f"| {name} | {n} | {s['predicted_us']:.1f} ({s['search_s']:.1f}) | "
                       + " | ".join(cells) + " |")
    out += ["", "| program | configuration | searched at | search s | other buckets built "
            "(s each) | "
            "searches | first-use check of one length (s, bound) | static searches s (all "
            "lengths) |", "|---|---|---|---|---|---|---|---|"]
    for name in names:
        total = sum(r["search_s"] for r in doc["static_rows"] if r["program"] == name)
        for sch in ("pow2", "fine"):
            h = heads[(name, sch)]
            built = sorted({(r["bucket"], r["build_s"]) for r in doc["family_rows"]
                            if r["program"] == name and r["schedule"] == sch
                            and r["bucket"] not in h["representatives"]
                            and r["build_s"] is not None})
            check = (f"{h['check_kv']}: {h['check_s']:.1f}, {h['check_bound']:.1e}"
                     if "check_kv" in h else "-")
            out.append(f"| {name} | {sch} | {', '.join(map(str, h['representatives']))} | "
                       f"{h['search_s']:.1f} | "
                       + ", ".join(f"{b} ({s:.1f})" for b, s in built)
                       + f" | {h['searches']} | {check} | {total:.1f} |")
    def worst(sch: str, price, at_buckets: bool = False) -> float:
        return max(price(fam[(nm, sch, n)]) / static[(nm, n)]["predicted_us"]
                   for nm in names for n in lengths
                   if not at_buckets or n == fam[(nm, sch, n)]["bucket"])

    out += ["", "Worst ratio, as launched: " + ", ".join(
        f"{sch} {worst(sch, _launched):.2f}" for sch in ("pow2", "fine"))
        + "; priced whole: " + ", ".join(
            f"{sch} {worst(sch, lambda f: f['predicted_us']):.2f}" for sch in ("pow2", "fine"))
        + "; at the bucket sizes themselves: " + ", ".join(
            f"{sch} {worst(sch, _launched, True):.2f}" for sch in ("pow2", "fine")) + "."]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two programs, three lengths")
    ap.add_argument("--out", default=str(RESULTS / "dynamic"))
    ap.add_argument("--static-from", metavar="JSON",
                    help="take the static searches' rows from an earlier results file of this "
                         "script instead of searching every length again")
    args = ap.parse_args(argv)
    old = json.loads(Path(args.static_from).read_text()) if args.static_from else None
    if args.quick:
        doc = run(("mqa", "gqa"), (1024, 3072, 4096), static_from=old)
    else:
        doc = run(ATTENTION, tuple(sorted(POWERS + INSIDE)), static_from=old)
    print(write_results(args.out, doc, markdown))


if __name__ == "__main__":
    main()
