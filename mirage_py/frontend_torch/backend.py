"""The ``torch.compile`` backend: ``torch.compile(model, backend="mirage_py")``.

Dynamo hands the backend an FX graph of torch-level calls whose placeholders are every tensor the
frame reads -- user inputs and, with Dynamo's default of inlining built-in modules, the
parameters and buffers too -- plus example inputs. The backend returns a callable that, per
concrete input signature (shapes, dtypes), captures the graph to aten with ``make_fx`` (the
decomposition table of :mod:`.capture`, functionalized), cuts it into regions, superoptimises each
and runs them as :func:`mirage_py.compile` does. Since the parameters arrive as arguments on every
call, a changed weight is used.

Guards and recompiles: Dynamo guards the compiled frame on the inputs' shapes, dtypes and the
other facts it specialised on; a call that fails a guard makes Dynamo trace again and call the
backend again with the new graph. Each such compile superoptimises its regions, but a region
seen before (same program structure and options) comes back from the in-memory cache at once,
and one seen by another process from superopt's results database without a search. When Dynamo
marks dims dynamic after a shape change (its "automatic dynamic shapes"), the graph it passes
has symbolic sizes: the backend captures it at each concrete shape (make_fx, fast) and answers
each region from a shape family where one fits (frontend_torch/dynamic.py): the region met at
a second shape -- in Dynamo's static graph of the first shape and its symbolic graph of the
second -- gets one family search, and later shapes search nothing. ``dynamic=False`` (through
``functools.partial(mirage_backend, dynamic=False)``) searches every shape instead.
"""

from __future__ import annotations

import re
from typing import Any

import torch  # noqa: F401 -- this module is torch's backend: torch must be there

from .autograd import needs_autograd
from .capture import capture_graph_module
from .classify import identifier
from .dynamic import Dynamic
from .runtime import CompiledCapture, float32_matmul_of, signature_of

NAME = "mirage_py"


def _placeholders(gm: Any) -> tuple[list[str], list[str]]:
    """Readable names of Dynamo's placeholders (``gemm.weight`` for a parameter, ``x`` for an
    argument; Dynamo's own names where its source cannot be read) and their kinds ("parameter",
    "buffer" or "user")."""
    names, kinds = [], []
    for ph in (n for n in gm.graph.nodes if n.op == "placeholder"):
        nm, kind = ph.name, "user"
        try:
            src = ph.meta["grapharg"].source.name
            src = str(src() if callable(src) else src)
            kind = "parameter" if "_parameters[" in src else "buffer" if "_buffers[" in src \
                else "user"
            s = re.sub(r"^L\['self'\]\.?", "", src)
            s = re.sub(r"\.?_(?:modules|parameters|buffers)\['([^']+)'\]", r".\1", s)
            s = re.sub(r"^L\['([^']+)'\]", r"\1", s).strip(".")
            if s and re.fullmatch(r"[\w.\[\]']+", s):
                nm = s
        except (KeyError, AttributeError, TypeError):
            pass
        names.append(nm)
        kinds.append(kind)
    return names, kinds


class DynamoCompiled:
    """What the backend returns for one Dynamo graph: compiles per concrete signature on call."""

    def __init__(self, gm: Any, options: dict[str, Any], dynamic: Any = None,
                 training: Any = "superopt"):
        self.gm = gm
        self.options = dict(options)
        self.dynamic = Dynamic.parse(dynamic)
        self.names, self.kinds = _placeholders(gm)
        self.graphs: dict[tuple, CompiledCapture] = {}
        from .training import Training, TrainingPath  # autograd hook (#33)
        self._training = TrainingPath("dynamo", self.options, self.dynamic,
                                      Training.parse(training))

    def __call__(self, *args: Any) -> Any:
        from torch.utils._pytree import tree_unflatten
        if needs_autograd(args):  # autograd hook (#33): never return detached outputs
            return self._training.call_graph(self.gm, args, [identifier(n) for n in self.names],
                                             self.kinds)
        sig = signature_of(list(args), "dynamo") + (float32_matmul_of(self.options),)
        g = self.graphs.get(sig) or self._compile(args, sig)
        state = {r.node: args[r.index] for r in g.cap.roles}
        if not g.masks_hold(state):  # a mask buffer changed since the capture: capture again
            g = self._compile(args, sig)
            state = {r.node: args[r.index] for r in g.cap.roles}
        outs = g.run(state)
        return tree_unflatten([outs[i] for i in g.cap.outputs], g.cap.out_spec)

    def _compile(self, args: tuple, sig: tuple) -> CompiledCapture:
        """Capture the graph at these arguments' shapes and superoptimise it (kept for ``sig``)."""
        cap = capture_graph_module(self.gm, list(args), [identifier(n) for n in self.names],
                                   self.kinds)
        g = self.graphs[sig] = CompiledCapture(cap, "dynamo", self.options,
                                               _sig_text(sig, self.names), dynamic=self.dynamic)
        return g

    def report(self) -> str:
        lines = [g.report() for g in self.graphs.values()]
        if self._training.report():  # autograd hook (#33)
            lines.append(self._training.report())
        return "\n".join(lines)


def _sig_text(sig: tuple, names: list[str]) -> str:
    items = []
    for nm, p in zip(names, sig[1]):
        items.append(f"{nm}: {p[1]} {p[2]}" if p[0] == "T" else f"{nm}={p[1]}")
    return "(" + ", ".join(items) + ")"


#: every DynamoCompiled made in this process, newest last (for reports and tests)
COMPILED: list[DynamoCompiled] = []


def mirage_backend(gm: Any, example_inputs: list[Any], *, dynamic: bool | None = None,
                   training: str = "superopt", **options: Any) -> DynamoCompiled:
    """The ``torch.compile`` backend. ``options`` (``torch.compile(..., options={...})`` does not
    reach custom backends; use ``functools.partial(mirage_backend, time_budget_s=...)`` as the
    backend to pass superopt options) go to ``mp.superopt``; ``dynamic`` is ``mp.compile``'s
    (default None: a region met at a second shape gets a shape family, searched once);
    ``training`` is ``mp.compile``'s (calls autograd needs: "superopt" through AOTAutograd, or
    "eager")."""
    from .api import _check_options
    _check_options(options)
    compiled = DynamoCompiled(gm, options, dynamic, training)
    COMPILED.append(compiled)
    return compiled


def register() -> None:
    """Register ``"mirage_py"`` with Dynamo unless the package's ``torch_dynamo_backends`` entry
    point already provides it (Dynamo loads that one itself on first use)."""
    from torch._dynamo.backends import registry
    if NAME in registry._COMPILER_FNS:
        return
    try:
        registry._lazy_import()  # discovers entry points without loading them
    except Exception:  # noqa: BLE001 -- an older Dynamo: register directly
        pass
    if registry._BACKENDS.get(NAME) is not None:  # the installed entry point
        return
    registry.register_backend(compiler_fn=mirage_backend, name=NAME)


register()

__all__ = ["mirage_backend", "register", "DynamoCompiled", "COMPILED", "NAME"]
