"""The package works without the repository: the example programs (the nine benchmarks, the
hand-built fixtures, the benchmark runner) ship inside ``mirage_py.examples``, a wheel built from
the sources holds every module and the package data, and ``mirage-py demo`` / ``mirage-py bench``
run from a temporary directory after a non-editable install into a fresh virtual environment.

The wheel is built with ``pip wheel --no-build-isolation`` (nothing is downloaded) from a copy
of ``pyproject.toml``, ``README.md`` and ``mirage_py/``, so no build output lands in the checkout.
The fresh environment gets the wheel by ``pip --python ... install --no-deps --no-index``; its
dependencies (NumPy, SciPy, z3, ...) come from this interpreter's site-packages through a
``.pth`` file, which adds the directory without running that directory's own ``.pth`` files (so
an editable install of the checkout there stays invisible)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "mirage_py"


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(extra)
    return env


def _run(cmd, cwd, env, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_cli_finds_the_examples_without_the_checkout(tmp_path):
    """Only the package on the path (a link to mirage_py/, no benchmarks/): the CLI's programs,
    the fixtures and the runner all import, and the demo's program builds."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "mirage_py").symlink_to(PKG, target_is_directory=True)
    code = (
        "import importlib.util, mirage_py\n"
        f"assert mirage_py.__file__.startswith({str(site)!r}), mirage_py.__file__\n"
        "assert importlib.util.find_spec('benchmarks') is None\n"
        "from mirage_py.cli import _benchmarks\n"
        "from mirage_py.examples import bench, fixtures, torch_baselines\n"
        "programs = _benchmarks()\n"
        "assert len(programs.NAMES) == 9\n"
        "p = programs.get_program('rmsnorm_linear', 1)\n"
        "assert fixtures.hand_built('lora', 1).num_kernels == 1\n"
        "print('ok', p.name)\n")
    r = _run([sys.executable, "-c", code], tmp_path, _env(PYTHONPATH=str(site)))
    assert r.returncode == 0, r.stderr
    assert "ok rmsnorm_linear" in r.stdout


def test_benchmarks_modules_reexport_the_package():
    """benchmarks/programs.py, fixtures.py, torch_baselines.py and run.py stay importable for
    existing code and hand out the package's objects."""
    from benchmarks import fixtures, programs, run, torch_baselines
    from mirage_py import examples
    from mirage_py.examples import bench
    from mirage_py.examples import fixtures as pkg_fixtures
    from mirage_py.examples import torch_baselines as pkg_tb

    assert programs.get_program is examples.get_program and programs.NAMES == examples.NAMES
    assert fixtures.hand_built is pkg_fixtures.hand_built
    assert torch_baselines.torch_fn is pkg_tb.torch_fn
    assert run.run_one is bench.run_one
    assert run.RESULTS == str(ROOT / "benchmarks" / "results")


def _setuptools_ok() -> bool:
    try:
        import setuptools
    except ImportError:
        return False
    return int(setuptools.__version__.split(".")[0]) >= 77  # pyproject's build requirement


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    if not _setuptools_ok():
        pytest.skip("setuptools >= 77 is not installed here: the wheel cannot be built offline")
    src = tmp_path_factory.mktemp("src")
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copy(ROOT / "README.md", src)
    shutil.copytree(PKG, src / "mirage_py", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path_factory.mktemp("dist")
    r = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
              "--no-index", "--no-cache-dir", "-w", dist, src], src, _env())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    wheels = list(dist.glob("mirage_py-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_holds_every_module_the_examples_and_package_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    want = {p.relative_to(ROOT).as_posix() for p in PKG.rglob("*.py")
            if "__pycache__" not in p.parts}
    assert want - names == set(), sorted(want - names)
    for f in ("mirage_py/examples/programs.py", "mirage_py/examples/fixtures.py",
              "mirage_py/examples/bench.py", "mirage_py/examples/torch_baselines.py",
              "mirage_py/codegen_cuda/emulator.h", "mirage_py/codegen_cuda/prelude.cuh"):
        assert f in names, f
    assert not any(n.startswith(("benchmarks/", "tests/")) for n in names)
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "mirage-py = mirage_py.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel installed (not editable)."""
    venv = tmp_path_factory.mktemp("venv")
    r = _run([sys.executable, "-m", "venv", "--without-pip", venv], venv, _env())
    assert r.returncode == 0, r.stderr
    py = venv / "bin" / "python"
    r = _run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps",
              "--no-index", "--no-cache-dir", wheel], venv, _env())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    site = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], venv,
                _env()).stdout.strip()
    # the dependencies: this interpreter's site-packages, after the venv's own
    Path(site, "_mirage_py_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def test_installed_package_runs_demo_and_bench_from_any_directory(installed, tmp_path):
    bindir = installed / "bin"
    env = _env(MIRAGE_PY_DATABASE=str(tmp_path / "results.sqlite"))
    work = tmp_path / "elsewhere"
    work.mkdir()
    r = _run([bindir / "python", "-c", "import mirage_py, importlib.util; "
              "print(mirage_py.__file__, importlib.util.find_spec('benchmarks'))"], work, env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(str(installed)) and r.stdout.split()[-1] == "None", r.stdout

    r = _run([bindir / "mirage-py", "demo", "lora", "--workers", "1"], work, env)
    assert r.returncode == 0, r.stderr
    assert "program lora" in r.stdout and "kernels: 4 naive -> 1" in r.stdout
    assert "relative error" in r.stdout

    r = _run([bindir / "mirage-py", "bench", "--names", "lora", "--bs", "1", "--workers", "1",
              "--no-check", "--out", "res"], work, env)
    assert r.returncode == 0, r.stderr
    assert "lora" in r.stdout and "4 -> 1" in r.stdout
    written = sorted(p.suffix for p in (work / "res").iterdir())
    assert ".json" in written and ".md" in written, written


def test_bench_bad_output_directory_is_bad_input(tmp_path):
    """An output directory that cannot be made is reported before any search, exit code 2."""
    (tmp_path / "file").write_text("")
    r = _run([sys.executable, "-m", "mirage_py", "bench", "--names", "lora", "--bs", "1",
              "--out", tmp_path / "file" / "sub"], tmp_path, _env(PYTHONPATH=str(ROOT)))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "cannot write the results" in r.stderr and "hint:" in r.stderr
    assert "Traceback" not in r.stderr and "lora" not in r.stdout


def _names(specs: list[str]) -> set[str]:
    import re
    return {re.split(r"[<>=!~;\[ ]", s, maxsplit=1)[0].lower() for s in specs}


def test_runtime_dependencies_are_what_the_package_imports():
    """Every runtime dependency is imported by the package; the tests' oracles (sympy, galois)
    and the optional z3 solver are extras, and the package never imports sympy or galois (z3
    only where its extra is asked for). The version comes from the leaf module."""
    import re
    import tomllib
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["dynamic"] == ["version"] and "version" not in meta
    modules = {"numpy": "numpy", "networkx": "networkx", "scipy": "scipy", "tqdm": "tqdm"}
    assert _names(meta["dependencies"]) == set(modules)
    src = "\n".join(p.read_text() for p in PKG.rglob("*.py"))
    for dep, mod in modules.items():
        assert re.search(rf"^\s*(import|from) {mod}\b", src, re.M), dep
    extras = meta["optional-dependencies"]
    assert {"sympy", "galois", "z3-solver"} <= _names(extras["test"])
    assert _names(extras["z3"]) == {"z3-solver"}
    assert not re.search(r"^\s*(import|from) (sympy|galois)\b", src, re.M)
    z3_users = {p.relative_to(PKG).as_posix() for p in PKG.rglob("*.py")
                if re.search(r"^\s*import z3\b", p.read_text(), re.M)}
    assert z3_users == {"generator/oracle_z3.py", "regions/cover.py"}, z3_users


def test_every_class_name_is_defined_once():
    """One name, one class: ``Candidate``, ``Context``, ``Names``, ``CompiledGraph`` and
    ``UnsupportedOperatorError`` were each defined twice (cover and search candidates, two
    translation contexts, ...); a reader of a traceback or an import could take one for the
    other."""
    import ast
    where: dict[str, list[str]] = {}
    for p in sorted(PKG.rglob("*.py")):
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(p.relative_to(PKG).as_posix())
    twice = {name: files for name, files in where.items() if len(files) > 1}
    assert not twice, twice
