"""Capture a PyTorch module or function as an aten-level FX graph.

``torch.export.export`` (non-strict) first, then ``run_decompositions`` with
:func:`decomposition_table`: PyTorch's core-aten table minus every operator the frontend maps as a
whole (``linear``, ``scaled_dot_product_attention``, ``layer_norm``, ``softmax``, ``silu``, ...,
see :data:`mirage_py.frontend_torch.aten.TABLE`), so those arrive as one node each and keep their
structure (a softmax with its max, an attention with its mask) instead of the decomposed forms.
Where export fails (data-dependent Python control flow, unsupported Python), ``make_fx`` traces the
module once with the real example inputs through ``torch.func.functional_call`` (parameters and
buffers as inputs) and ``torch.func.functionalize``, with the same table.

Every placeholder of the captured graph gets a role: ``parameter`` / ``buffer`` (named by its
qualified name, ``gemm.weight``, read from the module at every call), ``constant`` (a tensor
attribute that is neither: its value at capture time), or ``user`` (named by the forward's argument
name; nested inputs as ``name_0``, ``name_key``).

An exported graph is kept in the results database without its weights and answered from there
when the same module code, state and call signature come again, in this process or another
(``capture_cache.py``): a compile whose regions are all in the database then costs no export.
"""

from __future__ import annotations

import contextlib
import inspect
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

from ..errors import TorchCaptureError
from .aten import ASSERTS, TABLE, packet_name
from .capture_cache import CaptureCache


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - the test extra installs torch
        raise TorchCaptureError("the torch frontend needs PyTorch (pip install torch)") from e
    return torch


@dataclass
class InputRole:
    """One placeholder of the captured graph."""

    node: str  # the placeholder's name in the graph
    kind: str  # "parameter", "buffer", "constant", "user"
    name: str  # qualified name, argument name, or constant target
    index: int | None = None  # position among the flattened user inputs (kind "user")

    @property
    def static(self) -> bool:
        """Module state rather than a call argument (kept from call to call)."""
        return self.kind in ("parameter", "buffer", "constant")


@dataclass
class Captured:
    """An aten graph with its placeholders' roles, how to flatten inputs and rebuild outputs."""

    gm: Any  # torch.fx.GraphModule
    roles: list[InputRole]
    in_spec: Any  # pytree spec of (args, kwargs)
    out_spec: Any  # pytree spec of the user outputs
    outputs: list[int]  # positions of the user outputs in the graph's output tuple
    mutations: list[tuple[int, str, str]] = field(default_factory=list)  # (position, kind, target)
    constants: dict[str, Any] = field(default_factory=dict)  # constant placeholder -> tensor
    method: str = "export"
    export_error: str = ""  # why export failed, when make_fx captured instead
    cached: bool = False  # the exported graph came from the results database (capture_cache)
    seconds: float = 0.0  # what the capture took (export and decompositions, or the cache)
    #: buffers that hold a mask (rank >= 2, only 0 and 1) or indices (small integer buffers:
    #: positions, token types): folded as constants at capture, their values checked at every
    #: call (placeholder -> the value at capture)
    masks: dict[str, Any] = field(default_factory=dict)


def mask_like(t: Any) -> bool:
    """A tensor of rank >= 2 holding only 0 and 1 (or bool): a position mask such as GPT-2's
    ``bias`` buffer (``tril(ones(n, n))``), whose pattern the program must see."""
    torch = _torch()
    if not isinstance(t, torch.Tensor) or t.dim() < 2 or t.numel() == 0 or t.is_complex() or \
            t.numel() > (1 << 22):
        return False
    if t.dtype == torch.bool:
        return True
    v = t.detach()
    return bool(((v == 0) | (v == 1)).all())


def index_like(t: Any) -> bool:
    """A small integer tensor (not bool): an index buffer such as BERT's ``position_ids``
    (``arange(n)``) or ``token_type_ids``, whose values decide which rows a lookup picks."""
    torch = _torch()
    return isinstance(t, torch.Tensor) and t.numel() > 0 and t.numel() <= (1 << 16) and \
        t.dtype != torch.bool and not t.is_floating_point() and not t.is_complex()


def _masks(roles: list[InputRole], values: dict[str, Any], mutated: set[str]) -> dict[str, Any]:
    """The buffers folded as constants (``Captured.masks``). A buffer on the meta device has no
    values to fold (a capture of sizes alone, e.g. BatchNorm's ``num_batches_tracked`` in a
    module built under ``torch.device("meta")``): it stays an input."""
    return {r.node: values[r.node].detach().to("cpu").clone() for r in roles
            if r.kind == "buffer" and r.node in values and r.name not in mutated
            and values[r.node] is not None and values[r.node].device.type != "meta"
            and (mask_like(values[r.node]) or index_like(values[r.node]))}


def decomposition_table() -> dict:
    """PyTorch's core-aten decompositions minus the operators the frontend maps as a whole."""
    torch = _torch()
    table = dict(torch.export.default_decompositions().items()) \
        if hasattr(torch.export, "default_decompositions") else \
        dict(torch._decomp.core_aten_decompositions())
    return {op: fn for op, fn in table.items() if packet_name(op) not in TABLE}


@contextlib.contextmanager
def own_forward(module: Any) -> Any:
    """``module`` with its class's forward for the duration (``CompiledModule.generate`` routes
    the instance's ``forward`` to compiled code; capturing or running the module itself must not
    go there)."""
    patched = module.__dict__.pop("forward", None)
    try:
        yield
    finally:
        if patched is not None:
            module.forward = patched


def user_input_names(fn: Any, args: tuple, kwargs: dict) -> list[str]:
    """Names of the flattened leaves of ``(args, kwargs)``: the forward's parameter names, with
    ``_<index>`` / ``_<key>`` for nested structures."""
    from torch.utils._pytree import tree_flatten_with_path
    try:
        params = [p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        star = [p.name for p in inspect.signature(fn).parameters.values()
                if p.kind is p.VAR_POSITIONAL]
    except (TypeError, ValueError):
        params, star = [], []
    names = []
    for path, _ in tree_flatten_with_path((tuple(args), dict(kwargs)))[0]:
        keys = [_key(k) for k in path]
        top, rest = keys[0], keys[1:]
        if top == "0":  # positional argument
            i = int(rest[0])
            base = params[i] if i < len(params) else \
                f"{star[0]}_{i - len(params)}" if star else f"arg{i}"
            rest = rest[1:]
        else:
            base, rest = rest[0], rest[1:]
        names.append("_".join([base] + rest))
    return names


def _key(k: Any) -> str:
    for attr in ("idx", "key", "name"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def as_module(fn_or_module: Any) -> Any:
    """A module for ``torch.export``: the module itself, or one whose forward calls ``fn``."""
    torch = _torch()
    if isinstance(fn_or_module, torch.nn.Module):
        return fn_or_module
    if not callable(fn_or_module):
        raise TorchCaptureError(f"from_torch: expected an nn.Module or a function, got "
                                f"{type(fn_or_module).__name__}")

    class FunctionModule(torch.nn.Module):
        def __init__(self, fn: Any):
            super().__init__()
            self.fn = fn

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self.fn(*args, **kwargs)

    wrapper = FunctionModule(fn_or_module)
    wrapper._mirage_function = fn_or_module  # argument names come from the function
    return wrapper


def capture(fn_or_module: Any, args: tuple, kwargs: dict | None = None,
            database: Any = False) -> Captured:
    """Capture ``fn_or_module(*args, **kwargs)`` as an aten graph (see the module docstring).
    ``database`` (superopt's argument: None the default file, a path, False none) keeps the
    exported graph for other processes and answers from it (``capture_cache.py``)."""
    t0 = time.perf_counter()
    kwargs = dict(kwargs or {})
    module = as_module(fn_or_module)
    fn = getattr(module, "_mirage_function", None) or module.forward
    names = user_input_names(fn, args, kwargs)
    cache = None if database is False else CaptureCache.for_call(database, module, args, kwargs)
    try:
        with warnings.catch_warnings():
            # torch's own pytree deprecation notice, raised inside export's deepcopy
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            cap = _capture_export(module, args, kwargs, names, cache)
    except Exception as e:  # noqa: BLE001 -- export failed: trace instead
        first = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        try:
            cap = _capture_make_fx(module, args, kwargs, names)
        except Exception as e2:  # noqa: BLE001
            raise TorchCaptureError(
                f"cannot capture {type(module).__name__}: torch.export failed ({first}) and "
                f"make_fx failed ({type(e2).__name__}: {e2})") from e2
        cap.export_error = first
    _drop_asserts(cap.gm)
    cap.seconds = time.perf_counter() - t0
    return cap


def _drop_asserts(gm: Any) -> None:
    """Drop metadata assertions and dead nodes (an unread element of a multi-output operator)."""
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and packet_name(node.target) in ASSERTS and not node.users:
            gm.graph.erase_node(node)
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()


def _capture_export(module: Any, args: tuple, kwargs: dict, names: list[str],
                    cache: CaptureCache | None = None) -> Captured:
    torch = _torch()
    ep = cache.load() if cache is not None else None
    if ep is not None:
        return _from_exported(ep, names, cached=True)
    ep = torch.export.export(module, tuple(args), kwargs, strict=False)
    ep = ep.run_decompositions(decomposition_table())
    cap = _from_exported(ep, names)
    if cache is not None:
        cache.store(ep)
    return cap


def _from_exported(ep: Any, names: list[str], cached: bool = False) -> Captured:
    """The capture of an exported, decomposed program; ``names``: the user inputs' names."""
    from torch.export.graph_signature import InputKind, OutputKind
    sig = ep.graph_signature
    roles, user = [], 0
    constants = {}
    for spec in sig.input_specs:
        node = spec.arg.name
        if spec.kind == InputKind.PARAMETER:
            roles.append(InputRole(node, "parameter", spec.target))
        elif spec.kind == InputKind.BUFFER:
            roles.append(InputRole(node, "buffer", spec.target))
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            roles.append(InputRole(node, "constant", spec.target))
            constants[node] = ep.constants[spec.target]
        elif spec.kind == InputKind.USER_INPUT:
            roles.append(InputRole(node, "user", names[user] if user < len(names) else node,
                                   user))
            user += 1
        else:
            raise TorchCaptureError(f"export: input {node!r} of kind {spec.kind.name} is not "
                                    "supported")
    outputs, mutations = [], []
    for i, spec in enumerate(sig.output_specs):
        if spec.kind == OutputKind.USER_OUTPUT:
            outputs.append(i)
        elif spec.kind in (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION):
            mutations.append((i, spec.kind.name, spec.target))
        else:
            raise TorchCaptureError(f"export: output {spec.arg} of kind {spec.kind.name} is not "
                                    "supported")
    gm = ep.graph_module
    buffers = {}
    for r in roles:
        if r.kind == "buffer":
            v = ep.state_dict.get(r.name)
            buffers[r.node] = v if v is not None else ep.constants.get(r.name)
    masks = _masks(roles, buffers, {t for _, _, t in mutations})
    return Captured(gm, roles, ep.call_spec.in_spec, ep.call_spec.out_spec, outputs, mutations,
                    constants, "export", masks=masks, cached=cached)


def _capture_make_fx(module: Any, args: tuple, kwargs: dict, names: list[str]) -> Captured:
    torch = _torch()
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils._pytree import tree_flatten, tree_unflatten
    params = dict(module.named_parameters())
    buffers = dict(module.named_buffers())
    state = list(params) + list(buffers)
    flat, in_spec = tree_flatten((tuple(args), dict(kwargs)))
    out_spec: list[Any] = [None]
    n = len(state)

    def f(*values: Any) -> Any:
        a, k = tree_unflatten(list(values[n:]), in_spec)
        out = torch.func.functional_call(module, dict(zip(state, values[:n])), a, k)
        leaves, out_spec[0] = tree_flatten(out)
        return leaves

    values = [params[s] if s in params else buffers[s] for s in state] + list(flat)
    with torch.no_grad():
        gm = make_fx(torch.func.functionalize(f, remove="mutations"),
                     decomposition_table=decomposition_table(), tracing_mode="real",
                     record_module_stack=True, record_stack_traces=True)(*values)
    phs = [nd for nd in gm.graph.nodes if nd.op == "placeholder"]
    roles = []
    for i, ph in enumerate(phs):
        if i < n:
            roles.append(InputRole(ph.name, "parameter" if state[i] in params else "buffer",
                                   state[i]))
        else:
            j = i - n
            roles.append(InputRole(ph.name, "user", names[j] if j < len(names) else ph.name, j))
    out_node = next(nd for nd in gm.graph.nodes if nd.op == "output")
    count = len(out_node.args[0]) if isinstance(out_node.args[0], (list, tuple)) else 1
    masks = _masks(roles, {r.node: buffers[r.name] for r in roles if r.kind == "buffer"}, set())
    return Captured(gm, roles, in_spec, out_spec[0], list(range(count)), [], {}, "make_fx",
                    masks=masks)


def capture_graph_module(gm: Any, example_inputs: list, names: list[str] | None = None,
                         kinds: list[str] | None = None) -> Captured:
    """Capture a graph that already takes every tensor as an input (Dynamo's): through make_fx
    with the decomposition table, functionalized. Placeholder ``i`` is argument ``i`` of every
    call (``index``), named ``names[i]``, of kind ``kinds[i]`` ("parameter", "buffer" or
    "user"; parameters and buffers are module state, whose transposes torch may cache)."""
    torch = _torch()
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils._pytree import tree_flatten
    out_spec: list[Any] = [None]

    def f(*values: Any) -> Any:
        leaves, out_spec[0] = tree_flatten(gm(*values))
        return leaves

    with torch.no_grad():
        traced = make_fx(torch.func.functionalize(f, remove="mutations"),
                         decomposition_table=decomposition_table(), tracing_mode="real",
                         record_module_stack=True, record_stack_traces=True)(*example_inputs)
    phs = [nd for nd in traced.graph.nodes if nd.op == "placeholder"]
    names = names or [ph.name for ph in phs]
    kinds = kinds or []
    roles = [InputRole(ph.name, kinds[i] if i < len(kinds) else "user",
                       names[i] if i < len(names) else ph.name, i) for i, ph in enumerate(phs)]
    out_node = next(nd for nd in traced.graph.nodes if nd.op == "output")
    count = len(out_node.args[0]) if isinstance(out_node.args[0], (list, tuple)) else 1
    masks = _masks(roles, {r.node: example_inputs[r.index] for r in roles}, set())
    cap = Captured(traced, roles, None, out_spec[0], list(range(count)), [], {}, "make_fx",
                   masks=masks)
    _drop_asserts(cap.gm)
    return cap


__all__ = ["Captured", "InputRole", "capture", "capture_graph_module", "decomposition_table",
           "user_input_names", "as_module"]
