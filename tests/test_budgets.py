"""Budgets and Ctrl-C on whole programs (issue #29): a real SIGINT in the API and the command
line answers with the best verified answer so far, marked as interrupted, and what was verified
is in the results database so that running again searches less; a time budget returns about on
time with a verified, correct answer. (The 32-layer 8B-size numbers are
``benchmarks/budgets.py``'s.)"""

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import mirage_py as mp
from benchmarks.compositions import decoder_block
from mirage_py.superopt.local import LocalExecutor
from mirage_py.superopt.structure import Structure

from test_regions import check_answer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class CountingExecutor(LocalExecutor):
    """The default executor, counting the region searches it is given (tunings apart)."""

    def __init__(self):
        self.searches = 0

    def explore(self, jobs, run, **kw):
        self.searches += sum(j.prior is None for j in jobs)
        return super().explore(jobs, run, **kw)


def _sigint_after_first_search_answer(monkeypatch, delay_s: float = 0.1):
    """A real SIGINT to this process ``delay_s`` after the first region answer found by a
    search is verified (wherever the run is then); returns (when it was sent, a stop)."""
    sent, started, done = [], [], threading.Event()
    real = Structure.answered

    def fire():
        if not done.is_set():
            sent.append(time.perf_counter())
            signal.raise_signal(signal.SIGINT)

    def answered(self, result, *, stored=False):
        real(self, result, stored=stored)
        if not stored and result.source == "search" and not started:
            started.append(threading.Timer(delay_s, fire))
            started[0].start()
    monkeypatch.setattr(Structure, "answered", answered)
    return sent, done


def test_sigint_answers_with_the_best_verified_so_far_and_the_rerun_resumes(tmp_path,
                                                                              monkeypatch):
    comp = decoder_block(layers=1)
    db = tmp_path / "r.sqlite"
    fresh = CountingExecutor()
    mp.superopt(comp.program, database=False, workers=2, executor=fresh, progress=False)

    with monkeypatch.context() as m:
        sent, done = _sigint_after_first_search_answer(m, delay_s=0.0)
        try:
            opt = mp.superopt(comp.program, database=db, workers=2, progress=False)
        except KeyboardInterrupt:  # documented too, but this run is past its first answer
            pytest.fail("Ctrl-C after the first verified answer raised KeyboardInterrupt")
        back = time.perf_counter()
        done.set()
    assert sent, "the run ended before the SIGINT"
    assert back - sent[0] < 10  # a sanity bound; benchmarks/budgets.py measures it
    assert opt.interrupted and "interrupted (Ctrl-C)" in opt.summary()
    assert opt.estimated_time_us <= opt.naive_estimated_time_us
    check_answer(opt, comp.reference, comp.inputs(3))

    again = CountingExecutor()
    rerun = mp.superopt(comp.program, database=db, workers=2, executor=again, progress=False)
    assert not rerun.interrupted
    assert again.searches < fresh.searches  # what the interrupted run verified is reused
    check_answer(rerun, comp.reference, comp.inputs(4))


def _kept_rows(db) -> int:
    import sqlite3
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as con:
            return con.execute("SELECT count(*) FROM kept").fetchone()[0]
    except sqlite3.OperationalError:  # the schema is being written
        return 0


def test_sigint_in_the_command_line_prints_the_interrupted_answer(tmp_path):
    """A SIGINT once the floor's first search is kept in the database (the answer exists:
    the naive operators at least) prints the best verified answer, marked, and exits 130."""
    src = tmp_path / "model.py"
    src.write_text("from benchmarks.compositions import decoder_block\n"
                   "p = decoder_block(layers=16).program\n")
    db = tmp_path / "r.sqlite"
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen([sys.executable, "-m", "mirage_py", "superopt", str(src),
                             "--database", str(db)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.perf_counter()
    while not _kept_rows(db) and time.perf_counter() - t0 < 120 and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before the SIGINT"
    sent = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    took = time.perf_counter() - sent
    assert took < 10  # a sanity bound
    assert proc.returncode == 130, (out, err)
    assert "interrupted (Ctrl-C)" in out and "kernels:" in out, (out, err)


def test_a_late_sigint_does_not_kill_the_command_line_by_the_signal():
    """A SIGINT that lands once the command has answered (here: ``show`` of a missing file,
    exit 2), before the process is gone, is noted, not raised: the process exits with the
    command's code instead of dying by the signal (-2), which is what Python's own handler
    does with a KeyboardInterrupt there."""
    code = ("import os, signal, sys; from mirage_py import cli\n"
            "sys.argv = ['mirage-py', 'show', 'no_such_result.json']\n"
            "code = cli.main()\n"
            "os.kill(os.getpid(), signal.SIGINT)\n"
            "for _ in range(100000): pass\n"
            "sys.exit(code)\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 2 and "no such file" in proc.stderr, (proc.stdout, proc.stderr)
    plain = subprocess.run([sys.executable, "-c", code.replace("cli.main()", "2")], cwd=ROOT,
                           capture_output=True, text=True, env=env, timeout=120)
    assert plain.returncode == -signal.SIGINT


def test_a_budget_returns_on_time_with_a_verified_answer():
    """Eight stacked layers take several times this budget unhurried (4.4 s on an idle
    2-core machine, more under load)."""
    comp = decoder_block(layers=8)
    budget = 1.0
    t0 = time.perf_counter()
    opt = mp.superopt(comp.program, database=False, workers=2, progress=False,
                      time_budget_s=budget)
    took = time.perf_counter() - t0
    assert took < budget + 5  # a sanity bound (the budget + max(1 s, 10 %) is measured)
    assert opt.timed_out and not opt.interrupted
    assert "time budget hit" in opt.summary()
    assert opt.estimated_time_us <= opt.naive_estimated_time_us
    check_answer(opt, comp.reference, comp.inputs(5))


def test_a_cut_short_part_keeps_the_cover_whose_assembled_graph_is_cheapest():
    """``keep_verified`` (the budget or Ctrl-C ended the cover with unverified regions wanted)
    picks among the naive operators, the floor and the verified answers by the prediction of
    each assembled graph -- what the answer reports -- not by the cover's summed cost: the floor
    cover's sum overstated above the naive one's, it is still kept, and the answer's predicted
    time is its assembled graph's."""
    from dataclasses import replace
    from test_online_softmax import _run
    from mirage_py.superopt.part import PartCover
    comp = decoder_block(layers=2)
    part = PartCover(comp.program, _run())
    part.lay_floor()
    naive = part._naive_cover()
    floor_us = part._predicted(part.floor_cover, part.floor_what)
    assert floor_us < part._predicted(naive, {})
    part.floor_cover = replace(part.floor_cover, cost=naive.cost + 1.0)  # the sum lies
    part.keep_verified()
    assert part.cover is part.floor_cover
    out = part.answer()
    assert out.estimated_us == pytest.approx(floor_us)
    inputs = comp.inputs(6)
    ref = comp.reference(inputs)
    got = out.graph.run(comp.program.check_inputs(inputs), precision="float64")
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-9, atol=1e-9 * np.abs(ref[k]).max())


@pytest.mark.slow  # 5 s of CPU (11 s under a load of 4)
def test_a_worker_the_tunings_leave_idle_searches_the_next_wanted_structure():
    """Under a budget a round's tunings go with searches of the next structures the cover wants
    when they leave a worker idle (two workers, one tuning: one search beside it), never more
    jobs than workers at once in a round's tuning call; the answer is verified and equals the
    float64 reference."""
    class Recording(LocalExecutor):
        def __init__(self):
            self.calls = []

        def explore(self, jobs, run, **kw):
            self.calls.append([j.prior is not None for j in jobs])
            return super().explore(jobs, run, **kw)
    ex = Recording()
    comp = decoder_block(layers=1)
    opt = mp.superopt(comp.program, database=False, workers=2, progress=False,
                      time_budget_s=300, executor=ex)
    tunings = [c for c in ex.calls if any(c)]
    assert tunings and all(len(c) <= 2 for c in tunings)
    assert any(c.count(True) == 1 and c.count(False) == 1 for c in tunings)
    check_answer(opt, comp.reference, comp.inputs(8))


def test_a_structure_whose_best_check_cannot_end_in_time_checks_its_next_option():
    """Under a budget a tuned structure whose best option's check is guessed not to end in time
    is not left unchecked when one of its next ``CHECK_OPTIONS`` options' can end
    (``PartCover._checkable``: on the 32-layer 8B-size decoder some tuned attention candidates
    verify shrunk in 0.1 s, others only at full size, 8-15 s): that option goes first, is the
    one verified, and the structure's answer computes its region; the best one's check never
    starts. Where none of them can be checked, nothing moves."""
    from test_online_softmax import _run
    from mirage_py.superopt.part import CHECK_OPTIONS, PartCover
    from mirage_py.superopt.structure import Status
    part = PartCover(decoder_block(layers=1).program, _run())
    run = part.run
    st = run.structures[part.search_keys[0]]
    part._explore_all([st])
    part._explore_all([st])  # its deferred tuning
    assert st.status is Status.EXPLORED and st.prior is None and len(st.options) >= 3
    best, second = st.options[0], st.options[1]
    assert best.graph.structural_hash() != second.graph.structural_hash()
    checked = []
    real_verify = run.verifier

    def room_for_check(program=None, known=False, extra_s=0.0, key=None, graph=None):
        return graph is not best.graph  # the best option's check would not end in time

    def verifier(key, program):
        v = real_verify(key, program)
        check = v.check

        def noted(graph, **kw):
            checked.append(graph)
            return check(graph, **kw)
        v.check = noted
        return v
    run.room_for_check, run.verifier = (lambda *a, **kw: False), verifier
    order = list(st.options)
    assert not part._checkable(st) and st.options == order  # none can: nothing moves
    run.room_for_check = room_for_check
    assert part._checkable(st) and st.options[0] is second and best in st.options[1:CHECK_OPTIONS]
    part._verify_all([st])
    assert st.status is Status.VERIFIED and st.result.graph is second.graph
    assert st.result.estimated_us == second.predicted_us
    assert best.graph not in checked and second.graph in checked
    inputs = {t.name: np.random.default_rng(3).standard_normal(t.shape)
              for t in st.program.inputs}
    want = st.program.evaluate(inputs)
    got = st.result.graph.run(inputs, precision="float64")
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-9,
                                   atol=1e-9 * np.abs(want[name]).max())


@pytest.mark.slow  # 6-8 s of CPU (14 s under a load of 7)
def test_a_budget_ending_after_the_first_searched_answer_replays_it_to_every_layer(monkeypatch):
    """Good early (issue #29): under a budget the searches go one per worker, the most they can
    save per second of their check first, and what a round finds is checked before the next
    round searches. When the budget ends right after the first searched structure is verified,
    the answer already uses it at every layer (identical layers are one structure), is cheaper
    than the floor's cover, and equals the float64 reference."""
    from mirage_py.superopt.part import PartCover
    layers = 2
    comp = decoder_block(layers=layers)
    real = PartCover._first_verified
    first = []

    def budget_ends_after_the_first(self, st, options, source, *a, **kw):
        res = real(self, st, options, source, *a, **kw)
        if res is not None and source == "search" and not first:
            first.append(st.key)
            self.run.deadline = self.run.search_deadline = time.perf_counter()
        return res
    monkeypatch.setattr(PartCover, "_first_verified", budget_ends_after_the_first)
    opt = mp.superopt(comp.program, database=False, workers=1, progress=False,
                      time_budget_s=600)
    assert first and opt.timed_out
    (part,) = opt.parts
    searched = [pc for pc in part.pieces if pc.kind == "region" and
                pc.result.program.structural_hash() == first[0]]
    assert len(searched) == layers  # the one verified search answer, at every layer
    assert opt.estimated_time_us < part.floor_us < opt.naive_estimated_time_us
    check_answer(opt, comp.reference, comp.inputs(7))


def test_a_ctrl_c_in_the_floor_keeps_the_groups_laid_so_far(monkeypatch):
    """Ctrl-C while the floor is being laid: the answer is the cover by the groups laid before
    it (cheaper than the naive operators, equal to the float64 reference), not the naive
    operators (an interrupt 20 s into the 32-layer 8B-size decoder lost them)."""
    from test_online_softmax import _run
    from mirage_py.superopt.part import PartCover
    comp = decoder_block(layers=2)
    run = _run()
    part = PartCover(comp.program, run)
    real, laid = PartCover._first_verified, []

    def interrupted_after_two(self, st, options, source, *a, **kw):
        if source == "floor" and len(laid) == 2:
            raise KeyboardInterrupt
        res = real(self, st, options, source, *a, **kw)
        laid.append(res)
        return res
    monkeypatch.setattr(PartCover, "_first_verified", interrupted_after_two)
    with pytest.raises(KeyboardInterrupt):
        part.lay_floor()
    run.interrupt()
    assert part.floor_cover is None and any(r is not None for r in laid)
    part.keep_verified()
    out = part.answer()
    assert any(p.kind == "region" and p.result.source == "floor" for p in out.pieces)
    assert out.estimated_us < part._predicted(part._naive_cover(), {})
    inputs = comp.inputs(8)
    ref = comp.reference(inputs)
    got = out.graph.run(comp.program.check_inputs(inputs), precision="float64")
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-9, atol=1e-9 * np.abs(ref[k]).max())


def test_check_guesses_follow_this_calls_measured_checks():
    """A check is guessed from the call's own measurements (``CheckTimes``): seconds per
    input element from checks of at least ``RATE_ELEMENTS`` (a small check's fixed costs would
    guess a large one far too long), never below what a smaller measured check took; before
    any, ``CHECK_S_PER_ELEMENT``. Verification at shrunk and full size are kept apart, a
    program with an exp is guessed at full size, and a numerics check by what its sample reads."""
    from mirage_py.superopt.run import CHECK_S_PER_ELEMENT, RATE_ELEMENTS, CheckTimes
    t = CheckTimes()
    assert t.guess(10 ** 6) == pytest.approx(CHECK_S_PER_ELEMENT * 10 ** 6)
    t.note(131_072, 0.1)  # fixed costs: no rate from it
    assert t.rate is None and t.guess(200_000) >= 0.1
    t.note(16 * RATE_ELEMENTS, 3.2)
    assert t.guess(48 * RATE_ELEMENTS) == pytest.approx(9.6)
    assert t.guess(0) == 3.2  # elements unknown: the longest

    from test_online_softmax import _run
    from mirage_py.lax.program import Program
    run = _run()
    plain, soft = Program("plain"), Program("soft")
    plain.output(plain.input("x", (4, 2048), "float32") * 2.0, "y")
    soft.output(mp.exp(soft.input("x", (4, 2048), "float32")), "y")
    n = 4 * 2048
    # before any candidate: a program without an exp is guessed at the size its naive
    # lowering verifies at (the 2048 columns shrink), one with an exp at full size, at the
    # rate a first full-size verification costs (it computes the field reference at full size)
    from mirage_py.superopt.run import FULL_VERIFY_S_PER_ELEMENT, input_elements
    shrunk = run.naive_shrunk_sizes(plain)
    assert shrunk and shrunk.get(2048, 2048) < 2048
    ns = input_elements(plain, shrunk)
    assert run.check_guess(soft) - run.check_guess(plain) == pytest.approx(
        FULL_VERIFY_S_PER_ELEMENT * n - CHECK_S_PER_ELEMENT * ns)
    run.verify_times.note(RATE_ELEMENTS, 0.01)  # at shrunk sizes: cheap
    run.verify_full_times.note(RATE_ELEMENTS, 1.0)
    run.numerics_times.note(RATE_ELEMENTS, 0.5)
    # the numerics check reads a sample of the columns (verifier/sample.py): 1024 output
    # elements of the 8192, what the guess is by; the verification reads every element
    m = run.checked_elements(plain)
    assert m == run.checked_elements(soft) == 4 * 256
    assert run.check_guess(plain) == pytest.approx((0.5 * m + 0.01 * ns) / RATE_ELEMENTS)
    assert run.check_guess(soft) == pytest.approx((0.5 * m + 1.0 * n) / RATE_ELEMENTS)
    assert run.check_guess(soft, known=True) == pytest.approx(0.5 * m / RATE_ELEMENTS)


def test_a_candidate_that_shrinks_is_guessed_at_its_shrunk_size_and_products_weigh_in():
    """A candidate whose verification runs shrunk (``Verifier.shrunk_sizes``) is guessed by the
    elements it verifies there, not by the full program's (KernelBench's Matmul_Mish_Mish
    guessed 10.6 s for a 0.4 s check and never searched in a 20 s budget); one that cannot
    shrink, at full size; and the guesses of a numerics check and of a verification count
    their products' multiply-adds (``MAC_ELEMENTS`` each: that program's numerics check took
    25 s where its elements said 9.4 s)."""
    from test_online_softmax import _run
    from mirage_py.lax.program import Program
    from mirage_py.superopt.run import (CHECK_S_PER_ELEMENT, FULL_VERIFY_S_PER_ELEMENT,
                                        MAC_ELEMENTS, input_elements, multiply_adds,
                                        verified_work)
    from mirage_py.superopt.structure import naive_lowering
    run = _run()
    p = Program("mm_mish")
    x = p.input("x", (512, 2048), "float32")
    w = p.input("w", (2048, 2048), "float32")
    y = x @ w
    p.output(y * mp.tanh(mp.log(1.0 + mp.exp(y))), "y")
    assert multiply_adds(p) == 512 * 2048 * 2048
    naive = naive_lowering(p)
    sizes = run.shrunk_sizes("k", p, naive)
    assert sizes and all(v < k for k, v in sizes.items())
    small = input_elements(p, sizes)
    assert small < input_elements(p) // 16
    numerics = run.numerics_times.guess(run.checked_elements(p))
    # the check runs on sampled rows and columns (verifier/sample.py): its guess counts their
    # elements and products
    from mirage_py.verifier.sample import checked_elements, sampled_program
    sampled = sampled_program(p)
    assert multiply_adds(sampled) < multiply_adds(p)
    assert run.checked_elements(p) >= checked_elements(p) + MAC_ELEMENTS * multiply_adds(sampled)
    # a verification's guess counts its products too, at the sizes it runs at
    assert verified_work(p, sizes) == small + int(MAC_ELEMENTS * multiply_adds(p, sizes))
    assert multiply_adds(p, sizes) < multiply_adds(p) // 64
    assert run.check_guess(p, key="k", graph=naive) == pytest.approx(
        numerics + CHECK_S_PER_ELEMENT * verified_work(p, sizes))
    run._shrunk_sizes[("k", naive.structural_hash())] = None  # as if it could not shrink
    assert run.check_guess(p, key="k", graph=naive) == pytest.approx(
        numerics + FULL_VERIFY_S_PER_ELEMENT * (input_elements(p) + int(
            MAC_ELEMENTS * 512 * 2048 * 2048)))


def test_an_exp_program_whose_full_size_check_cannot_fit_is_guessed_shrunk(monkeypatch):
    """An exp program is guessed at full size before it has a candidate -- unless a full-size
    check could not fit in memory (``verifier.memory.fits``): such a check is refused, not
    slow, so the guess is the naive lowering's shrunk size (KernelBench's 4096 x 393216 softmax
    was guessed at 1.6 G elements and never checked)."""
    from test_online_softmax import _run
    from mirage_py.lax.program import Program
    from mirage_py.superopt.run import verified_work
    from mirage_py.verifier import memory

    soft = Program("soft")
    x = soft.input("x", (8, 4096), "float32")
    e = mp.exp(x - mp.max(x, axis=-1, keepdims=True))
    soft.output(e / mp.sum(e, axis=-1, keepdims=True), "y")
    run = _run()
    full = run.check_guess(soft)
    shrunk = run.naive_shrunk_sizes(soft)
    assert shrunk and verified_work(soft, shrunk) < verified_work(soft) // 4
    monkeypatch.setattr(memory, "headroom_bytes", lambda: memory.live_peak_bytes(soft))
    small = _run()
    assert not small.full_check_fits(soft)
    assert small.check_guess(soft) < full
    assert small.check_guess(soft) == pytest.approx(
        small.numerics_times.guess(small.checked_elements(soft)) +
        small.verify_times.guess(verified_work(soft, shrunk)))
