"""``mp.from_torch`` and ``mp.compile``."""

from __future__ import annotations

from typing import Any

import numpy as np

import torch

from ..errors import OptionError, TorchCaptureError
from ..lax.ops import INDEX_DTYPES
from ..lax.program import Program
from .capture import capture, own_forward
from .dynamic import DimRange, Dynamic, dim_ranges, grown_examples, out_of_range
from .whole_program import whole_program
from .autograd import needs_autograd
from .kv_cache import CachedGeneration
from .runtime import CompiledCapture, describe_signature, float32_matmul_of, signature_of


def _torch() -> Any:
    return torch


def _split_examples(example_inputs: Any, example_kwargs: Any) -> tuple[tuple, dict]:
    torch = _torch()
    if isinstance(example_inputs, torch.Tensor):
        args = (example_inputs,)
    elif isinstance(example_inputs, dict) and example_kwargs is None:
        return (), dict(example_inputs)
    elif isinstance(example_inputs, (tuple, list)):
        args = tuple(example_inputs)
    elif example_inputs is None:
        args = ()
    else:
        raise OptionError(f"example_inputs must be a tensor, a tuple of positional arguments or "
                          f"a dict of keyword arguments, got {type(example_inputs).__name__}")
    if example_kwargs is not None and not isinstance(example_kwargs, dict):
        raise OptionError(f"example_kwargs must be a dict, got {type(example_kwargs).__name__}")
    return args, dict(example_kwargs or {})


def _name_of(fn_or_module: Any) -> str:
    return type(fn_or_module).__name__ if isinstance(fn_or_module, _torch().nn.Module) else \
        getattr(fn_or_module, "__name__", "function")


class TorchProgram(Program):
    """A :class:`~mirage_py.Program` captured from PyTorch. ``torch_names`` maps each program
    input to the name it has in PyTorch: the qualified name of a parameter or buffer
    (``gate_proj.weight``, which a program spells ``gate_proj_weight``), the forward's argument
    name, or ``<constant>`` for a constant tensor made at capture time (a rotary position table
    from ``arange``), whose value ``constants`` keeps."""

    torch_names: dict[str, str]
    constants: dict[str, Any]  # inputs holding constant tensors made at capture (torch values)
    capture_method: str

    def bind(self, module: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The program's inputs as NumPy arrays (float32 for bfloat16) from ``module``'s current
        parameters and buffers and the call's arguments: ``p.evaluate(p.bind(m, x))``."""
        torch = _torch()
        from torch.utils._pytree import tree_flatten
        from .capture import user_input_names
        fn = module.forward if isinstance(module, torch.nn.Module) else module
        leaves, _ = tree_flatten((tuple(args), dict(kwargs)))
        by_arg = dict(zip(user_input_names(fn, args, kwargs), leaves))
        state = {}
        if isinstance(module, torch.nn.Module):
            state.update(dict(module.named_parameters()))
            state.update(dict(module.named_buffers()))
        out = {}
        for t in self.inputs:
            src = self.torch_names.get(t.name, t.name)
            v = self.constants.get(t.name) if src == "<constant>" else \
                state.get(src, by_arg.get(src))
            if v is None:
                raise TorchCaptureError(f"bind: no parameter, buffer or argument named {src!r} "
                                        f"for program input {t.name!r}")
            v = v.detach().to("cpu")
            if t.dtype in INDEX_DTYPES:  # token ids: the integers themselves
                out[t.name] = v.numpy().astype(np.int64, copy=False)
                continue
            out[t.name] = (v.float() if v.dtype in (torch.bfloat16, torch.bool) or
                           not (v.dtype.is_floating_point) else v).numpy()
        return out


def from_torch(fn_or_module: Any, example_inputs: Any, example_kwargs: dict | None = None, *,
               name: str | None = None, database: Any = False) -> TorchProgram:
    """Capture ``fn_or_module(*example_inputs, **example_kwargs)`` as one :class:`Program`.

    Capture is ``torch.export`` (``make_fx`` where export fails) decomposed to aten with the
    table of :func:`mirage_py.frontend_torch.decomposition_table`; every aten node is mapped onto
    the operator table (docs/torch.md lists the mapping). Parameters and buffers become inputs
    named by their qualified names (``gemm.weight`` -> ``gemm_weight``; ``torch_names`` keeps the
    original), user inputs by the forward's argument names; shapes and dtypes come from the
    examples. Outputs are ``out0, out1, ...`` in the order of the flattened result.

    A graph that uses an operator the table cannot express raises
    :class:`~mirage_py.errors.UnsupportedOperatorError` naming the aten operator, the node, the
    module path and the source line (``mp.compile`` runs such operators eagerly instead). float64
    tensors are such a case: programs hold float16, bfloat16 and float32.

    float32 matmuls carry PyTorch's ``torch.get_float32_matmul_precision()`` ("high": TF32,
    "medium": bfloat16 tensor cores; nothing for the default "highest"), so the program computes
    what PyTorch would.

    ``database`` (superopt's argument: None the default results database, a path; False, the
    default, none) keeps the exported graph there and answers the same capture from it
    (``capture_cache.py``).
    """
    args, kwargs = _split_examples(example_inputs, example_kwargs)
    cap = capture(fn_or_module, args, kwargs, database)
    p, names, constants = whole_program(cap, name or _name_of(fn_or_module))
    p = p.with_float32_matmul(_torch().get_float32_matmul_precision())
    tp = TorchProgram.__new__(TorchProgram)
    tp.__dict__.update(p.__dict__)
    tp.torch_names = names
    tp.constants = constants
    tp.capture_method = cap.method
    return tp


class CompiledModule(torch.nn.Module):
    """``module`` with its supported regions superoptimised (see :func:`compile`).

    ``module`` is a submodule: its parameters and buffers are this module's, and they are read at
    every call. A call with new shapes, dtypes or argument structure captures and superoptimises
    again (one :class:`~.runtime.CompiledCapture` per signature in ``graphs``)."""

    def __init__(self, module: Any, options: dict[str, Any], name: str,
                 dynamic: Any = None, dynamic_shapes: Any = None, training: Any = "superopt",
                 capture_cache: bool = True):
        super().__init__()
        self.module = module
        self._options = dict(options)
        # where captured graphs are kept and looked up (capture_cache.py): superopt's database
        self._capture_db = options.get("database") if capture_cache else False
        self._name = name
        self.dynamic = Dynamic.parse(dynamic)
        self._dynamic_shapes = dynamic_shapes
        self._ranges: list[DimRange] | None = None  # the user's dynamic dims, from the 1st call
        self.graphs: dict[tuple, CompiledCapture] = {}
        self.why: dict[tuple, str] = {}  # per signature: why it was captured
        from .training import Training, TrainingPath  # autograd hook (#33)
        self._training = TrainingPath(name, self._options, self.dynamic,
                                      Training.parse(training))
        self._cached: CachedGeneration | None = None  # generate() with a KV cache

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        from torch.utils._pytree import tree_flatten, tree_unflatten
        leaves, spec = tree_flatten((tuple(args), dict(kwargs)))
        # autograd hook (#33): outputs autograd needs are never detached: forward and backward
        # through AOTAutograd, superoptimised (or the module eagerly with training="eager")
        if needs_autograd(list(leaves) + list(self.module.parameters())):
            with own_forward(self.module):  # generate() may route forward here
                return self._training.call_module(self.module, args, kwargs,
                                                  self._state_signature())
        sig = signature_of(leaves, spec) + (self._state_signature(),)
        g = self.graphs.get(sig)
        if g is None:
            g = self._compile(args, kwargs, sig)
        cap = g.cap
        state = {}
        for role in cap.roles:
            if role.kind == "parameter":
                state[role.node] = self.module.get_parameter(role.name)
            elif role.kind == "buffer":
                state[role.node] = self.module.get_buffer(role.name)
            elif role.kind == "constant":
                state[role.node] = cap.constants[role.node]
            else:
                state[role.node] = leaves[role.index]
        if not g.masks_hold(state):  # a mask buffer changed since the capture: capture again
            g = self._compile(args, kwargs, sig)
        outs = g.run(state)
        with torch.no_grad():
            for pos, kind, target in cap.mutations:
                if kind == "BUFFER_MUTATION":
                    self.module.get_buffer(target).copy_(outs[pos])
                else:
                    role = next(r for r in cap.roles if r.node == target)
                    leaves[role.index].copy_(outs[pos])
        return tree_unflatten([outs[i] for i in cap.outputs], cap.out_spec)

    def _state_signature(self) -> tuple:
        """What else a capture specialises on: train / eval mode, PyTorch's float32 matmul
        precision (when the options do not fix one), the parameters' and buffers' shapes and
        dtypes (``model.half()`` after compiling captures again)."""
        return (self.module.training, float32_matmul_of(self._options)) + tuple(
            (n, tuple(t.shape), str(t.dtype)) for n, t in
            list(self.module.named_parameters()) + list(self.module.named_buffers()))

    def _compile(self, args: tuple, kwargs: dict, sig: tuple) -> CompiledCapture:
        from torch.utils._pytree import tree_flatten, tree_unflatten
        with own_forward(self.module):
            cap = capture(self.module, args, kwargs, self._capture_db)
        names = [r.name for r in sorted((r for r in cap.roles if r.kind == "user"),
                                        key=lambda r: r.index)]
        leaves, spec = tree_flatten((tuple(args), dict(kwargs)))
        if self._ranges is None:
            from .capture import user_input_names
            with own_forward(self.module):
                fn = getattr(self.module, "_mirage_function", None) or self.module.forward
                self._ranges = dim_ranges(user_input_names(fn, args, kwargs), leaves,
                                          self._dynamic_shapes)
        dynamic, companions = self.dynamic, []
        why = "first call" if not self.graphs else "new signature"
        outside = out_of_range(self._ranges, leaves)
        if outside is not None and dynamic is not Dynamic.NEVER:
            dynamic, why = Dynamic.NEVER, f"static: {outside}"
        elif dynamic is Dynamic.ALWAYS and not self.graphs:
            for grown in grown_examples(leaves, self._ranges):
                a, k = tree_unflatten(grown, spec)
                try:
                    with own_forward(self.module):
                        companions.append(capture(self.module, a, k, self._capture_db))
                except Exception:  # noqa: BLE001 -- the module or its capture refused these
                    continue  # sizes: the next candidate grows fewer dims
        g = CompiledCapture(cap, self._name, self._options, describe_signature(sig, names),
                            dynamic=dynamic, companions=companions)
        self.graphs[sig] = g
        self.why[sig] = why
        return g

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """transformers' ``generate`` of the wrapped model, every forward step running compiled
        code. With its default cache (``use_cache`` not False) each step is a compiled
        :class:`~.kv_cache.CachedStep` over transformers' own ``DynamicCache`` (prefill and decode
        apart; shape families over the cache length, so no search per token unless
        ``dynamic=False``); with ``use_cache=False`` each step runs this compiled module over the
        whole prefix, a new sequence length each time."""
        gen = getattr(self.module, "generate", None)
        if gen is None:
            raise OptionError(f"compile: {self._name} has no generate() (not a transformers "
                              "generation model)")
        module = self.module
        if kwargs.get("use_cache", True) is False:
            module.forward = self.__call__  # generate calls self(...): route it here
        else:
            if self._cached is None:
                self._cached = CachedGeneration(module, self._compiled_step)
            module.forward = self._cached
        try:
            return gen(*args, **kwargs)
        finally:
            del module.forward

    def _compiled_step(self, step: Any, dynamic_shapes: dict, kind: str) -> "CompiledModule":
        """A compiled :class:`~.kv_cache.CachedStep` with this module's options and dynamic."""
        return CompiledModule(step, self._options, f"{self._name}_{kind}",
                              dynamic=self.dynamic.value, dynamic_shapes=dynamic_shapes,
                              capture_cache=self._capture_db is not False)

    def searches(self) -> int:
        """Region searches run over every signature compiled so far (a shape family counts
        once; regions answered by a family, the memory cache or the database count 0)."""
        steps = self._cached.steps.values() if self._cached is not None else ()
        return sum(g.searches() for g in self.graphs.values()) + \
            sum(s.searches() for s in steps) + \
            self._training.searches()  # autograd hook (#33)

    def report(self) -> str:
        """Per compiled signature: the regions (aten nodes, inputs, outputs), kernels naive ->
        found, predicted time and verification bound of each; the operators run eagerly and
        why."""
        lines = [f"mirage_py compile: {self._name}, {len(self.graphs)} signature(s), "
                 f"{self.searches()} region search(es), dynamic={self.dynamic.value}"]
        for sig, g in self.graphs.items():
            lines.append(f"[{self.why.get(sig, '')}] " + g.report())
        if self._training.report():  # autograd hook (#33)
            lines.append(self._training.report())
        for kind, step in (self._cached.steps.items() if self._cached is not None else ()):
            lines.append(f"generate() with a KV cache, {kind} step:")
            lines.append(step.report())
        return "\n".join(lines)

    def regions(self) -> list[dict[str, Any]]:
        """One dict per region of every compiled signature: ``kernels_naive``, ``kernels``,
        ``naive_us``, ``us``, ``verified``, ``bound``, ``nodes``, ``inputs``, ``outputs``."""
        return [row for g in self.graphs.values() for row in g.region_rows()]

    def training_regions(self) -> list[dict[str, Any]]:  # autograd hook (#33)
        """:meth:`regions` of the training calls' forward and backward graphs, each row with
        ``pass`` ("forward" or "backward")."""
        return self._training.region_rows()

    def eager_ops(self) -> list[dict[str, str]]:
        """The operators run by PyTorch: ``op``, ``node``, ``module``, ``location``, ``reason``."""
        return [row for g in self.graphs.values() for row in g.eager_rows()]


def compile(module: Any, example_inputs: Any = None, example_kwargs: dict | None = None,  # noqa: A001
            *, dynamic: bool | None = None, dynamic_shapes: Any = None,
            training: str = "superopt", capture_cache: bool = True,
            **superopt_options: Any) -> Any:
    """``module`` with its supported regions superoptimised, as a ``torch.nn.Module``.

    The captured graph (see :func:`from_torch`) is cut into maximal regions of supported
    operators; each region becomes a program and goes through ``mp.superopt`` with
    ``superopt_options`` (``time_budget_s``, ``workers``, ``database``, ``target``, ``seed``, ...).
    The returned module's forward runs each region's kernels on CUDA tensors (CuPy, DLPack, no
    copies), the μGraph interpreter on CPU tensors, and eager PyTorch for the operators in
    between. Parameters are read at every call.

    Shapes (docs/torch.md "Shapes that vary"): a call with other shapes captures again (under a
    second for a small model) but searches only what no shape family answers. ``dynamic`` has
    torch.compile's meaning: ``None`` -- the first compile is static, the first shape change
    makes the sizes that changed symbolic (one more search per region); ``True`` -- symbolic
    from the first compile (the graph is also captured with its dynamic dims grown); ``False``
    -- one search per shape. ``dynamic_shapes`` (argument name -> {axis: ``torch.export.Dim``
    or ``(lo, hi)``}) or ``torch._dynamo.mark_dynamic`` on the examples name the dynamic dims
    and their ranges; a call outside a range compiles that shape statically (the report says
    why). A new dtype is a new structure: it searches. Every size a family serves is verified
    the first time it runs. ``.report()`` describes what was found and counts the searches. With
    ``example_inputs=None`` compilation waits for the first call.

    Training (docs/torch.md "Training"): a call that autograd needs (grad mode on, an input or
    parameter requiring grad) returns differentiable outputs. ``training="superopt"`` (default):
    AOTAutograd's forward and backward graphs, each superoptimised like an inference capture;
    ``training="eager"``: the whole module runs eagerly (one warning, a ``report()`` line).

    Seen before (docs/torch.md "Compile caches"): the exported graph is kept in superopt's
    results database (``database``; none with ``database=False`` or ``capture_cache=False``)
    under a key of the module's code, state and call signature, so another process compiling
    the same module at the same shapes skips ``torch.export`` as well as the searches."""
    torch = _torch()
    if not isinstance(module, torch.nn.Module):
        from .capture import as_module
        module = as_module(module)
    name = getattr(getattr(module, "_mirage_function", None), "__name__", None) or \
        type(module).__name__
    _check_options(superopt_options)
    cm = CompiledModule(module, superopt_options, name, dynamic, dynamic_shapes, training,
                        capture_cache)
    if example_inputs is not None or example_kwargs is not None:
        args, kwargs = _split_examples(example_inputs, example_kwargs)
        from torch.utils._pytree import tree_flatten
        leaves, spec = tree_flatten((args, kwargs))
        cm._compile(args, kwargs, signature_of(leaves, spec) + (cm._state_signature(),))
    return cm


def _check_options(options: dict[str, Any]) -> None:
    import inspect
    from ..superopt import superopt
    known = set(inspect.signature(superopt).parameters) - {"program"}
    bad = sorted(set(options) - known)
    if bad:
        raise OptionError(f"compile: unknown option(s) {', '.join(bad)}; superopt takes "
                          f"{', '.join(sorted(known))}")


__all__ = ["from_torch", "compile", "TorchProgram", "CompiledModule"]
