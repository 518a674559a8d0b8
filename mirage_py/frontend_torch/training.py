"""Training through compiled modules: forward and backward superoptimised (issue #33, item 2).

A call that autograd needs (grad mode on, an input or parameter requiring grad; see
:func:`.autograd.needs_autograd`) goes through AOTAutograd: the module, as a function of its
parameters, buffers and tensor arguments, is traced to a joint forward/backward aten graph (the
decomposition table of :mod:`.capture`, so ``*_backward`` operators arrive decomposed), which the
min-cut partitioner splits into a forward graph (returning the outputs and the saved
activations) and a backward graph (saved activations and output gradients -> input gradients).
Each of the two graphs is then one more captured graph: :class:`PassGraph` captures it at the
concrete shapes of its first call and hands it to :class:`~.runtime.CompiledCapture` -- regions,
``mp.superopt`` search, verification and numerics exactly as for an inference capture; operators
the table cannot express run eagerly per node. AOTAutograd wraps the two in an
``autograd.Function``, so the outputs carry autograd history.

:class:`Training` is the choice between that (``"superopt"``, the default) and running the
whole module eagerly (``"eager"``: item 1's fallback, one warning and a ``report()`` line). A
module AOTAutograd cannot trace (data-dependent control flow, an operator without a derivative)
falls back to eager too, with the reason in the report.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import OptionError
from .autograd import EagerGradFallback
from .backend import DynamoCompiled
from .capture import decomposition_table
from .classify import identifier
from .dynamic import Dynamic
from .runtime import CompiledCapture


class Training(enum.Enum):
    """What a call that autograd needs runs: ``superopt`` -- the forward and backward graphs of
    AOTAutograd, superoptimised; ``eager`` -- the whole module in eager PyTorch."""

    SUPEROPT = "superopt"
    EAGER = "eager"

    @classmethod
    def parse(cls, value: Any) -> "Training":
        if isinstance(value, cls):
            return value
        try:
            return cls(value)
        except ValueError:
            raise OptionError(f"compile: training={value!r}; choose one of "
                              f"{', '.join(repr(t.value) for t in cls)}") from None


class Pass(enum.Enum):
    """Which of AOTAutograd's two graphs a :class:`PassGraph` runs."""

    FORWARD = "forward"
    BACKWARD = "backward"


class PassGraph(DynamoCompiled):
    """One of AOTAutograd's graphs (forward or backward), superoptimised per concrete signature
    at its first call like a Dynamo graph. AOTAutograd calls it with grad mode off (inside its
    ``autograd.Function``), so its regions run. ``names``: readable names of the placeholders
    (parameters by their qualified names), ``kinds``: "parameter", "buffer" or "user"."""

    def __init__(self, gm: Any, options: dict[str, Any], dynamic: Any, which: Pass,
                 names: list[str], kinds: list[str]):
        super().__init__(gm, options, dynamic)
        self.which = which
        self.names, self.kinds = names, kinds
        self.saved = 0  # forward: the activations it saves for the backward
        self.failed = ""  # why the capture of this graph failed (it then runs as traced)
        self.record = False  # run as traced and keep the first call's arguments (``recorded``)
        self.recorded: tuple | None = None

    def __call__(self, *args: Any) -> Any:
        if self.record:
            if self.recorded is None:
                self.recorded = tuple(args)
            return self.gm(*args)
        if self.failed:
            return self.gm(*args)
        try:
            return super().__call__(*args)
        except OptionError:
            raise
        except Exception as e:  # noqa: BLE001 -- the graph runs as traced, the report says why
            if self.graphs:  # a compiled graph failed while running: a real error
                raise
            self.failed = _first_line(e)
            return self.gm(*args)

    def compile_recorded(self) -> CompiledCapture:
        """Capture and superoptimise the graph at the recorded call's arguments, without running
        its regions (see :func:`trace_training`)."""
        from .runtime import float32_matmul_of, signature_of
        args = self.recorded
        if args is None:
            raise OptionError(f"{self.which.value} graph: no call was recorded")
        return self._compile(args, signature_of(list(args), "dynamo") +
                             (float32_matmul_of(self.options),))

    def _compile(self, args: tuple, sig: tuple) -> CompiledCapture:
        g = super()._compile(args, sig)
        g.name = f"{self.which.value}"
        return g

    def report(self) -> str:
        head = f"{self.which.value} graph" + (f" ({self.saved} saved activation(s))"
                                              if self.which is Pass.FORWARD else "")
        if self.failed:
            return f"{head}: runs as traced (capture failed: {self.failed})"
        return f"{head}: " + super().report()


def _boxed(fn: Any) -> Any:
    from torch._functorch.aot_autograd import make_boxed_func
    return make_boxed_func(fn)


def _backward_names(gm: Any, primal_names: list[str], primal_kinds: list[str]
                    ) -> tuple[list[str], list[str]]:
    """The backward graph's placeholders: ``primals_i`` saved as they are get the forward's
    name and kind, the other saved activations and the ``tangents_i`` their node names."""
    names, kinds = [], []
    for ph in (n for n in gm.graph.nodes if n.op == "placeholder"):
        nm, kind = ph.name, "user"
        if ph.name.startswith("primals_"):
            i = int(ph.name.split("_")[1]) - 1
            if 0 <= i < len(primal_names):
                nm, kind = primal_names[i], primal_kinds[i]
        names.append(nm)
        kinds.append(kind)
    return names, kinds


@dataclass
class AotCompiled:
    """The forward and backward :class:`PassGraph` s AOTAutograd made for one traced signature:
    ``fn`` is AOTAutograd's differentiable function, the compilers make the two graphs."""

    options: dict[str, Any]
    dynamic: Dynamic
    names: list[str]  # the forward's placeholders: state, then tensor arguments
    kinds: list[str]
    forward: PassGraph | None = None
    backward: PassGraph | None = None
    user_outputs: int = 0  # the traced function's outputs (the forward graph's first ones)
    fn: Any = None
    record: bool = False  # the graphs run as traced, recording their inputs (trace_training)

    def fw_compiler(self, gm: Any, example_inputs: list) -> Any:
        self.forward = PassGraph(gm, self.options, self.dynamic, Pass.FORWARD,
                                 [identifier(n) for n in self.names], self.kinds)
        out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        self.forward.saved = max(0, len(out) - self.user_outputs)
        self.forward.record = self.record
        return _boxed(self.forward)

    def bw_compiler(self, gm: Any, example_inputs: list) -> Any:
        names, kinds = _backward_names(gm, self.names, self.kinds)
        self.backward = PassGraph(gm, self.options, self.dynamic, Pass.BACKWARD,
                                  [identifier(n) for n in names], kinds)
        self.backward.record = self.record
        return _boxed(self.backward)

    def passes(self) -> list[PassGraph]:
        return [p for p in (self.forward, self.backward) if p is not None]

    def captures(self) -> list[CompiledCapture]:
        return [g for p in self.passes() for g in p.graphs.values()]

    def report(self) -> str:
        return "\n".join(p.report() for p in self.passes())


def _partition() -> dict[str, Any]:
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    return dict(partition_fn=min_cut_rematerialization_partition,
                decompositions=decomposition_table())


def _attention_as_math() -> Any:
    """While tracing for training: ``scaled_dot_product_attention`` as its math form (matmuls,
    softmax), whose derivatives are matmuls and a softmax backward that regions express; the
    fused CPU / CUDA attention kernels have backward operators of their own that would run
    eagerly. The forward then saves the attention probabilities (as the math form does)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel(SDPBackend.MATH)


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"


@dataclass
class TrainingPath:
    """The differentiable path of one compiled module or Dynamo graph: per call signature (with
    which tensors require grad), the function traced by AOTAutograd with its forward and backward
    superoptimised. ``training="eager"``, or a function AOTAutograd could not trace, runs the
    original eagerly instead (item 1's fallback: one warning, a report line)."""

    name: str
    options: dict[str, Any]
    dynamic: Dynamic
    training: Training = Training.SUPEROPT
    compiled: dict[tuple, AotCompiled] = field(default_factory=dict)
    outputs: "dict[tuple, _OutputLayout]" = field(default_factory=dict)
    refused: dict[tuple, str] = field(default_factory=dict)  # signature -> why it runs eagerly
    fallback: EagerGradFallback = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.fallback is None:
            self.fallback = EagerGradFallback(self.name)

    def call_module(self, module: Any, args: tuple, kwargs: dict, state_sig: tuple) -> Any:
        """``module(*args, **kwargs)`` with autograd history (``mp.compile``); ``state_sig``: what
        else the module's capture specialises on (its train mode, parameter shapes, ...)."""
        from torch.utils._pytree import tree_flatten
        leaves, in_spec = tree_flatten((tuple(args), dict(kwargs)))
        state = dict(module.named_parameters())
        state.update(dict(module.named_buffers()))
        sig = _grad_signature(leaves, in_spec, list(state.values())) + (state_sig,)
        if self._eager(sig):
            return module(*args, **kwargs)
        tensor_at = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
        aot = self.compiled.get(sig) or self._trace_module(module, leaves, in_spec, tensor_at,
                                                           list(state), sig)
        out = self._run(aot, sig, list(state.values()) + [leaves[i] for i in tensor_at])
        if out is None:
            return module(*args, **kwargs)
        return self.outputs[sig].rebuild(list(out))

    def call_graph(self, gm: Any, args: tuple, names: list[str], kinds: list[str]) -> Any:
        """Dynamo's graph ``gm`` on ``args`` with autograd history (the ``torch.compile``
        backend): AOTAutograd over the graph, as torch's ``aot_eager`` backend does."""
        sig = _grad_signature(list(args), "dynamo", [])
        if self._eager(sig):
            return gm(*args)
        aot = self.compiled.get(sig)
        if aot is None:
            from torch._functorch.aot_autograd import aot_module_simplified
            lifted = [n for n, _ in gm.named_parameters()] + [n for n, _ in gm.named_buffers()]
            n_par = len(list(gm.named_parameters()))
            aot = AotCompiled(self.options, self.dynamic, lifted + list(names),
                              ["parameter"] * n_par + ["buffer"] * (len(lifted) - n_par)
                              + list(kinds))
            outs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
            aot.user_outputs = len(outs) if isinstance(outs, (list, tuple)) else 1
            try:
                with _attention_as_math():
                    aot.fn = aot_module_simplified(gm, list(args), fw_compiler=aot.fw_compiler,
                                                   bw_compiler=aot.bw_compiler, **_partition())
            except Exception as e:  # noqa: BLE001 -- AOTAutograd refused the graph
                self.refused[sig] = _first_line(e)
                self._eager(sig)
                return gm(*args)
            self.compiled[sig] = aot
        out = self._run(aot, sig, list(args))
        return gm(*args) if out is None else out

    def _eager(self, sig: tuple) -> bool:
        """Does this call run eagerly? If so it is counted (the first one warns)."""
        if self.training is Training.EAGER:
            self.fallback.why = 'training="eager" was asked'
        elif sig in self.refused:
            self.fallback.why = f"AOTAutograd could not trace it ({self.refused[sig]})"
        else:
            return False
        self.fallback.note_call()
        return True

    def _run(self, aot: AotCompiled, sig: tuple, values: list) -> Any:
        """AOTAutograd's function on ``values``; None when it refused to trace (the caller runs
        eagerly, this signature from now on too)."""
        try:
            return aot.fn(*values)
        except OptionError:
            raise
        except Exception as e:  # noqa: BLE001 -- refused while tracing: run eagerly
            if aot.forward is not None:  # traced and compiled: an error of the run itself
                raise
            self.refused[sig] = _first_line(e)
            self.compiled.pop(sig, None)
            self._eager(sig)
            return None

    def _trace_module(self, module: Any, leaves: list, in_spec: Any, tensor_at: list[int],
                      state_names: list[str], sig: tuple) -> AotCompiled:
        from torch.utils._pytree import tree_flatten, tree_unflatten
        from .capture import user_input_names
        n_par = len(list(module.named_parameters()))
        fn = getattr(module, "_mirage_function", None) or module.forward
        args, kwargs = tree_unflatten(leaves, in_spec)
        arg_names = user_input_names(fn, args, kwargs)
        aot = AotCompiled(self.options, self.dynamic, state_names +
                          [arg_names[i] if i < len(arg_names) else f"arg{i}" for i in tensor_at],
                          ["parameter"] * n_par + ["buffer"] * (len(state_names) - n_par)
                          + ["user"] * len(tensor_at))
        n = len(state_names)

        def f(*values: Any) -> Any:
            now = list(leaves)
            for i, v in zip(tensor_at, values[n:]):
                now[i] = v
            a, k = tree_unflatten(now, in_spec)
            with _attention_as_math():
                out = torch.func.functional_call(module, dict(zip(state_names, values[:n])), a,
                                                 k)
            flat, spec = tree_flatten(out)
            self.outputs[sig] = _OutputLayout.of(flat, spec)
            tensors = [v for v in flat if isinstance(v, torch.Tensor)]
            aot.user_outputs = len(tensors)
            return tensors

        from torch._functorch.aot_autograd import aot_function
        aot.fn = aot_function(f, fw_compiler=aot.fw_compiler, bw_compiler=aot.bw_compiler,
                              **_partition())
        self.compiled[sig] = aot
        return aot

    def searches(self) -> int:
        """Region searches of the forward and backward captures (as ``CompiledCapture``)."""
        return sum(g.searches() for g in self.captures())

    def captures(self) -> list[CompiledCapture]:
        """Every forward and backward capture compiled so far."""
        return [g for a in self.compiled.values() for g in a.captures()]

    def region_rows(self) -> list[dict[str, Any]]:
        """``CompiledCapture.region_rows`` of every forward and backward capture, each row with
        ``pass`` ("forward" / "backward")."""
        return [dict(row, **{"pass": p.which.value}) for a in self.compiled.values()
                for p in a.passes() for g in p.graphs.values() for row in g.region_rows()]

    def report(self) -> str:
        """The training lines of ``report()``: each traced signature's forward and backward
        graphs (regions, kernels, verification, saved activations), the eager calls and why."""
        lines = []
        for i, a in enumerate(self.compiled.values()):
            lines.append(f"training signature {i + 1} (forward + backward through AOTAutograd):")
            lines.extend("  " + ln for ln in a.report().splitlines())
        dropped = sorted({d for o in self.outputs.values() for d in o.dropped})
        if dropped:
            lines.append(f"training: output(s) of type {', '.join(dropped)} come back as None "
                         "(objects built while tracing cannot be returned; a KV cache is not "
                         "needed to train)")
        for why in self.refused.values():
            lines.append(f"training: AOTAutograd could not trace {self.name} ({why}); it runs "
                         "eagerly")
        if self.fallback.report_line():
            lines.append(self.fallback.report_line())
        return "\n".join(lines)


@dataclass
class _OutputLayout:
    """Where a traced function's tensor outputs go in its output structure; its other leaves
    are Python constants kept from the trace, or objects (a transformers ``DynamicCache``)
    that come back as None."""

    spec: Any
    leaves: list[Any]  # the non-tensor leaves (None where dropped), _TENSOR where a tensor goes
    dropped: list[str]  # type names of the objects returned as None

    @classmethod
    def of(cls, flat: list, spec: Any) -> "_OutputLayout":
        leaves, dropped = [], []
        for v in flat:
            if isinstance(v, torch.Tensor):
                leaves.append(_TENSOR)
            elif v is None or isinstance(v, (bool, int, float, str)):
                leaves.append(v)
            else:
                leaves.append(None)
                dropped.append(type(v).__name__)
        return cls(spec, leaves, dropped)

    def rebuild(self, tensors: list) -> Any:
        from torch.utils._pytree import tree_unflatten
        it = iter(tensors)
        return tree_unflatten([next(it) if v is _TENSOR else v for v in self.leaves], self.spec)


_TENSOR = object()  # marks a tensor leaf in an _OutputLayout


def trace_training(module: Any, args: tuple, options: dict[str, Any],
                   cotangent_seed: int = 0) -> AotCompiled:
    """The forward and backward graphs of ``module(*args)`` (AOTAutograd, as a training call
    makes them), captured and superoptimised without running their regions on the CPU
    interpreter: one eager run of the two aten graphs -- the outputs' gradients random, from
    ``cotangent_seed`` -- records each graph's real inputs, then each is compiled at them.
    For benchmarks at sizes the interpreter is too slow for (a Llama layer at 8B size)."""
    path = TrainingPath(type(module).__name__, dict(options), Dynamic.NEVER)
    leaves, in_spec = _flat(args)
    state = dict(module.named_parameters())
    state.update(dict(module.named_buffers()))
    tensor_at = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    sig = _grad_signature(leaves, in_spec, list(state.values()))
    aot = path._trace_module(module, leaves, in_spec, tensor_at, list(state), sig)
    aot.record = True
    with _attention_as_math():
        out = aot.fn(*(list(state.values()) + [leaves[i] for i in tensor_at]))
    g = torch.Generator().manual_seed(cotangent_seed)
    outs = [o for o in out if o.requires_grad]
    torch.autograd.backward(outs, [torch.randn(o.shape, generator=g).to(o.dtype) for o in outs])
    for p in aot.passes():
        p.record = False
        p.compile_recorded()
    return aot


def _flat(args: tuple) -> tuple[list, Any]:
    from torch.utils._pytree import tree_flatten
    return tree_flatten((tuple(args), {}))


def _grad_signature(leaves: list, spec: Any, state: list) -> tuple:
    """A training call's key: the inputs' signature and which tensors (inputs, then state)
    require grad -- AOTAutograd's graphs differ by both."""
    from .runtime import signature_of
    return signature_of(leaves, spec) + (tuple(
        bool(getattr(v, "requires_grad", False)) for v in list(leaves) + list(state)),)


__all__ = ["Training", "Pass", "PassGraph", "AotCompiled", "TrainingPath", "trace_training"]
