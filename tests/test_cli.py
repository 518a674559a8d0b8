"""The mirage-py command line, driven as a user would (subprocesses)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(*args, cwd=None, timeout=600):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "mirage_py", *args], capture_output=True,
                          text=True, cwd=cwd or ROOT, env=env, timeout=timeout)


PROGRAM = '''
import mirage_py as mp
p = mp.Program("small_norm_linear")
X = p.input("X", (8, 256))
W = p.input("W", (256, 512))
p.output(mp.rms_norm(X) @ W, name="Y")
'''


@pytest.fixture
def program_file(tmp_path):
    f = tmp_path / "prog.py"
    f.write_text(PROGRAM)
    return f


def test_help_explains_every_subcommand():
    r = cli("--help")
    assert r.returncode == 0
    for word in ("demo", "superopt", "show", "bench", "Exit codes"):
        assert word in r.stdout
    r = cli("superopt", "--help")
    for opt in ("--target", "--time-budget", "--out", "--workers"):
        assert opt in r.stdout


def test_superopt_happy_path_and_show(program_file, tmp_path):
    out = tmp_path / "out"
    r = cli("superopt", str(program_file), "--out", str(out), "--workers", "1")
    assert r.returncode == 0, r.stderr
    assert "kernels: 7 naive -> 1" in r.stdout
    assert "verified" in r.stdout
    saved = out / "small_norm_linear.json"
    assert saved.exists() and (out / "small_norm_linear.dot").exists()
    assert json.loads(saved.read_text())["format"] == "mirage_py.optimized"
    r = cli("show", str(saved))
    assert r.returncode == 0, r.stderr
    assert "small_norm_linear" in r.stdout and "naive -> 1" in r.stdout


def test_demo_runs():
    r = cli("demo", "lora", "--workers", "1")
    assert r.returncode == 0, r.stderr
    assert "program lora" in r.stdout and "kernels: 4 naive -> 1" in r.stdout
    assert "relative error" in r.stdout


@pytest.mark.parametrize("args,needle", [
    (("superopt", "/no/such/file.py"), "no such file"),
    (("show", "/no/such/result.json"), "no such file"),
    (("demo", "nonexistent"), "unknown benchmark"),
])
def test_errors_are_one_line_with_a_hint(args, needle):
    r = cli(*args)
    assert r.returncode == 2
    assert needle in r.stderr and "hint:" in r.stderr
    assert "Traceback" not in r.stderr


def test_file_without_program(tmp_path):
    f = tmp_path / "empty.py"
    f.write_text("x = 1\n")
    r = cli("superopt", str(f))
    assert r.returncode == 2 and "defines no mirage_py Program" in r.stderr


def test_unknown_target(program_file):
    r = cli("superopt", str(program_file), "--target", "tpu9")
    assert r.returncode == 2 and "unknown target" in r.stderr and "h100" in r.stderr


def test_unwritable_output_directory(program_file, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    target = ro / "sub"
    r = cli("superopt", str(program_file), "--out", str(target))
    if os.geteuid() == 0:  # root can write anywhere; use a path under a file instead
        blocker = tmp_path / "afile"
        blocker.write_text("")
        r = cli("superopt", str(program_file), "--out", str(blocker / "sub"))
    assert r.returncode == 2 and "output directory" in r.stderr


def test_program_error_in_user_file(tmp_path):
    f = tmp_path / "bad.py"
    f.write_text("import mirage_py as mp\np = mp.Program('b')\nA = p.input('A', (2, 3))\n"
                 "B = p.input('B', (4, 5))\np.output(A @ B)\n")
    r = cli("superopt", str(f))
    assert r.returncode == 2
    assert "matmul" in r.stderr and "(2, 3)" in r.stderr and "Traceback" not in r.stderr
    r = cli("--debug", "superopt", str(f))
    assert "Traceback" in r.stderr
