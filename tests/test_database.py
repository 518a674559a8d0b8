"""The results database: round trips, defaults, bad files, several writers at once, a writer
killed mid-transaction, superopt answering from it, and the training-set export."""

import csv
import json
import multiprocessing as mproc
import os
import signal
import sqlite3
import time

import pytest

import mirage_py as mp
from mirage_py.errors import DatabaseError
from mirage_py.tuning import TuningRecord, ResultsDB, default_path, export_training_set, open_database
from mirage_py.tuning.runners import FakeRunner
from ugraph_cases import tiled_matmul


def small_program(name="small_norm_linear", k=256):
    p = mp.Program(name)
    X = p.input("X", (8, k))
    W = p.input("W", (k, 512))
    p.output(mp.rms_norm(X) @ W, name="Y")
    return p


KEY = "k" * 64  # an answer key (superopt's: AnswerKey.digest)


def record(i=0, chosen=False, measured=None, target="h100", key=KEY):
    g, _ = tiled_matmul()
    return TuningRecord(g.to_json(), target, g.structural_hash(),
                  {"threads": [128], "stages": [1 + i % 4], "schedule": None},
                  predicted_us=10.0 + i, measured_us=measured, runner="model",
                  chosen=chosen, verification={"equivalent": True, "bound": 1e-12,
                                               "tests_run": 2, "seconds": 0.01} if chosen
                  else None, answer_key=key)


def superopt_key(runner=None, **settings) -> str:
    """The answer key of a ``superopt`` call on this code with these settings."""
    from mirage_py.superopt import default_model
    from mirage_py.superopt.store import AnswerKey, AnswerSettings
    return AnswerKey.of(default_model(), runner, AnswerSettings(**settings)).digest


# ---- basics -----------------------------------------------------------------------------------

def test_round_trip_and_lookup(tmp_path):
    p = small_program()
    with ResultsDB(tmp_path / "r.sqlite") as db:
        ids = db.add(p, [record(0), record(1, chosen=True), record(2, measured=5.0)])
        assert len(ids) == 3 and db.count() == 3
        assert db.check() == "ok"
        (w,) = db.workloads()
        assert w.hash == p.structural_hash() and w.program == p.to_json()
        best = db.lookup(p.structural_hash(), "h100", KEY)
        assert best.id == ids[1] and best.chosen and best.annotations["stages"] == [2]
        assert best.graph == record().graph and best.tool_version == mp.__version__
        assert best.created and best.answer_key == KEY  # ISO date
        assert db.lookup(p.structural_hash(), "a100", KEY) is None
        assert db.lookup("0" * 64, "h100", KEY) is None
        assert [r.measured_us for r in db.records(measured=True)] == [5.0]
        assert len(db.records(workload=p.structural_hash(), target="h100")) == 3
        db.add(p, [record(3, chosen=True)])  # a newer answer wins
        assert db.lookup(p.structural_hash(), "h100", KEY).predicted_us == 13.0
        assert len(db.workloads()) == 1


def test_default_path_and_switches(tmp_path, monkeypatch):
    monkeypatch.setenv("MIRAGE_PY_DATABASE", str(tmp_path / "x.sqlite"))
    assert default_path() == str(tmp_path / "x.sqlite")
    for off in ("off", "0", "", "none"):
        monkeypatch.setenv("MIRAGE_PY_DATABASE", off)
        assert default_path() is None and open_database(None) is None
    monkeypatch.delenv("MIRAGE_PY_DATABASE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_path() == str(tmp_path / "cache" / "mirage_py" / "results.sqlite")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_path().endswith(os.path.join(".cache", "mirage_py", "results.sqlite"))
    assert open_database(False) is None
    db = ResultsDB(tmp_path / "y.sqlite")
    assert open_database(db) is db
    assert open_database(str(tmp_path / "z.sqlite")).path == str(tmp_path / "z.sqlite")


def test_unwritable_default_location_disables_the_database(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")  # nobody, root included, can create a dir under it
    bad = str(blocker / "sub" / "r.sqlite")
    monkeypatch.setenv("MIRAGE_PY_DATABASE", bad)
    with pytest.warns(RuntimeWarning, match="results database disabled"):
        assert open_database(None) is None
    with pytest.raises(DatabaseError, match="cannot create directory"):
        open_database(bad)  # asked for explicitly: an error


def test_wal_mode_and_schema_version(tmp_path):
    path = tmp_path / "r.sqlite"
    ResultsDB(path).close()
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    meta = dict(con.execute("SELECT key, value FROM meta"))
    assert meta["format"] == "mirage_py.results" and meta["schema_version"] == "4"
    con.close()


# ---- bad files --------------------------------------------------------------------------------

def test_corrupt_file_gives_a_clear_error(tmp_path):
    f = tmp_path / "junk.sqlite"
    f.write_bytes(os.urandom(4096))
    with pytest.raises(DatabaseError, match="not a usable mirage_py results database") as e:
        ResultsDB(f)
    assert str(f) in str(e.value) and "delete" in str(e.value)
    assert isinstance(e.value, mp.MirageError)


def test_damaged_pages_give_a_clear_error(tmp_path):
    f = tmp_path / "r.sqlite"
    db = ResultsDB(f)
    db.add(small_program(), [record(i) for i in range(200)])
    db.close()
    con = sqlite3.connect(f)  # fold the WAL into the main file, then damage its pages
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    data = bytearray(f.read_bytes())
    for i in range(4096, len(data), 97):
        data[i] = 0xA5
    f.write_bytes(bytes(data))
    with pytest.raises(DatabaseError, match=str(f)):
        ResultsDB(f).records()


def test_foreign_sqlite_file_is_refused_and_left_alone(tmp_path):
    f = tmp_path / "other.sqlite"
    con = sqlite3.connect(f)
    con.execute("CREATE TABLE customers (id INTEGER, name TEXT)")
    con.commit()
    con.close()
    before = f.read_bytes()
    with pytest.raises(DatabaseError, match="another program"):
        ResultsDB(f)
    assert f.read_bytes() == before
    assert sqlite3.connect(f).execute("PRAGMA journal_mode").fetchone()[0] == "delete"


def test_newer_schema_and_directory_are_refused(tmp_path):
    f = tmp_path / "r.sqlite"
    ResultsDB(f).close()
    con = sqlite3.connect(f)
    con.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    con.commit()
    con.close()
    with pytest.raises(DatabaseError, match="newer mirage_py"):
        ResultsDB(f)
    with pytest.raises(DatabaseError, match="directory"):
        ResultsDB(tmp_path)


# ---- several processes ------------------------------------------------------------------------

def _writer(path, who, n, start):
    start.wait()
    db = ResultsDB(path)
    p = small_program()
    for i in range(n):
        r = record(i)
        r.annotations["who"] = [who, i]
        db.add(p, [r, record(i + 1)])
    db.close()


def test_several_processes_writing_at_once_lose_nothing(tmp_path):
    path = str(tmp_path / "r.sqlite")
    ctx = mproc.get_context("fork")
    start = ctx.Event()
    procs = [ctx.Process(target=_writer, args=(path, w, 25, start)) for w in range(4)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    db = ResultsDB(path)
    recs = db.records()
    assert len(recs) == 4 * 25 * 2
    tags = {tuple(r.annotations["who"]) for r in recs if "who" in r.annotations}
    assert tags == {(w, i) for w in range(4) for i in range(25)}
    assert len({r.id for r in recs}) == len(recs)
    assert len(db.workloads()) == 1
    assert db.check() == "ok"


def _killed_mid_write(path, ready):
    db = ResultsDB(path)
    p = small_program()
    for i in range(3):
        db.add(p, [record(i)])  # committed

    def slow():
        for i in range(1000):
            yield record(100 + i)
            if i == 50:
                ready.set()  # inside the transaction, 51 rows written, not committed
                time.sleep(60)
    db.add(p, slow())


def test_a_writer_killed_mid_transaction_leaves_it_consistent(tmp_path):
    path = str(tmp_path / "r.sqlite")
    ctx = mproc.get_context("fork")
    ready = ctx.Event()
    child = ctx.Process(target=_killed_mid_write, args=(path, ready))
    child.start()
    assert ready.wait(60)
    os.kill(child.pid, signal.SIGKILL)
    child.join(10)
    assert child.exitcode == -signal.SIGKILL
    db = ResultsDB(path, timeout=5)
    assert db.check() == "ok"
    assert [r.predicted_us for r in db.records()] == [10.0, 11.0, 12.0]  # none of the 51
    db.add(small_program(), [record(7)])  # the dead writer's lock is gone
    assert db.count() == 4


# ---- superopt and the database --------------------------------------------------------------

def test_superopt_returns_a_known_answer_from_the_database(tmp_path):
    path = tmp_path / "r.sqlite"
    p = small_program()
    first = mp.superopt(p, workers=1, progress=False, database=path)
    assert first.parts[0].source == "search"
    t0 = time.perf_counter()
    again = mp.superopt(p, workers=1, progress=False, database=path)
    seconds = time.perf_counter() - t0
    part = again.parts[0]
    assert part.source == "database" and part.origin == "search"
    assert part.stats.plans == 0 and part.candidates == 0 and part.verified == 0  # no search
    assert again.graph.structural_hash() == first.graph.structural_hash()
    assert again.stages == first.stages
    assert again.estimated_time_us == pytest.approx(first.estimated_time_us)
    assert part.verification.equivalent and part.verification.bound <= 1e-9
    assert "from the results database" in again.summary()
    print(f"answer from the database in {seconds:.3f} s")
    # another target, or no database: searched again
    assert mp.superopt(p, workers=1, progress=False, database=path,
                       target="a100").parts[0].source == "search"
    assert mp.superopt(p, workers=1, progress=False,
                       database=False).parts[0].source == "search"


def test_default_database_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MIRAGE_PY_DATABASE", str(tmp_path / "env.sqlite"))
    p = small_program()
    mp.superopt(p, workers=1, progress=False)
    assert mp.superopt(p, workers=1, progress=False).parts[0].source == "database"
    assert ResultsDB(tmp_path / "env.sqlite").count() > 0


def test_cut_short_searches_are_recorded_but_not_reused(tmp_path, monkeypatch):
    """Ctrl-C right after the first candidate: what was found is recorded, but the answer of a
    search cut short is not reused (a later run searches again)."""
    import sys
    so = sys.modules["mirage_py.superopt"]

    def interrupt(self, found, states=0, pruned=0):
        raise KeyboardInterrupt
    path = tmp_path / "r.sqlite"
    p = small_program()
    with monkeypatch.context() as m:
        m.setattr(so._Progress, "__call__", interrupt)
        opt = mp.superopt(p, workers=1, progress=False, database=path)
    assert opt.parts[0].stats.interrupted
    db = ResultsDB(path)
    key = mp.regions.canonical(p).structural_hash()  # what superopt stores a program under
    assert db.count() >= 1 and db.lookup(key, "h100", superopt_key()) is None
    again = mp.superopt(p, workers=1, progress=False, database=path)
    assert again.parts[0].source == "search" and not again.parts[0].stats.interrupted
    assert db.lookup(key, "h100", superopt_key()) is not None  # complete now: reusable


def test_a_spent_budget_searches_nothing_and_records_nothing(tmp_path):
    """With the budget gone before any region search starts, the answer is the floor (found
    in about a second whatever the budget) and nothing is marked for reuse."""
    path = tmp_path / "r.sqlite"
    p = small_program()
    opt = mp.superopt(p, workers=1, progress=False, database=path, time_budget_s=1e-6)
    part = opt.parts[0]
    assert part.stats.timed_out and part.source in ("floor", "naive")
    assert part.estimated_us <= part.floor_us + 1e-9 and all(v.equivalent for v in
                                                              opt.verification)
    assert ResultsDB(path).lookup(mp.regions.canonical(p).structural_hash(), "h100",
                                  superopt_key()) is None


def test_every_measurement_is_recorded_and_exported(tmp_path):
    path = tmp_path / "r.sqlite"
    p = small_program()
    runner = FakeRunner()
    opt = mp.superopt(p, workers=1, progress=False, database=path, runner=runner,
                      measure_top=3)
    db = ResultsDB(path)
    measured = db.records(measured=True)
    # the naive graph, up to three candidates, and the chosen one (re-stated)
    assert len(runner.calls) >= 2 and len(measured) >= len(runner.calls)
    assert {r.runner for r in measured} == {"fake"}
    assert all(r.samples for r in measured)
    chosen = db.lookup(mp.regions.canonical(p).structural_hash(), "h100",
                       superopt_key(runner, measure_top=3))
    assert chosen.measured_us == opt.parts[0].measured_us is not None
    n = export_training_set(db, str(tmp_path / "train.jsonl"), measured_only=True)
    rows = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert n == len(rows) == len(measured)
    for row in rows:
        f = row["features"]
        assert row["measured_us"] > 0 and f["kernels"] >= 1 and f["bytes"] > 0
        assert "threads" in row["annotations"] and "stages" in row["annotations"]
        for k in f["per_kernel"]:
            assert {"blocks", "threads", "smem", "bytes", "tc_flops"} <= set(k)
    m = export_training_set(str(path), str(tmp_path / "all.csv"))
    with open(tmp_path / "all.csv") as fh:
        table = list(csv.DictReader(fh))
    assert m == len(table) == db.count()
    assert {"predicted_us", "measured_us", "threads", "stages", "bytes", "grid"} <= set(table[0])


def test_export_command_line(tmp_path, capsys):
    from mirage_py.tuning.export import main
    path = tmp_path / "r.sqlite"
    ResultsDB(path).add(small_program(), [record(0, measured=3.0), record(1)])
    assert main([str(path), str(tmp_path / "o.jsonl"), "--measured-only"]) == 0
    assert "wrote 1 rows" in capsys.readouterr().out


def test_command_line_database_option(tmp_path):
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    f = tmp_path / "prog.py"
    f.write_text("import mirage_py as mp\np = mp.Program('tiny')\nX = p.input('X', (8, 128))\n"
                 "W = p.input('W', (128, 256))\np.output(mp.rms_norm(X) @ W, name='Y')\n")
    db = tmp_path / "cli.sqlite"
    env = {**os.environ, "PYTHONPATH": root}

    def run():
        return subprocess.run([sys.executable, "-m", "mirage_py", "superopt", str(f),
                               "--workers", "1", "--database", str(db)], capture_output=True,
                              text=True, env=env, cwd=root, timeout=600)
    r = run()
    assert r.returncode == 0, r.stderr
    assert ResultsDB(db).lookup(small_program().structural_hash(), "h100",
                                superopt_key()) is None
    # the region's records and the whole program's answer, kept for the next call
    assert "tiny" in {w.name for w in ResultsDB(db).workloads()}
    r = run()
    assert r.returncode == 0 and "from the results database" in r.stdout
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"x" * 5000)
    r = subprocess.run([sys.executable, "-m", "mirage_py", "superopt", str(f), "--database",
                        str(junk)], capture_output=True, text=True, env=env, cwd=root, timeout=600)
    assert r.returncode == 2 and "DatabaseError" in r.stderr and str(junk) in r.stderr
    assert "Traceback" not in r.stderr


def test_lookup_serves_only_answers_made_under_the_same_key(tmp_path):
    """Answers made by other code, another cost model or other settings (another answer key)
    are not reused; they stay in the file as training data."""
    p = small_program()
    with ResultsDB(tmp_path / "r.sqlite") as db:
        db.add(p, [record(0, chosen=True, key="other")])
        assert db.lookup(p.structural_hash(), "h100", KEY) is None
        assert db.lookup(p.structural_hash(), "h100", "other").predicted_us == 10.0
        db.add(p, [record(1, chosen=True, key="")])  # no key: never an answer
        assert db.lookup(p.structural_hash(), "h100", "") is None
        assert db.count() == 2
        db.add(p, [record(2, chosen=True)])
        assert db.lookup(p.structural_hash(), "h100", KEY).predicted_us == 12.0


def test_a_schema_1_file_is_upgraded_and_its_answers_are_not_served(tmp_path):
    """A file written before answers were keyed by the code that made them: opened, it gains
    the key column; its records stay (training data, merged and exported) but answer nothing."""
    f = tmp_path / "old.sqlite"
    con = sqlite3.connect(f)
    con.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "CREATE TABLE workloads (id INTEGER PRIMARY KEY, hash TEXT NOT NULL UNIQUE, name TEXT, "
        "program_json TEXT NOT NULL, created TEXT NOT NULL);"
        "CREATE TABLE records (id INTEGER PRIMARY KEY, workload_id INTEGER NOT NULL, target "
        "TEXT NOT NULL, graph_hash TEXT NOT NULL, graph_json TEXT NOT NULL, annotations_json "
        "TEXT NOT NULL, predicted_us REAL, measured_us REAL, runner TEXT, samples_json TEXT, "
        "chosen INTEGER NOT NULL DEFAULT 0, verification_json TEXT, tool_version TEXT NOT "
        "NULL, created TEXT NOT NULL);"
        "INSERT INTO meta VALUES ('format', 'mirage_py.results'), ('schema_version', '1');")
    p = small_program()
    r = record(0, chosen=True)
    con.execute("INSERT INTO workloads VALUES (1, ?, 'small', ?, 'then')",
                (p.structural_hash(), json.dumps(p.to_json())))
    con.execute("INSERT INTO records (workload_id, target, graph_hash, graph_json, "
                "annotations_json, predicted_us, chosen, verification_json, tool_version, "
                "created) VALUES (1, 'h100', ?, ?, ?, 10.0, 1, ?, '0.5.2', 'then')",
                (r.graph_hash, json.dumps(r.graph), json.dumps(r.annotations),
                 json.dumps(r.verification)))
    con.commit()
    con.close()
    with ResultsDB(f) as db:
        (old,) = db.records()
        assert old.chosen and old.answer_key == "" and old.predicted_us == 10.0
        assert db.lookup(p.structural_hash(), "h100", "") is None
        db.add(p, [record(1, chosen=True)])
        assert db.lookup(p.structural_hash(), "h100", KEY).predicted_us == 11.0
        db.keep(p, "h100", KEY, "search:{}", None, {"options": []})  # the table schema 3 added
        assert db.kept(p.structural_hash(), "h100", KEY, "search:{}") == (None, {"options": []})
        db.keep_capture("k", b"graph", b"consts")  # the table schema 4 added
        assert db.capture("k") == (b"graph", b"consts") and db.capture("other") is None
    meta = dict(sqlite3.connect(f).execute("SELECT key, value FROM meta"))
    assert meta["schema_version"] == "4"


def test_the_answer_key_names_code_model_runner_and_settings():
    from mirage_py.cost_model import create
    from mirage_py.superopt import default_model
    from mirage_py.superopt.store import AnswerKey, AnswerSettings
    from mirage_py.tuning.runners import ModelRunner
    from mirage_py.version import source_fingerprint
    key = AnswerKey.of(default_model(), ModelRunner(), AnswerSettings())
    assert key.source == source_fingerprint() and "planned_shared_memory" in key.model
    assert key.runner == ""  # a runner that does not measure shapes no answer
    assert key.digest == superopt_key() == AnswerKey.of(default_model(), None,
                                                        AnswerSettings()).digest
    others = {superopt_key(max_kernels=2), superopt_key(seed=1), superopt_key(verify_tests=3),
              superopt_key(FakeRunner()), AnswerKey.of(create("random"), None,
                                                       AnswerSettings()).digest,
              AnswerKey.of(create("random", seed=1), None, AnswerSettings()).digest}
    assert len(others) == 6 and key.digest not in others


_EDITED = "\n# an edit to the generator: the same answers, but other code\n"


def test_an_answer_is_served_only_to_the_code_that_made_it(tmp_path):
    """One copy of the package stores answers; the same code run again reuses them, a copy
    whose generator source differs by one line searches again (and stores its own), and the
    first copy still reuses its own."""
    import shutil
    import subprocess
    import sys
    pkg = os.path.dirname(os.path.abspath(mp.__file__))
    copies = {}
    for name, edit in (("a", False), ("b", True)):
        site = tmp_path / name
        shutil.copytree(pkg, site / "mirage_py", ignore=shutil.ignore_patterns("__pycache__"))
        if edit:
            with open(site / "mirage_py" / "generator" / "kernel_search.py", "a") as f:
                f.write(_EDITED)
        copies[name] = site
    path = tmp_path / "shared.sqlite"
    code = ("import mirage_py as mp, sys\n"
            "assert mp.__file__.startswith(sys.argv[1]), mp.__file__\n"
            "p = mp.Program('small')\nX = p.input('X', (8, 128))\n"
            "W = p.input('W', (128, 256))\np.output(mp.rms_norm(X) @ W, name='Y')\n"
            "opt = mp.superopt(p, workers=1, progress=False, database=sys.argv[2])\n"
            "print(opt.parts[0].source, opt.graph.structural_hash())\n")

    def run(copy: str) -> list[str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env["PYTHONPATH"] = str(copies[copy])
        r = subprocess.run([sys.executable, "-c", code, str(copies[copy]), str(path)],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
        assert r.returncode == 0, r.stderr
        return r.stdout.split()
    first = run("a")
    assert first[0] == "search"
    assert run("a") == ["database", first[1]]  # the same code reuses its answer
    other = run("b")
    assert other == ["search", first[1]]  # other code searches again: the same graph here
    assert run("b")[0] == run("a")[0] == "database"


def test_a_search_another_call_completed_is_not_run_again(tmp_path, monkeypatch):
    """Without the whole answer and the regions' chosen answers, a second call still runs no
    search its first call completed (kept searches and floors, schema 3), and makes the same
    answer."""
    from mirage_py.superopt import local, part
    p = mp.Program("two_layers")
    X = p.input("X", (8, 256))
    W1, W2 = p.input("W1", (256, 256)), p.input("W2", (256, 512))
    h = X + mp.silu(mp.rms_norm(X) @ W1)
    p.output(mp.rms_norm(h) @ W2, name="Y")
    path = tmp_path / "r.sqlite"
    first = mp.superopt(p, workers=1, progress=False, database=path)
    con = sqlite3.connect(path)
    kinds = [k for (k,) in con.execute("SELECT kind FROM kept")]
    assert any(k.startswith("search:") for k in kinds) and any(k.startswith("floor:")
                                                              for k in kinds)
    con.execute("DELETE FROM kept WHERE kind LIKE 'program:%'")
    con.execute("UPDATE records SET chosen = 0")
    con.commit()
    con.close()
    searches, floors = [], []
    explore_jobs, floor_explore = local.LocalExecutor.explore, part.explore

    def counted_jobs(self, jobs, run, **kw):
        searches.extend(j for j in jobs if j.prior is None)
        return explore_jobs(self, jobs, run, **kw)

    def counted_floor(*a, **k):
        floors.append(a)
        return floor_explore(*a, **k)
    monkeypatch.setattr(local.LocalExecutor, "explore", counted_jobs)
    monkeypatch.setattr(part, "explore", counted_floor)
    again = mp.superopt(p, workers=1, progress=False, database=path)
    assert again.origin == "search" and searches == [] and floors == []
    assert again.graph.structural_hash() == first.graph.structural_hash()
    assert again.estimated_time_us == pytest.approx(first.estimated_time_us)
    assert all(v.equivalent and v.bound <= 1e-9 for v in again.verification)
    # and with the whole answer kept, the third call is that answer
    third = mp.superopt(p, workers=1, progress=False, database=path)
    assert third.origin == "database" and third.graph.structural_hash() == \
        first.graph.structural_hash()
