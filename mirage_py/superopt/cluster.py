"""The tasks of a Ray cluster (:class:`RayExecutor`, ``superopt(executor="ray")``,
``mirage-py superopt --ray ADDRESS``; docs/cluster.md).

With Ray, the driver (the process that called ``superopt``) keeps the region layer -- the
floor's quick searches, the cover, the results database -- and sends out three kinds of task:

* **search** (``num_cpus=1``): one region structure each -- its search, its algebraic forms, the
  tuning of its best structures (:func:`.search.explore`), exactly the unit a local worker
  process runs, so answers do not depend on how many tasks run at once or where;
* **verify** (``num_cpus=1``): the next option of a structure the cover picked, checked against
  the region's program (a fresh :class:`~mirage_py.verifier.Verifier` with the run's seed gives
  the same answer as the driver's);
* **measure** (``num_gpus=1`` plus one unit of the target's custom resource, ``gpu_h100`` for
  ``target="h100"``): a structure's naive graph and ``measure_top`` best options timed by the
  runner on one device, so a cluster of mixed GPUs measures each target on its own hardware.

Results come back to the driver, which alone writes the database. Tasks are retried
``max_retries`` times when their worker dies (a killed process loses only its task); a task that
fails anyway leaves its region out (searches, as a local worker that died) or is redone on the
driver (verification). Ctrl-C on the driver keeps what has arrived and cancels the rest.
Ray is imported only when a :class:`RayExecutor` starts: ``pip install 'mirage_py[ray]'``.
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any, Callable

from ..errors import ClusterError, OptionError
from ..version import __version__, source_fingerprint
from .jobs import Executor, ExploreJob, Measured, MeasureJob, VerifyJob, region_label
from .local import verify_here


def _import_ray():
    try:
        import ray
    except ImportError:
        raise OptionError("superopt: executor='ray' needs Ray, which is not installed; "
                          "pip install 'mirage_py[ray]' (or pip install ray)") from None
    return ray


def gpu_resource(target: Any) -> str:
    """The custom Ray resource a node offers per GPU of ``target``'s type: ``gpu_<name>``
    (``ray start --num-gpus 8 --resources '{"gpu_h100": 8}'``)."""
    return f"gpu_{getattr(target, 'name', target)}"


def _wait(refs: list, timeout: float) -> list:
    """The refs among ``refs`` that are ready, waiting up to ``timeout`` s for the first one."""
    import ray
    ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
    return ready


def _receive(refs: list, timeout: float) -> list:
    """:func:`_wait` for region searches (Ctrl-C on the driver arrives here while it waits for
    them, as at ``local._receive`` with local processes)."""
    return _wait(refs, timeout)


def _deadline_in_task(wall: float | None) -> float | None:
    """A driver's deadline (wall-clock seconds) as this process's ``perf_counter`` deadline:
    ``perf_counter`` values mean nothing on another machine, clocks of a cluster agree."""
    return None if wall is None else time.perf_counter() + (wall - time.time())


def _task_info(kind: str, name: str) -> dict:
    info = {"kind": kind, "name": name, "pid": os.getpid(), "version": __version__,
            "code": source_fingerprint(), "started": time.time()}
    try:
        import ray
        ctx = ray.get_runtime_context()
        info["node"] = ctx.get_node_id()
        info["resources"] = dict(ctx.get_assigned_resources())
    except Exception:  # outside a Ray worker (called directly in a test)
        info["node"], info["resources"] = "", {}
    return info


# ---- the tasks (plain functions; RayExecutor.start wraps them with ray.remote) --------------

def explore_task(prog_json: dict, target: Any, model: Any, settings: Any,
                 wall_deadline: float | None, prior_json: dict | None = None,
                 hook: Callable | None = None) -> dict:
    """One region search (search, forms, tuning) in a worker, or with ``prior_json`` (an
    Explored whose tuning was deferred) that tuning: the JSON of its Explored."""
    from ..lax.program import Program
    from .search import Explored, explore_or_tune
    program = Program.from_json(prog_json)
    kind = "explore" if prior_json is None else "tune"
    info = _task_info(kind, region_label(program))
    progress = None
    if hook is not None:
        hook(kind, info["name"])
        progress = lambda *a, **k: hook("candidate", info["name"])  # noqa: E731
    ex = explore_or_tune(program, target, model, settings, _deadline_in_task(wall_deadline),
                         None if prior_json is None else Explored.from_json(prior_json),
                         progress)
    return {"explored": ex.to_json(), **info, "seconds": time.time() - info["started"]}


def verify_task(prog_json: dict, graph_json: dict, seed: int, target: Any,
                tests: int | None, sizes: dict | None = None,
                hook: Callable | None = None) -> dict:
    """One candidate checked against its region's program (the driver's verifier would give the
    same answer: the tests depend only on the seed and the test index)."""
    from ..lax.program import Program
    from ..ugraph.graph import KernelGraph
    from ..verifier import Verifier
    program = Program.from_json(prog_json)
    info = _task_info("verify", region_label(program))
    if hook is not None:
        hook("verify", info["name"])
    v = Verifier(program, seed=seed, target=target, sizes=sizes).check(
        KernelGraph.from_json(graph_json), tests=tests)
    return {"verification": v, **info, "seconds": time.time() - info["started"]}


def measure_task(runner: Any, name: str, naive: Any, graphs: list, target: Any,
                 hook: Callable | None = None) -> dict:
    """A structure's naive graph and best options timed by ``runner`` on this task's GPU."""
    from .search import measure_graphs
    if hook is not None:
        hook("measure", name)
    info = _task_info("measure", name)
    nm, ms = measure_graphs(runner, naive, graphs, target)
    return {"naive": nm, "measurements": ms, **info,
            "seconds": time.time() - info["started"]}


# ---- Ray --------------------------------------------------------------------------------------

class RayExecutor(Executor):
    """Region searches, verification and measurements as tasks of a Ray cluster (see the module
    docstring and docs/cluster.md).

    ``address``: the cluster -- ``None`` (``$RAY_ADDRESS``, else a new local instance), ``"auto"``
    (the cluster this machine joined with ``ray start``), ``"HOST:6379"``, ``"ray://HOST:10001"``
    (Ray Client) or ``"local"``; ignored when this process is already connected (``ray.init``
    called before). ``max_retries``: how often a task whose worker died is run again.
    ``measure_timeout_s``: a run's measurements fail with :class:`ClusterError` when none has
    finished for this long (a GPU node that left, a hung device). ``gpu_resource``: the custom
    resource name a measurement requests (default ``gpu_<target>``, :func:`gpu_resource`).
    ``measure_cpus``: CPUs a measurement task holds besides its GPU (compilation runs there).
    ``init_kwargs``: passed to ``ray.init`` when this executor connects. ``on_task``: a
    function ``on_task(event, name)`` called inside the tasks (``"explore"``, ``"tune"``,
    ``"candidate"``, ``"verify"``, ``"measure"``; tests use it to find and kill workers).
    ``log``: one dict per finished task (kind, region name, pid, node, the resources Ray
    assigned it, wall-clock start and seconds it ran)."""

    name = "ray"

    def __init__(self, address: str | None = None, *, max_retries: int = 3,
                 measure_timeout_s: float = 900.0, gpu_resource: str | None = None,
                 measure_cpus: float = 1, init_kwargs: dict | None = None,
                 on_task: Callable | None = None):
        if address is not None and (not isinstance(address, str) or not address.strip()):
            raise OptionError(f"RayExecutor: address must be a non-empty string or None, got "
                              f"{address!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise OptionError(f"RayExecutor: max_retries must be an integer >= 0, got "
                              f"{max_retries!r}")
        if isinstance(measure_timeout_s, bool) or not isinstance(measure_timeout_s, (int, float)) \
                or not measure_timeout_s > 0:
            raise OptionError(f"RayExecutor: measure_timeout_s must be a number of seconds > 0, "
                              f"got {measure_timeout_s!r}")
        if gpu_resource is not None and (not isinstance(gpu_resource, str) or not gpu_resource):
            raise OptionError(f"RayExecutor: gpu_resource must be a resource name, got "
                              f"{gpu_resource!r}")
        if isinstance(measure_cpus, bool) or not isinstance(measure_cpus, (int, float)) or \
                measure_cpus < 0:
            raise OptionError(f"RayExecutor: measure_cpus must be a number >= 0, got "
                              f"{measure_cpus!r}")
        if init_kwargs is not None and not isinstance(init_kwargs, dict):
            raise OptionError(f"RayExecutor: init_kwargs must be a dict, got "
                              f"{type(init_kwargs).__name__}")
        if on_task is not None and not callable(on_task):
            raise OptionError("RayExecutor: on_task must be callable")
        self.address = address.strip() if address else None
        self.max_retries = max_retries
        self.measure_timeout_s = float(measure_timeout_s)
        self.gpu_resource = gpu_resource
        self.measure_cpus = measure_cpus
        self.init_kwargs = dict(init_kwargs or {})
        self.on_task = on_task
        self.log: list[dict] = []
        self._ray = None
        self._fns: dict = {}

    def __repr__(self) -> str:
        return f"RayExecutor({self.address!r})"

    # -- connecting and checking ------------------------------------------------------------
    def start(self, target: Any) -> None:
        ray = _import_ray()
        if not ray.is_initialized():
            try:
                ray.init(address=self.address, **self.init_kwargs)
            except Exception as e:  # ConnectionError, RuntimeError, ValueError from ray.init
                where = self.address or os.environ.get("RAY_ADDRESS") or "a new local instance"
                raise ClusterError(f"cannot connect to the Ray cluster at {where!r}: "
                                   f"{type(e).__name__}: {e}; start one with 'ray start --head' "
                                   "(docs/cluster.md) or pass address=None for a local "
                                   "instance") from None
        self._ray = ray
        if not self._fns:
            self._fns = {"explore": ray.remote(explore_task), "verify": ray.remote(verify_task),
                         "measure": ray.remote(measure_task)}
        if self._resources().get("CPU", 0) < 1:
            raise ClusterError("the Ray cluster has no CPUs for region searches (ray.cluster_"
                               f"resources(): {self._describe()}); add a node with 'ray start "
                               "--address HEAD:6379'")

    def _resources(self) -> dict:
        return dict(self._ray.cluster_resources())

    def _describe(self) -> str:
        res = self._resources()
        keep = {k: v for k, v in sorted(res.items())
                if not k.startswith(("node:", "memory", "object_store_memory", "accelerator_type"))}
        return ", ".join(f"{k}={v:g}" for k, v in keep.items()) or "nothing"

    def default_workers(self) -> int:
        return max(1, int(self._resources().get("CPU", 1)))

    def gpu_request(self, target: Any) -> dict:
        """What a measurement task asks Ray for: ``num_gpus``, ``num_cpus`` and the target's
        custom resource."""
        return {"num_gpus": 1, "num_cpus": self.measure_cpus,
                "resources": {self.gpu_resource or gpu_resource(target): 1}}

    def default_runner(self, model: Any, target: Any):
        """The GPU runner when the cluster has a GPU of the target's type, else the model."""
        from ..tuning.runners import GpuRunner, ModelRunner
        return GpuRunner() if self._has_gpu(target) else ModelRunner(model)

    def _has_gpu(self, target: Any) -> bool:
        res = self._resources()
        req = self.gpu_request(target)
        return res.get("GPU", 0) >= req["num_gpus"] and \
            all(res.get(k, 0) >= v for k, v in req["resources"].items())

    def check_runner(self, runner: Any, target: Any) -> None:
        """A measuring runner needs a GPU of the target's type somewhere in the cluster: checked
        up front, so a task that would wait forever for one is never submitted."""
        from .search import measures
        if not measures(runner) or self._has_gpu(target):
            return
        res = next(iter(self.gpu_request(target)["resources"]))
        raise ClusterError(
            f"runner {getattr(runner, 'name', type(runner).__name__)!r} measures on a GPU of type "
            f"{getattr(target, 'name', target)!r}, but the Ray cluster offers no GPU with the "
            f"resource {res!r} (it has: {self._describe()}); start a GPU node with: ray start "
            f"--address HEAD:6379 --num-gpus N --resources='{{\"{res}\": N}}' -- or pass "
            "runner=ModelRunner() to rank by the cost model")

    # -- tasks ------------------------------------------------------------------------------
    def _submit(self, kind: str, *args, **options):
        opts = {"max_retries": self.max_retries, "retry_exceptions": False, **options}
        return self._fns[kind].options(**opts).remote(*args, self.on_task)

    def _collect(self, ref, what: str) -> dict | None:
        """A finished task's result, or None (with a warning) when it failed for good."""
        ray = self._ray
        try:
            got = ray.get(ref)
        except ray.exceptions.RayTaskError as e:  # the task raised: as a local worker that died
            warnings.warn(f"{what} failed on the cluster and is left out: "
                          f"{type(e.cause).__name__}: {e.cause}", RuntimeWarning, stacklevel=3)
            return None
        except ray.exceptions.RayError as e:  # the worker or its node died max_retries + 1 times
            warnings.warn(f"{what} was lost on the cluster ({type(e).__name__}, "
                          f"{self.max_retries} retries) and is left out", RuntimeWarning,
                          stacklevel=3)
            return None
        if got.get("code") != source_fingerprint():
            theirs, ours = str(got.get("code"))[:12], source_fingerprint()[:12]
            raise ClusterError(f"a Ray worker (pid {got.get('pid')}, node {got.get('node')}) runs "
                               f"mirage_py {got.get('version')} (source {theirs}), this driver "
                               f"{__version__} (source {ours}): install the same code on every "
                               "node")
        self.log.append({k: v for k, v in got.items()
                         if k in ("kind", "name", "pid", "node", "resources", "started",
                                  "seconds")})
        return got

    def _cancel(self, refs) -> None:
        """Stop tasks whose results are no longer wanted (their workers are killed; Ray starts
        new ones), then take their errors so that Ray does not report them as unhandled."""
        refs = list(refs)
        for ref in refs:
            try:
                self._ray.cancel(ref, force=True)
            except Exception:  # already finished or gone
                pass
        if not refs:
            return
        done, _ = self._ray.wait(refs, num_returns=len(refs), timeout=10)
        for ref in done:
            try:
                self._ray.get(ref, timeout=0)
            except Exception:  # TaskCancelledError, WorkerCrashedError
                pass

    def explore(self, jobs: list[ExploreJob], run: Any, *, progress: bool = False) -> dict:
        """Region searches as tasks, ``run.workers`` in flight, in job order; none started once
        the search budget is spent. Ctrl-C keeps what has arrived and cancels the rest."""
        from .search import Explored
        # target, model and runner travel with every task (a few kB): ObjectRef arguments of
        # ray.put objects left later tasks unscheduled after a cancellation (Ray 2.60, tests)
        target, model = run.target, run.model
        wall = None if run.search_deadline is None else \
            time.time() + (run.search_deadline - time.perf_counter())
        pending = list(jobs)
        running: dict = {}  # ref -> (key, name)
        out: dict = {}
        try:
            while pending or running:
                while pending and len(running) < run.workers and not run.expired():
                    job = pending.pop(0)
                    ref = self._submit("explore", job.program.to_json(), target, model,
                                       job.settings, wall,
                                       None if job.prior is None else job.prior.to_json(),
                                       num_cpus=1)
                    running[ref] = (job.key, region_label(job.program))
                if not running:
                    break
                for ref in _receive(list(running), 0.2):
                    key, name = running.pop(ref)
                    got = self._collect(ref, f"the search of region {name}")
                    if got is not None:
                        out[key] = Explored.from_json(got["explored"])
        except KeyboardInterrupt:
            run.interrupt()
            if running:
                ready, _ = self._ray.wait(list(running), num_returns=len(running), timeout=0)
                for ref in ready:
                    key, name = running.pop(ref)
                    got = self._collect(ref, f"the search of region {name}")
                    if got is not None:
                        out[key] = Explored.from_json(got["explored"])
        finally:
            self._cancel(running)
        return out

    def verify(self, jobs: list[VerifyJob], run: Any) -> dict:
        """Every check as a task, all at once; one the cluster does not answer is done here."""
        target = run.target
        refs = {self._submit("verify", job.program.to_json(), job.graph.to_json(),
                             run.settings.seed, target, run.settings.verify_tests,
                             dict(run.sizes), num_cpus=1): (job.key, region_label(job.program))
                for job in jobs}
        out: dict = {}
        try:
            while refs:
                for ref in _wait(list(refs), 0.2):
                    key, name = refs.pop(ref)
                    got = self._collect(ref, f"the verification of region {name}")
                    if got is not None:
                        out[key] = got["verification"]
        finally:
            self._cancel(refs)
        return {job.key: out[job.key] if job.key in out else verify_here(job, run)
                for job in jobs}

    def measure(self, jobs: list[MeasureJob], run: Any) -> dict[str, Measured]:
        """All of the run's measurements submitted at once (Ray queues them per GPU). Ctrl-C
        keeps what has arrived (the rest stays unmeasured); :class:`ClusterError` when none
        finishes for ``measure_timeout_s``."""
        self.check_runner(run.runner, run.target)
        runner, target = run.runner, run.target
        req = self.gpu_request(run.target)
        refs = {self._submit("measure", runner, job.name, job.naive, list(job.graphs), target,
                             **req): job.key for job in jobs}
        out: dict = {}
        last = time.monotonic()
        try:
            while refs:
                ready = _wait(list(refs), 0.2)
                if ready:
                    last = time.monotonic()
                elif time.monotonic() - last > self.measure_timeout_s:
                    raise ClusterError(
                        f"no GPU measurement finished in {self.measure_timeout_s:g} s ({len(refs)} "
                        f"waiting for {req}; the cluster has: {self._describe()}); a GPU node "
                        "may have left or hung (RayExecutor(measure_timeout_s=...))")
                for ref in ready:
                    key = refs.pop(ref)
                    got = self._collect(ref, "a measurement")
                    if got is not None:
                        out[key] = Measured(got["naive"], tuple(got["measurements"]))
        except KeyboardInterrupt:
            run.interrupt()
        finally:
            self._cancel(refs)
        return out


__all__ = ["RayExecutor", "gpu_resource", "explore_task", "verify_task", "measure_task"]
