"""superopt on a Ray cluster (docs/cluster.md): a local Ray instance with 2 CPUs and one
pretend GPU of type h200 (``num_gpus=1``, resource ``gpu_h200``: Ray checks resources, not
hardware), shared by the module and shut down at its end. Skipped cleanly without Ray, except
the tests that need none (option errors, ``import mirage_py`` without Ray)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import mirage_py as mp
from benchmarks.compositions import decoder_block, mlp_block, residual_norm_linears
from benchmarks.programs import NAMES, get_program
from mirage_py.errors import OptionError
from mirage_py.superopt.executors import ClusterError, LocalExecutor, RayExecutor, gpu_resource
from mirage_py.tuning.database import ResultsDB
from mirage_py.tuning.runners import FakeRunner

try:
    import ray
except ImportError:  # the tests below that need a cluster skip
    ray = None

SAMPLE = ("lora", "gated_mlp", "rmsnorm_linear")  # fast; the other six are marked slow


@pytest.fixture(scope="module")
def cluster():
    if ray is None:
        pytest.skip("ray is not installed (pip install 'mirage_py[ray]')")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, num_gpus=1, resources={"gpu_h200": 1}, include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def same_answer(a, b) -> None:
    """Two OptimizedPrograms give the same answer: graph, stages, predicted time, the pieces of
    every part's cover, verification."""
    assert a.graph.structural_hash() == b.graph.structural_hash()
    assert a.estimated_time_us == b.estimated_time_us
    for pa, pb in zip(a.parts, b.parts, strict=True):
        assert pa.stages == pb.stages
        assert [(x.kind, x.estimated_us, x.kernels) for x in pa.pieces] == \
            [(x.kind, x.estimated_us, x.kernels) for x in pb.pieces]
        assert pa.searched == pb.searched and pa.measured_us == pb.measured_us
    for va, vb in zip(a.verification, b.verification, strict=True):
        assert va.equivalent and vb.equivalent and va.bound == vb.bound


def rows(path) -> list:
    """The database's records as comparable rows (ids and timestamps left out)."""
    with ResultsDB(path) as db:
        return sorted((r.workload_hash, r.target, r.graph_hash, str(r.annotations),
                       r.predicted_us, r.measured_us, r.chosen) for r in db.records())


# ---- without a cluster ----------------------------------------------------------------------

@pytest.mark.parametrize("kw, match", [
    ({"executor": "dask"}, "executor"), ({"executor": 3}, "executor"),
    ({"executor": LocalExecutor}, "executor")])
def test_bad_executor_raises_option_error(kw, match):
    p = mp.Program("p")
    x = p.input("x", (4, 8))
    p.output(x * 2.0)
    with pytest.raises(OptionError, match=match):
        mp.superopt(p, progress=False, database=False, **kw)


@pytest.mark.parametrize("kw", [{"max_retries": -1}, {"max_retries": 1.5},
                                {"measure_timeout_s": 0}, {"address": ""},
                                {"gpu_resource": ""}, {"measure_cpus": -1},
                                {"init_kwargs": "num_cpus=2"}, {"on_task": 3}])
def test_bad_ray_options_raise_option_error(kw):
    with pytest.raises(OptionError, match=list(kw)[0]):
        RayExecutor(**kw)


def test_mirage_py_imports_and_says_what_to_install_without_ray():
    code = ("import sys; sys.modules['ray'] = None\n"  # as if Ray were not installed
            "import mirage_py as mp\n"
            "p = mp.Program('p'); x = p.input('x', (4, 8)); p.output(x * 2.0)\n"
            "try:\n    mp.superopt(p, executor='ray', database=False)\n"
            "except mp.OptionError as e:\n    print('OptionError:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    assert "OptionError:" in out.stdout and "mirage_py[ray]" in out.stdout


def test_measurement_request_names_the_targets_gpu():
    ex = RayExecutor()
    assert gpu_resource(mp.superopt.__globals__["get_target"]("h100")) == "gpu_h100"
    req = ex.gpu_request(mp.superopt.__globals__["get_target"]("a100"))
    assert req == {"num_gpus": 1, "num_cpus": 1, "resources": {"gpu_a100": 1}}
    assert RayExecutor(gpu_resource="A100_80GB").gpu_request("a100")["resources"] == \
        {"A100_80GB": 1}


# ---- same answers as local processes ----------------------------------------------------------

@pytest.mark.parametrize("name", [n if n in SAMPLE else pytest.param(n, marks=pytest.mark.slow)
                                  for n in NAMES])
def test_benchmarks_same_answer_as_local(cluster, superopt_bs1, name):
    local = superopt_bs1(name)  # local processes, workers=2
    on_ray = mp.superopt(get_program(name, 1), target="h100", executor="ray", progress=False,
                         database=False)
    same_answer(on_ray, local)


def test_multi_region_program_same_answer_as_local(cluster):
    """A decoder block: dozens of regions, 27 of them searched, as Ray tasks two at a time --
    and one at a time (workers=1): the answer never depends on how many run at once."""
    comp = decoder_block(b=1, kv=64, d=128, heads=2, f=128)
    local = mp.superopt(comp.program, workers=2, progress=False, database=False)
    ex = RayExecutor()
    on_ray = mp.superopt(comp.program, executor=ex, progress=False, database=False)
    assert local.parts[0].searched > 20
    same_answer(on_ray, local)
    assert sum(e["kind"] == "explore" for e in ex.log) == local.parts[0].searched
    # sub-regions are tuned by tasks of their own, only those the cover wanted
    assert 0 < sum(e["kind"] == "tune" for e in ex.log) < local.parts[0].searched
    assert any(e["kind"] == "verify" for e in ex.log)
    assert len({e["pid"] for e in ex.log}) >= 2  # more than one worker process did the work


@pytest.mark.slow
def test_decoder_block_one_worker_same_answer(cluster):
    """A decoder block of 8 tokens searched by one Ray task at a time: the answer of two local
    processes (one at a time, nothing is searched speculatively, so fewer regions may be)."""
    comp = decoder_block(b=8, kv=64, d=128, heads=2, f=128)
    local = mp.superopt(comp.program, workers=2, progress=False, database=False)
    one = mp.superopt(comp.program, executor="ray", workers=1, progress=False, database=False)
    assert one.graph.structural_hash() == local.graph.structural_hash()
    assert one.estimated_time_us == local.estimated_time_us
    assert [(x.kind, x.estimated_us) for x in one.parts[0].pieces] == \
        [(x.kind, x.estimated_us) for x in local.parts[0].pieces]


# ---- faults, interrupts, the database -----------------------------------------------------

def test_killed_worker_loses_only_its_task_and_the_database_holds_each_record_once(
        cluster, tmp_path):
    """A Ray worker process is killed (SIGKILL, from here) in the middle of a region search,
    after the search found its first candidate; Ray runs that search again elsewhere, the answer
    is the local one, and the driver -- the only writer -- stores every record once: the same
    rows as a local run. A second run on the same file reuses it without any search task."""
    comp = residual_norm_linears(np.random.default_rng(0), b=2, d=128, n=128)
    victim = tmp_path / "victim"
    starts = tmp_path / "starts"
    starts.mkdir()

    def hook(event, name):  # runs inside the Ray workers
        import os
        import time
        if event == "explore":
            (starts / f"{os.getpid()}-{time.time_ns()}").write_text(name)
        elif event == "candidate":
            try:
                fd = os.open(victim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return
            os.write(fd, f"{os.getpid()} {name}".encode())
            os.close(fd)
            time.sleep(120)  # killed in here, mid-search

    killed = []

    def killer():
        end = time.time() + 300
        while time.time() < end and not killed:
            try:
                pid, name = victim.read_text().split(" ", 1)
            except (OSError, ValueError):
                time.sleep(0.05)
                continue
            os.kill(int(pid), signal.SIGKILL)
            killed.append((int(pid), name))

    th = threading.Thread(target=killer, daemon=True)
    th.start()
    ex = RayExecutor(on_task=hook, max_retries=3)
    path = tmp_path / "ray.sqlite"
    opt = mp.superopt(comp.program, executor=ex, progress=False, database=path)
    th.join(5)
    assert killed, "no worker was killed"
    pid, name = killed[0]
    ran = [f.read_text() for f in starts.iterdir()]
    assert ran.count(name) >= 2  # the killed search ran again
    assert pid not in {e["pid"] for e in ex.log}  # the killed process delivered nothing
    assert name in {e["name"] for e in ex.log if e["kind"] == "explore"}  # its retry did

    local_path = tmp_path / "local.sqlite"
    local = mp.superopt(comp.program, workers=2, progress=False, database=local_path)
    same_answer(opt, local)
    got = rows(path)
    assert got == rows(local_path) and len(got) > 10
    assert len(set(got)) == len(got)  # every record once

    # the second run answers from the database; it searches again only the regions whose
    # search found nothing verified before (no answer stored), as a second local run does
    again_ex = RayExecutor()
    again = mp.superopt(comp.program, executor=again_ex, progress=False, database=path)
    local_again = mp.superopt(comp.program, workers=2, progress=False, database=local_path)
    same_answer(again, local_again)
    assert again.parts[0].source == local_again.parts[0].source == "database"
    first = sum(e["kind"] == "explore" for e in ex.log)
    assert sum(e["kind"] == "explore" for e in again_ex.log) < first
    assert rows(path) == rows(local_path)


def test_interrupt_keeps_what_arrived(cluster, monkeypatch):
    """Ctrl-C on the driver while region searches run on the cluster (raised where the driver
    waits, once the first search has come back): what arrived is kept, the searches still
    running are cancelled and leave the cover, the answer is verified and right."""
    ex_mod = sys.modules["mirage_py.superopt.cluster"]
    real = ex_mod._receive
    arrived = []

    def ctrl_c(refs, timeout):
        if arrived:
            raise KeyboardInterrupt
        ready = real(refs, 60.0)
        arrived.extend(ready)
        return ready
    monkeypatch.setattr(ex_mod, "_receive", ctrl_c)
    comp = mlp_block(None, b=4, d=128, f=256)
    opt = mp.superopt(comp.program, executor="ray", progress=False, database=False)
    part = opt.parts[0]
    assert len(arrived) == 1 and part.stats.interrupted and part.searched == 1
    assert all(v.equivalent and v.bound <= 1e-9 for v in opt.verification)
    xs = comp.inputs(2)
    ref, got = comp.reference(xs), opt.run_numpy(xs, precision="float64")
    np.testing.assert_allclose(got["y"], ref["y"], rtol=1e-9, atol=1e-9 * np.abs(ref["y"]).max())
    assert opt.estimated_time_us <= part.floor_us


def test_measurements_run_on_the_targets_gpu(cluster):
    """A measuring runner (the FakeRunner standing in for a GPU) runs in tasks that got one GPU
    and one unit of ``gpu_h200`` from Ray; the answer, measured times included, is the local
    one."""
    p = get_program("lora", 1)
    local = mp.superopt(p, target="h200", runner=FakeRunner(), workers=2, progress=False,
                        database=False)
    ex = RayExecutor()
    on_ray = mp.superopt(p, target="h200", runner=FakeRunner(), executor=ex, progress=False,
                         database=False)
    same_answer(on_ray, local)
    assert on_ray.parts[0].measured_us is not None
    ms = [e for e in ex.log if e["kind"] == "measure"]
    assert ms and all(e["resources"].get("GPU") == 1 and e["resources"].get("gpu_h200") == 1
                      for e in ms)
    assert all("GPU" not in e["resources"] for e in ex.log if e["kind"] != "measure")


def test_default_runner_follows_the_clusters_gpus(cluster):
    from mirage_py.tuning.runners import GpuRunner, ModelRunner
    ex = RayExecutor()
    ex.start("h200")
    h200, h100 = (mp.superopt.__globals__["get_target"](t) for t in ("h200", "h100"))
    assert isinstance(ex.default_runner(None, h200), GpuRunner)
    assert isinstance(ex.default_runner(None, h100), ModelRunner)
    assert ex.default_workers() == 2


def test_missing_gpu_type_is_reported_not_waited_for(cluster):
    p = mp.Program("p")
    x = p.input("x", (4, 8))
    p.output(x * 2.0)
    t0 = time.perf_counter()
    with pytest.raises(ClusterError, match="gpu_a100.*ray start"):
        mp.superopt(p, target="a100", runner=FakeRunner(), executor="ray", progress=False,
                    database=False)
    assert time.perf_counter() - t0 < 30


def test_measurements_that_never_finish_time_out(cluster):
    def hang(event, name):
        import time
        if event == "measure":
            time.sleep(60)
    p = mp.Program("p")
    x = p.input("x", (4, 64))
    w = p.input("w", (64, 64))
    p.output(mp.exp(x) @ w)
    with pytest.raises(ClusterError, match="no GPU measurement finished in 2 s"):
        mp.superopt(p, target="h200", runner=FakeRunner(), progress=False, database=False,
                    executor=RayExecutor(on_task=hang, measure_timeout_s=2))


def test_database_ships_as_a_snapshot_and_merges_each_record_once(tmp_path):
    """The database story of docs/cluster.md without a cluster: a snapshot of the driver's file,
    used on another machine, answers from it; merging it into that machine's own file adds each
    record once (a second merge adds nothing)."""
    def program(n):
        p = mp.Program(f"p{n}")
        x = p.input("x", (4, 64))
        w = p.input("w", (64, n))
        p.output(mp.rms_norm(x) @ w, name="y")
        return p
    first, other = tmp_path / "driver.sqlite", tmp_path / "elsewhere.sqlite"
    a = mp.superopt(program(32), workers=1, progress=False, database=first)
    mp.superopt(program(48), workers=1, progress=False, database=other)
    with ResultsDB(first) as db:
        copy = db.snapshot(tmp_path / "ship" / "copy.sqlite")
        with pytest.raises(mp.DatabaseError, match="exists"):
            db.snapshot(copy)
    assert rows(copy) == rows(first)
    again = mp.superopt(program(32), workers=1, progress=False, database=copy)
    assert again.parts[0].source == "database"
    assert again.graph.structural_hash() == a.graph.structural_hash()
    before = rows(other)
    with ResultsDB(first) as db:
        kept = db._kept_rows()
        db.keep_capture("a torch capture", b"graph", b"constants")  # frontend_torch's graphs
    assert kept  # the whole program's answer and its completed searches
    with ResultsDB(other) as db:
        new = [k for k in kept if db.kept(*k[:4]) is None]  # a shared piece may be there
        assert new
        assert db.merge(first) == len(rows(first)) + len(new) + 1
        assert db.merge(copy) == 0 and db.merge(str(first)) == 0
        assert db.capture("a torch capture") == (b"graph", b"constants")
        assert all(db.kept(h, t, k, kind) is not None for h, t, k, kind, _, _ in kept)
    assert rows(other) == sorted(before + rows(first))
    third = mp.superopt(program(32), workers=1, progress=False, database=other)
    assert third.parts[0].source == "database"
    assert third.origin == "database"  # the kept whole-program answer: nothing covered again


def test_cli_ray_flag(cluster, capsys, tmp_path):
    """``mirage-py demo --ray ADDRESS``: the same run on the cluster this process is connected
    to (the address is used only when it is not connected yet); a bad address is bad input."""
    from mirage_py.cli import main
    assert main(["demo", "lora", "--ray", "auto", "--database", str(tmp_path / "r.sqlite")]) == 0
    assert "lora" in capsys.readouterr().out
    assert main(["demo", "lora", "--ray", " "]) == 2
    assert "address" in capsys.readouterr().err


def test_torch_compile_passes_the_executor_through(cluster):
    """``mp.compile(..., executor=...)`` hands the executor to superopt: the regions of a
    PyTorch module are searched as Ray tasks, and the compiled module computes what it did."""
    torch = pytest.importorskip("torch")

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(64, 32, generator=torch.Generator()
                                                    .manual_seed(0)) / 8)

        def forward(self, x):
            return torch.nn.functional.silu(x @ self.w)
    m, x = Block(), torch.randn(4, 64, generator=torch.Generator().manual_seed(1))
    ex = RayExecutor()
    cm = mp.compile(m, (x,), executor=ex, database=False, progress=False)
    assert any(e["kind"] == "explore" for e in ex.log)
    with torch.no_grad():  # (with grad mode on the compiled module would run eagerly)
        torch.testing.assert_close(cm(x), m(x), rtol=2e-2, atol=2e-2)
