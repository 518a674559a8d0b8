"""The ``mirage-py`` command line (also ``python -m mirage_py``).

Subcommands::

    mirage-py demo [NAME] [--bs N]          superoptimise a built-in benchmark program
    mirage-py superopt FILE.py [options]    superoptimise the Program(s) a Python file defines
    mirage-py show RESULT.json [--out DIR]  summary (and picture) of a saved result
    mirage-py bench [options]               the benchmark suite (mirage_py/examples/bench.py)

The demo's programs and the benchmark suite ship in the package (``mirage_py.examples``), so
every subcommand works from any directory after a plain ``pip install``.

Exit codes: 0 success; 1 the work failed (a search or check went wrong); 2 bad input (missing
file, no Program in it, unknown target, unwritable output directory, bad arguments); 130
interrupted (Ctrl-C): a superopt interrupted during its search still prints (and with ``--out``
writes) the best verified answer found until then, marked as interrupted, and stops there; a
second Ctrl-C, or one before any answer exists, prints "interrupted" alone. Errors are one line
plus a hint; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback

EXIT_OK, EXIT_FAIL, EXIT_INPUT = 0, 1, 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


class UsageProblem(Exception):
    """Bad input from the user: reported in one line with a hint, exit code 2."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.hint = hint


def _benchmarks():
    from .examples import programs
    return programs


def _check_target(name: str) -> str:
    from .targets import TARGETS
    if name.lower() not in TARGETS:
        raise UsageProblem(f"unknown target {name!r}", f"choose one of {', '.join(TARGETS)}")
    return name.lower()


def _out_dir(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise UsageProblem(f"cannot create output directory {path!r}: {e.strerror}",
                           "choose a directory you can write to") from None
    if not os.access(path, os.W_OK):
        raise UsageProblem(f"output directory {path!r} is not writable",
                           "choose a directory you can write to")
    return path


def _write_outputs(opt, out: str) -> None:
    from .ugraph.dot import render
    stem = os.path.join(out, opt.program.name)
    opt.save(stem + ".json")
    render(opt.graph, stem + ".dot")
    written = [stem + ".json", stem + ".dot"]
    try:
        render(opt.graph, stem + ".svg")
        written.append(stem + ".svg")
    except Exception as e:  # Graphviz missing: the .dot is there
        print(f"note: no SVG picture ({e})", file=sys.stderr)
    try:
        opt.export_cuda(os.path.join(out, "cuda"))
        written.append(os.path.join(out, "cuda") + os.sep)
    except ImportError:
        print("note: CUDA export is not available in this version", file=sys.stderr)
    print("wrote " + ", ".join(written))


def _superopt_and_report(program, args):
    import mirage_py as mp

    from .superopt.executors import RayExecutor
    opt = mp.superopt(program, target=args.target, time_budget_s=args.time_budget,
                      workers=args.workers, progress=sys.stderr.isatty(),
                      database=args.database,
                      executor=RayExecutor(args.ray) if getattr(args, "ray", None) else None)
    print(opt.summary())
    if args.out:
        _write_outputs(opt, args.out)
    ok = all(v is not None and v.equivalent for v in opt.verification)
    if not ok:
        return EXIT_FAIL, opt
    return (EXIT_INTERRUPTED if opt.interrupted else EXIT_OK), opt


def cmd_demo(args) -> int:
    import numpy as np

    import mirage_py as mp

    programs = _benchmarks()
    if args.name not in programs.NAMES:
        raise UsageProblem(f"unknown benchmark {args.name!r}",
                           f"choose one of {', '.join(programs.NAMES)}")
    p = programs.get_program(args.name, args.bs)
    print(p)
    print()
    print(mp.partition(p))
    print()
    code, opt = _superopt_and_report(p, args)
    x = programs.get_inputs(args.name, args.bs)
    ref = p.evaluate(x)
    out = opt.run_numpy(x)
    err = max(float(np.linalg.norm(out[k] - ref[k]) / np.linalg.norm(ref[k])) for k in ref)
    print(f"  CPU interpreter (GPU-like precision) vs float64 reference: norm-wise relative "
          f"error {err:.1e}")
    return code


def cmd_superopt(args) -> int:
    from .lax.program import Program

    path = args.file
    if not os.path.isfile(path):
        raise UsageProblem(f"no such file: {path}", "give the path of a .py file that builds a "
                           "mirage_py Program")
    try:
        env = runpy.run_path(path, run_name="__mirage_py__")
    except SyntaxError as e:
        raise UsageProblem(f"{path}:{e.lineno}: syntax error: {e.msg}", "fix the file") from None
    programs = [v for v in env.values() if isinstance(v, Program)]
    if args.program:
        programs = [p for p in programs if p.name == args.program]
    if not programs:
        raise UsageProblem(f"{path} defines no mirage_py Program"
                           + (f" named {args.program!r}" if args.program else ""),
                           "build one at module level, e.g. p = mp.Program('name'); "
                           "p.input(...); p.output(...)")
    code = EXIT_OK
    for p in programs:
        if not p.outputs:
            raise UsageProblem(f"Program {p.name!r} in {path} has no outputs",
                               "declare them with p.output(tensor)")
        got, opt = _superopt_and_report(p, args)
        if opt.interrupted:  # Ctrl-C: the programs after this one are not started
            return got
        code = max(code, got)
    return code


def cmd_show(args) -> int:
    from .errors import SerializationError
    from .superopt import load

    if not os.path.isfile(args.result):
        raise UsageProblem(f"no such file: {args.result}", "give a RESULT.json written by "
                           "'mirage-py superopt --out DIR'")
    try:
        opt = load(args.result)
    except SerializationError as e:
        raise UsageProblem(f"{args.result}: {e}", "the file must be a saved superopt result") \
            from None
    print(opt.summary())
    if args.out:
        from .ugraph.dot import render
        stem = os.path.join(args.out, opt.program.name)
        render(opt.graph, stem + ".dot")
        print(f"wrote {stem}.dot")
    return EXIT_OK


def cmd_bench(args, rest: list[str]) -> int:
    from .examples import bench
    try:
        return bench.main(rest)
    except OSError as e:  # the output directory
        raise UsageProblem(f"cannot write the results: {e}",
                           "choose a directory you can write to with --out DIR") from None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="mirage-py", description="A multi-level superoptimizer for GPU tensor programs.",
        epilog="Exit codes: 0 ok, 1 the work failed, 2 bad input. --debug shows tracebacks.")
    ap.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def common(p):
        p.add_argument("--target", default="h100", help="GPU to optimise for: a100, h100, h200 "
                       "(default h100)")
        p.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                       help="stop searching after this long and keep the best found so far")
        p.add_argument("--workers", type=int, default=None,
                       help="search processes (default: all cores)")
        p.add_argument("--out", default=None, metavar="DIR",
                       help="write the result (.json), its μGraph picture (.dot/.svg) and the "
                            "CUDA export into DIR")
        p.add_argument("--database", default=None, metavar="PATH",
                       help="results database to reuse and record into (default: "
                            "$MIRAGE_PY_DATABASE, else ~/.cache/mirage_py/results.sqlite)")
        p.add_argument("--ray", default=None, metavar="ADDRESS",
                       help="run searches and measurements as tasks of the Ray cluster at "
                            "ADDRESS (auto, HOST:6379, ray://HOST:10001, local); needs "
                            "mirage_py[ray], see docs/cluster.md")

    d = sub.add_parser("demo", help="superoptimise a built-in benchmark program and print it")
    d.add_argument("name", nargs="?", default="rmsnorm_linear",
                   help="benchmark name (default rmsnorm_linear)")
    d.add_argument("--bs", type=int, default=1, help="batch size (default 1)")
    common(d)
    s = sub.add_parser("superopt", help="superoptimise the Program(s) defined in a Python file")
    s.add_argument("file", help="a .py file that builds mirage_py Program objects")
    s.add_argument("--program", default=None, help="only the Program with this name")
    common(s)
    sh = sub.add_parser("show", help="print the summary of a saved result")
    sh.add_argument("result", help="RESULT.json written by superopt --out")
    sh.add_argument("--out", default=None, metavar="DIR", help="also write its picture to DIR")
    sub.add_parser("bench", help="run the benchmark suite (options: see 'mirage-py bench -h')",
                   add_help=False)
    return ap


def main(argv: list[str] | None = None) -> int:
    """The command line; its exit code. Ctrl-C at any moment gives 130 (``_Interrupts``).
    Called as the program (``argv`` None) the handler that only notes a late Ctrl-C stays
    until the process exits; called with ``argv`` (tests, notebooks), Python's comes back."""
    ctrl_c = _Interrupts()
    try:
        with ctrl_c:
            code = _main(argv)
    finally:
        if argv is not None:
            ctrl_c.release()
    return EXIT_INTERRUPTED if ctrl_c.seen else code


class _Interrupts:
    """Ctrl-C for the command line, the same whenever it comes: while the work runs it raises
    ``KeyboardInterrupt`` there, as Python's handler does (superopt answers with what is
    verified, or the command stops), and the exit code is 130; once the work is done it is
    only noted, and the process exits with the command's code -- never by the signal itself. (With Python's own handler, a SIGINT landing after the
    answer was printed, while the interpreter wound down, escaped the command and the process
    died by the signal, -2.) Only in the main thread, where signal handlers run."""

    def __init__(self) -> None:
        self.seen = False
        self.armed = True
        self.old = None

    def __enter__(self) -> "_Interrupts":
        import signal
        import threading
        if threading.current_thread() is threading.main_thread():
            self.old = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def _on_sigint(self, signum, frame) -> None:
        self.seen = True
        if self.armed:
            raise KeyboardInterrupt

    def __exit__(self, *exc) -> bool:
        self.armed = False  # from here on a SIGINT is only noted
        if isinstance(exc[1], KeyboardInterrupt):  # it escaped the command's own handling
            self.seen = True
            print("mirage-py: interrupted", file=sys.stderr)
            return True
        return False

    def release(self) -> None:
        """The handler there was before (in-process callers: tests, notebooks)."""
        import signal
        if self.old is not None:
            signal.signal(signal.SIGINT, self.old)
            self.old = None


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = build_parser()
    debug = "--debug" in argv
    if "bench" in argv and argv[argv.index("bench") - 1:argv.index("bench")] != ["--out"]:
        i = argv.index("bench")
        args, rest = ap.parse_args(argv[:i + 1]), argv[i + 1:]
    else:
        args, rest = ap.parse_args(argv), []
    try:
        if hasattr(args, "target") and args.cmd != "show":
            args.target = _check_target(args.target)
        if getattr(args, "out", None):
            args.out = _out_dir(args.out)
        if args.cmd == "demo":
            return cmd_demo(args)
        if args.cmd == "superopt":
            return cmd_superopt(args)
        if args.cmd == "show":
            return cmd_show(args)
        return cmd_bench(args, rest)
    except UsageProblem as e:
        if debug:
            traceback.print_exc()
        print(f"mirage-py: error: {e}", file=sys.stderr)
        if e.hint:
            print(f"hint: {e.hint}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        print("mirage-py: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # a MirageError from the user's program, or a bug
        from .errors import MirageError
        if debug:
            traceback.print_exc()
        print(f"mirage-py: error: {type(e).__name__}: {e}", file=sys.stderr)
        if isinstance(e, MirageError):
            print("hint: the message names the operator and shapes involved", file=sys.stderr)
            return EXIT_INPUT
        print("hint: rerun with --debug for the traceback, and report it", file=sys.stderr)
        return EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
