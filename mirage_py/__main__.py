"""``python -m mirage_py demo [NAME] [--bs N]``: the main job on a built-in example."""

from __future__ import annotations

import argparse
import os
import sys


def _benchmarks():
    # benchmarks/ lives at the repository root, next to the package
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:
        sys.path.insert(0, root)
    from benchmarks import programs
    return programs


def demo(name: str, bs: int) -> int:
    import mirage_py as mp

    programs = _benchmarks()
    p = programs.get_program(name, bs)
    print(p)
    print()
    print(mp.partition(p))
    print()
    fused = mp.partition(p, uninterpreted=True)
    print(f"with non-Lax elementwise operators as uninterpreted functions: {len(fused)} part(s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mirage_py")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="run the main job on a built-in benchmark program")
    d.add_argument("name", nargs="?", default="rmsnorm_linear")
    d.add_argument("--bs", type=int, default=1)
    args = ap.parse_args(argv)
    if args.cmd == "demo":
        return demo(args.name, args.bs)
    return 2


if __name__ == "__main__":
    sys.exit(main())
