"""Where ``superopt``'s work runs: processes on this machine (:class:`LocalExecutor`, the
default, :mod:`.local`) or the tasks of a Ray cluster (:class:`RayExecutor`, :mod:`.cluster`;
``superopt(executor="ray")``, ``mirage-py superopt --ray ADDRESS``; docs/cluster.md). Both
implement one protocol (:class:`~.jobs.Executor`): region searches, verifications and
measurements go in as jobs keyed by their structure, results come back by the same keys.
"""

from __future__ import annotations

from typing import Any

from ..errors import ClusterError, OptionError
from .cluster import RayExecutor, _import_ray, gpu_resource
from .jobs import Executor, ExploreJob, Measured, MeasureJob, VerifyJob
from .local import LocalExecutor


def resolve(executor: Any) -> Executor:
    """``superopt``'s ``executor`` argument as an Executor: None or ``"local"`` -> local
    processes, ``"ray"`` -> :class:`RayExecutor` (``$RAY_ADDRESS`` or a connection made
    earlier, else a local instance), an :class:`Executor` -> itself."""
    if executor is None or executor == "local":
        return LocalExecutor()
    if isinstance(executor, str) and executor == "ray":
        _import_ray()
        return RayExecutor()
    if isinstance(executor, RayExecutor):
        _import_ray()
    if isinstance(executor, Executor):
        return executor
    raise OptionError(f"superopt: executor must be 'local', 'ray' or an Executor "
                      f"(LocalExecutor(), RayExecutor(address)), got {executor!r}")


__all__ = ["Executor", "LocalExecutor", "RayExecutor", "ClusterError", "resolve", "gpu_resource",
           "ExploreJob", "VerifyJob", "MeasureJob", "Measured"]
