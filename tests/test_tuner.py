"""The annotation tuner, the task scheduler and the runners, with the model runner and test
doubles (random cost model, fake runner, fake tasks, fake CuPy)."""

import math
import sys

import numpy as np
import pytest

import mirage_py as mp
from mirage_py.cost_model import DEFAULT_STAGES, AnalyticModel, RandomModel, estimate_us
from mirage_py.generator.kernel_search import Searcher, search
from mirage_py.lax.partition import partition
from mirage_py.superopt import _rank
from mirage_py.targets import get_target
from mirage_py.tuning import (MAX_STAGES, THREAD_CHOICES, AnnotatedGraph, FakeRunner, GpuRunner,
                              ModelRunner, Replayer, Schedule, TaskScheduler, Tuner,
                              default_runner, gpu_present, kendall_tau, make_task,
                              replay_schedule, threads_of)
from mirage_py.tuning import runners as runners_mod

H100 = get_target("h100")


def norm_linear(m=8, k=1024, n=1024):
    p = mp.Program("norm_linear")
    X = p.input("X", (m, k))
    W = p.input("W", (k, n))
    p.output(mp.rms_norm(X) @ W, name="Y")
    return p


@pytest.fixture(scope="module")
def space():
    """(part, searcher, candidates ranked by the analytic model) for a small norm+matmul."""
    part = partition(norm_linear(), uninterpreted=True)[0]
    ranked = _rank(search(part, H100), H100)
    return part, Searcher(part, H100), [c for _, c in ranked]


# ---- the tuner ---------------------------------------------------------------------------

def test_replayer_rebuilds_what_the_searcher_replays(space):
    part, s, cands = space
    rp = Replayer(s)
    for c in cands[:3]:
        assert rp.graph(c.trace).structural_hash() == s.replay(c.trace).structural_hash()
        assert rp.graph(c.trace) is rp.graph(c.trace)  # memoised


def test_tuning_improves_and_never_worsens(space):
    part, s, cands = space
    t = Tuner(Replayer(s), cands[0], AnalyticModel(), H100, seed=0)
    for _ in range(6):
        t.step()
    best = t.best()
    assert best.cost <= t.base_cost
    assert best.cost < 0.9 * t.base_cost  # threads, stages and part counts all matter here
    assert best.cost == min(e.cost for e in t.seen.values())
    assert estimate_us(best.graph, H100) == pytest.approx(best.cost)


def test_tuning_is_deterministic_per_seed(space):
    part, s, cands = space

    def run(seed):
        t = Tuner(Replayer(s), cands[0], AnalyticModel(), H100, seed=seed)
        for _ in range(4):
            t.step()
        return t.best().schedule, sorted(e.schedule.sort_key() for e in t.seen.values())
    assert run(0) == run(0)
    assert run(0)[1] != run(1)[1]


def test_every_schedule_is_valid_and_means_the_same(space):
    part, s, cands = space
    t = Tuner(Replayer(s), cands[0], RandomModel(3), H100, seed=5, population=12)
    for _ in range(5):
        t.step()
    x = part.random_inputs(0)
    ref = part.evaluate(x)["Y"]
    evaluated = [e for e in t.seen.values() if e.graph is not None]
    assert len(evaluated) > 20
    for e in evaluated:
        g = e.graph.graph
        g.validate(H100)
        assert all(th in THREAD_CHOICES or th == 128 for th in threads_of(g))
        assert all(1 <= st <= MAX_STAGES for st in e.graph.stages)
        assert e.cost == RandomModel(3).predict(e.graph, H100)
    for e in t.top(3):  # the best few: verified and run
        assert mp.verify(part, e.graph.graph).equivalent
        np.testing.assert_allclose(e.graph.graph.run(x)["Y"], ref, rtol=1e-9, atol=1e-9)


def test_complete_intermediates_may_be_stored_in_the_program_dtype():
    """exp(X @ A) @ B: the tuner may store exp(X @ A) in float16 (the program's dtype) instead of
    float32; such a graph still verifies and matches the reference in float64."""
    p = mp.Program("exp_mm")
    X = p.input("X", (2, 8, 256), dtype="float16")
    A = p.input("A", (2, 256, 256), dtype="float16")
    B = p.input("B", (2, 256, 256), dtype="float16")
    p.output(mp.exp(X @ A) @ B, name="Y")
    part = partition(p, uninterpreted=True)[0]
    ranked = _rank(search(part, H100), H100)
    two = next(c for _, c in ranked if c.graph.num_kernels == 2)
    t = Tuner(Replayer(Searcher(part, H100)), two, AnalyticModel(), H100, seed=0)
    assert t.low == "float16" and t.base.store == ("float32",)
    for _ in range(4):
        t.step()
    halves = [e for e in t.ranked() if e.schedule.store == ("float16",)]
    assert halves
    e = halves[0]
    inter = [x for x in e.graph.graph.tensors().values()
             if x.name not in e.graph.graph.outputs and x.name not in ("X", "A", "B")]
    assert [x.dtype for x in inter] == ["float16"]
    assert mp.verify(part, e.graph.graph).equivalent
    x = part.random_inputs(0, scale=0.1)
    np.testing.assert_allclose(e.graph.graph.run(x)["Y"], part.evaluate(x)["Y"], rtol=1e-9)
    same = [f for f in t.seen.values() if f.schedule == Schedule(
        e.schedule.trace, e.schedule.threads, e.schedule.stages, ("float32",))]
    for f in same:  # half the round trip of the intermediate
        assert f.graph is None or e.cost < f.cost


def test_schedule_json_round_trip(space):
    part, s, cands = space
    t = Tuner(Replayer(s), cands[0], AnalyticModel(), H100)
    t.step()
    for e in t.seen.values():
        assert Schedule.from_json(e.schedule.to_json()) == e.schedule
    with pytest.raises(mp.SerializationError):
        Schedule.from_json({"trace": "nope"})


def test_annotated_graph_defaults():
    part = partition(norm_linear(), uninterpreted=True)[0]
    g = _rank(search(part, H100), H100)[0][1].graph
    ag = AnnotatedGraph(g)
    assert ag.stages_full() == (DEFAULT_STAGES,) * len(g.graph_kernels()) == (2,)
    assert ag.annotations()["threads"] == list(threads_of(g))


# ---- the task scheduler ------------------------------------------------------------------

class FakeTask:
    """best(round) = floor + span * decay**round; done after ``limit`` rounds."""

    def __init__(self, start, floor, decay, weight=1.0, limit=10**9):
        self.start, self.floor, self.decay, self.weight, self.limit = start, floor, decay, weight, \
            limit
        self.n = 0

    @property
    def best_cost(self):
        return self.floor + (self.start - self.floor) * self.decay ** self.n

    @property
    def done(self):
        return self.n >= self.limit

    def step(self):
        self.n += 1
        return self.best_cost


def test_scheduler_spends_rounds_where_the_gain_is():
    gaining = FakeTask(100, 10, 0.7)  # big, still improving
    flat = FakeTask(100, 99, 0.5)  # converged at once
    log = TaskScheduler([flat, gaining], rounds=20).run()
    assert sum(log.rounds) == 20
    assert log.rounds[1] >= 14 and log.rounds[0] >= 1  # warm-up round for everyone
    assert log.order[:2] == [0, 1]
    assert log.history[1][-1] == gaining.best_cost


def test_scheduler_weights_and_determinism():
    def run():
        a, b = FakeTask(100, 10, 0.8, weight=1.0), FakeTask(100, 10, 0.8, weight=3.0)
        return TaskScheduler([a, b], rounds=16).run()
    log = run()
    assert log.rounds[1] > log.rounds[0]
    assert run().order == log.order


def test_scheduler_stops_on_exhaustion_and_deadline():
    a, b = FakeTask(50, 10, 0.5, limit=2), FakeTask(60, 10, 0.5, limit=3)
    log = TaskScheduler([a, b], rounds=100).run()
    assert log.rounds == [2, 3]
    now = [0.0]

    def clock():
        now[0] += 1.0
        return now[0]
    log = TaskScheduler([FakeTask(100, 1, 0.9), FakeTask(100, 1, 0.9)], deadline=6.5,
                        clock=clock).run()
    assert 1 <= sum(log.rounds) <= 5
    with pytest.raises(ValueError):
        TaskScheduler([a])


def test_scheduler_drives_real_tuning_tasks():
    parts = [partition(norm_linear(8, 512, n), uninterpreted=True)[0] for n in (512, 4096)]
    tasks = []
    for i, part in enumerate(parts):
        ranked = _rank(search(part, H100), H100)
        tasks.append(make_task(f"p{i}", part, H100, [c for _, c in ranked[:2]], AnalyticModel()))
    before = [t.best_cost for t in tasks]
    log = TaskScheduler(tasks, rounds=6).run()
    assert sum(log.rounds) == 6 and min(log.rounds) >= 1
    assert all(t.best_cost <= b for t, b in zip(tasks, before))


# ---- runners --------------------------------------------------------------------------------

def test_model_and_fake_runners():
    part = partition(norm_linear(), uninterpreted=True)[0]
    g = mp.ugraph.naive_lowering(part)
    m = ModelRunner().run(g, "h100")
    assert m.us == estimate_us(g, "h100") and not m.measured and m.ok
    f = FakeRunner(lambda graph, target: 42.0)
    assert f.run(g, "h100").us == 42.0 and f.calls == [g.structural_hash()]
    noisy = FakeRunner().run(AnnotatedGraph(g), "h100")
    assert 0.5 * m.us <= noisy.us < 1.5 * m.us and noisy.measured


def test_default_runner_follows_the_gpu(monkeypatch):
    monkeypatch.setattr(runners_mod, "gpu_present", lambda: False)
    assert isinstance(default_runner(), ModelRunner)
    monkeypatch.setattr(runners_mod, "gpu_present", lambda: True)
    assert isinstance(default_runner(), GpuRunner)


def test_gpu_runner_logic_on_the_cpu_emulator(monkeypatch):
    """The GPU runner's code path (compile, inputs, warm-up, CUDA events, median) on fake CuPy:
    kernels run in the CPU emulator and the events read the wall clock."""
    import time
    import types

    fake_cupy = pytest.importorskip("fake_cupy")  # the codegen's CPU stand-in for CuPy
    cp = fake_cupy.install(monkeypatch)

    class Event:
        def record(self):
            self.t = time.perf_counter()

        def synchronize(self):
            pass

    class RandomState:
        def __init__(self, seed):
            self.rs = np.random.RandomState(seed)

        def standard_normal(self, shape):
            return fake_cupy.asarray(self.rs.standard_normal(shape))

        def randint(self, lo, hi, size):
            return fake_cupy.asarray(self.rs.randint(lo, hi, size=size))
    cp.random = types.SimpleNamespace(RandomState=RandomState)
    cp.cuda.Event = Event
    cp.cuda.get_elapsed_time = lambda a, b: (b.t - a.t) * 1e3
    try:
        from mirage_py.codegen_cuda.emulator import build_emulator_code  # noqa: F401
    except Exception as e:  # pragma: no cover
        pytest.skip(f"emulator unavailable: {e}")
    from ugraph_cases import tiled_matmul
    g, _ = tiled_matmul()
    r = GpuRunner(warmup=1, repeats=3)
    m = r.run(g, "h100")
    if m.error and ("compiler" in m.error.lower() or "ToolMissing" in m.error):
        pytest.skip(m.error)
    assert m.ok, m.error
    assert m.measured and len(m.samples) == 3 and m.us == sorted(m.samples)[1]
    from mirage_py.tuning import with_threads
    bad = r.run(with_threads(g, (33,)), "h100")  # invalid: codegen refuses it
    assert not bad.ok and math.isinf(bad.us)  # errors are recorded, not raised


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_present(), reason="needs CuPy and a CUDA GPU")
def test_gpu_runner_on_a_gpu():  # pragma: no cover - runs only with a GPU
    from benchmarks.fixtures import hand_built
    m = GpuRunner().run(hand_built("lora", 1), "h100")
    assert m.ok and m.us > 0 and len(m.samples) == 20


# ---- superopt with runners and tuning -----------------------------------------------------

def test_superopt_tunes_and_reports_it(tmp_path):
    p = norm_linear()
    tuned = mp.superopt(p, workers=1, progress=False, database=False, runner=ModelRunner())
    untuned = mp.superopt(p, workers=1, progress=False, database=False, tune_rounds=0)
    pt, pu = tuned.parts[0], untuned.parts[0]
    assert pt.tune_rounds == 8 and pt.tune_evaluations > 50
    assert tuned.estimated_time_us < untuned.estimated_time_us
    assert pt.untuned_us is not None and pt.estimated_us <= pt.untuned_us
    # untuned: the generator's own annotations (its trace, kept so a shape family can replay it)
    assert pu.tune_rounds == 0 and pu.stages == (2,) * len(pu.graph.graph_kernels())
    assert pu.schedule is not None and pu.schedule.stages == ()
    assert "tuning:" in tuned.summary() and "stage(s)" in tuned.summary()
    assert tuned.estimated_time_us == pytest.approx(
        estimate_us(AnnotatedGraph(tuned.graph, tuned.stages), "h100"))
    # the saved schedule replays to the same graph (habit 6: search decisions are a trace)
    again = replay_schedule(pt.program, H100, pt.schedule)
    assert again.graph.structural_hash() == pt.graph.structural_hash()
    assert again.stages_full() == pt.stages
    path = tmp_path / "r.json"
    tuned.save(str(path))
    back = mp.load(str(path))
    assert back.stages == tuned.stages and back.parts[0].schedule == pt.schedule
    assert back.estimated_time_us == pytest.approx(tuned.estimated_time_us)


def test_superopt_measures_and_reranks_with_a_measuring_runner():
    """A fake 'GPU' that disagrees with the model: the measured fastest verified option wins."""
    p = norm_linear()
    order = {}

    def fake(graph, target):  # the reverse of the model's order; the naive graph is slowest
        g = graph.graph if isinstance(graph, AnnotatedGraph) else graph
        if not g.graph_kernels():
            return 1e6
        us = AnalyticModel().predict(graph, target)
        order[id(graph)] = us
        return 1000.0 / us
    runner = FakeRunner(fake)
    opt = mp.superopt(p, workers=1, progress=False, database=False, runner=runner,
                      measure_top=3)
    part = opt.parts[0]
    assert len(runner.calls) == 4  # the naive graph and three options
    assert part.measured_us is not None and part.naive_measured_us is not None
    assert part.naive_measured_us == 1e6 and len(order) == 3
    assert part.measured_us == min(1000.0 / us for us in order.values())
    assert part.estimated_us == max(order.values())  # the model's third choice
    assert all(v.equivalent for v in opt.verification)


def test_superopt_with_a_random_cost_model_still_verifies():
    p = norm_linear(8, 256, 256)
    opt = mp.superopt(p, workers=1, progress=False, database=False, cost_model="random")
    assert all(v.equivalent for v in opt.verification)
    x = p.random_inputs(1)
    np.testing.assert_allclose(opt.run_numpy(x, precision="float64")["Y"],
                               p.evaluate(x)["Y"], rtol=1e-9, atol=1e-9)


def test_kendall_tau():
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(2 / 3)
    assert math.isnan(kendall_tau([1, 1], [2, 2]))
    with pytest.raises(ValueError):
        kendall_tau([1], [1, 2])


def test_no_benchmark_names_in_the_tuner():
    """Like the generator: nothing in tuning/ knows which program it is tuning."""
    import pathlib
    from benchmarks.programs import NAMES
    root = pathlib.Path(sys.modules["mirage_py.tuning"].__file__).parent
    text = "".join(f.read_text() for f in root.glob("*.py"))
    for name in NAMES:
        assert name not in text
