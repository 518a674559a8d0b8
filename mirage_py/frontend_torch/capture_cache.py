"""Captured graphs kept across processes: a module seen before is not exported again.

``torch.export`` and its decompositions are what a compile costs once every region's answer is in
the results database (about 1.2 s of a 1.3 s compile for a 2-layer tiny Llama). The exported,
decomposed program is kept in the results database (table ``captures``), without weights, under
a key made of everything the graph can depend on:

- the versions of Python, PyTorch and mirage_py's source (its decomposition table and capture
  code), PyTorch's grad mode and default dtype;
- the module tree: every submodule's class and its attributes that are not parameters, buffers
  or submodules (configuration numbers, strings, flags, config objects -- walked to a fixed
  depth --, plain tensors by value, functions by name), train / eval mode (an object's fields
  named ``*_hash`` are left out: digests of its other fields, salted per process by Python's
  ``hash``);
- the source of the code that runs: for every class of the tree (and its bases), the files of
  its top-level package -- each file's path, size and modification time -- or, for a class
  defined in a script, that file's bytes; plus the package's version;
- every parameter's and buffer's name, shape, dtype, device and ``requires_grad``, and which
  buffers are persistent;
- the call: the structure of ``(args, kwargs)`` and each leaf (a tensor's shape, dtype, device
  and ``requires_grad``; a number, string or flag by value).

Weights are never stored: a cached program is rebuilt over the live module's parameters and
buffers, so its buffer values (masks, rotary tables) are the module's current ones. What the key
cannot see is left uncached rather than guessed: a module with hooks, an attribute of a type the
key does not know (its value could steer the trace), a plain tensor attribute over 64 Ki
elements, a call leaf that is neither a tensor nor a plain value, or code outside the module
tree's packages that changes between processes without a version change (PyTorch itself is keyed
by version). ``capture_cache=False`` in ``mp.compile`` / ``from_torch`` turns the cache off,
as does ``database=False``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import inspect
import os
import sys
import typing
import warnings
from dataclasses import dataclass
from typing import Any, Iterator

from ..tuning.database import ResultsDB, open_database
from ..version import source_fingerprint

_FORMAT = "mirage_py.capture/1"
_MAX_TENSOR = 1 << 16  # plain tensor attributes keyed by value up to this many elements
_DEPTH = 4  # how deep attribute objects (configs) are walked


class Uncacheable(Exception):
    """The key cannot see everything this capture depends on (the reason is the message)."""


@dataclass
class CaptureCache:
    """The cache entry of one capture: where it lives and under which key."""

    db: ResultsDB
    key: str
    module: Any

    @classmethod
    def for_call(cls, database: Any, module: Any, args: tuple,
                 kwargs: dict) -> "CaptureCache | None":
        """The entry for ``module(*args, **kwargs)`` in ``database`` (superopt's ``database``
        argument), or None when the database is off or the capture cannot be keyed."""
        db = open_database(database)
        if db is None:
            return None
        try:
            key = capture_key(module, args, kwargs)
        except Uncacheable:
            return None
        return cls(db, key, module)

    def load(self) -> Any | None:
        """The exported program kept under this key, over the live module's weights, or None
        (not kept, or kept by a PyTorch whose serialised form this one cannot read)."""
        row = self.db.capture(self.key)
        if row is None:
            return None
        from torch._export.serde.serialize import SerializedArtifact, deserialize
        from torch._export.serde.serialize import deserialize_torch_artifact
        program, constants = row
        state = dict(self.module.state_dict(keep_vars=True))
        consts = dict(deserialize_torch_artifact(constants))
        consts.update(_buffers(self.module))  # non-persistent buffers: the live values
        try:
            with _type_hints_memo():
                return deserialize(SerializedArtifact(program, state, consts, b""))
        except Exception:  # noqa: BLE001 -- an unreadable entry is a miss, never an error
            return None

    def store(self, ep: Any) -> None:
        """Keep ``ep`` (exported and decomposed) under this key, without its weights or the
        module's buffers (they are the live module's when loaded). A graph PyTorch cannot
        serialise is not kept (one warning); the capture goes on."""
        from torch._export.serde.serialize import serialize
        buffers = _buffers(self.module)
        saved_state, saved_consts = ep._state_dict, ep._constants
        try:
            ep._state_dict = {k: _on_meta(v) for k, v in saved_state.items()}
            ep._constants = {k: _on_meta(v) if k in buffers else v
                             for k, v in saved_consts.items()}
            art = serialize(ep)
        except Exception as e:  # noqa: BLE001 -- an unserialisable graph is not kept
            warnings.warn(f"capture cache: {type(self.module).__name__}'s graph is not kept "
                          f"({type(e).__name__}: {e})", RuntimeWarning, stacklevel=3)
            return
        finally:
            ep._state_dict, ep._constants = saved_state, saved_consts
        self.db.keep_capture(self.key, art.exported_program, art.constants)


@contextlib.contextmanager
def _type_hints_memo() -> Iterator[None]:
    """``typing.get_type_hints`` answered once per class for the duration. PyTorch's
    deserialiser asks it again for every node of the serialised graph (3679 times for a 2-layer
    tiny Llama: half of the load's 0.4 s on an idle machine, 0.8 of 1.5 s under load); the
    answer for a class and namespace does not change while a graph loads."""
    original = typing.get_type_hints
    memo: dict[tuple, Any] = {}

    def hints(obj: Any, globalns: Any = None, localns: Any = None,
              include_extras: bool = False) -> Any:
        key = (obj, id(globalns), id(localns), include_extras)
        if key not in memo:
            memo[key] = original(obj, globalns, localns, include_extras)
        return memo[key]

    typing.get_type_hints = hints
    try:
        yield
    finally:
        typing.get_type_hints = original


def _on_meta(v: Any) -> Any:
    """``v``'s shape and type without its data (a Parameter stays a Parameter)."""
    import torch
    if isinstance(v, torch.nn.Parameter):
        return torch.nn.Parameter(v.detach().to("meta"), requires_grad=v.requires_grad)
    return v.detach().to("meta") if isinstance(v, torch.Tensor) else v


def _buffers(module: Any) -> dict[str, Any]:
    return dict(module.named_buffers())


def capture_key(module: Any, args: tuple, kwargs: dict) -> str:
    """The key of ``module(*args, **kwargs)``'s capture (see the module doc); raises
    :class:`Uncacheable` when something the trace may depend on cannot be keyed."""
    import torch
    h = hashlib.sha256()

    def put(*parts: Any) -> None:
        for p in parts:
            h.update(str(p).encode())
            h.update(b"\0")

    put(_FORMAT, sys.version, torch.__version__, source_fingerprint(), torch.is_grad_enabled(),
        torch.get_default_dtype())
    classes: set[type] = set()
    walker = _StateWalker()
    for qual, m in module.named_modules(remove_duplicate=False):
        if _has_hooks(m):
            raise Uncacheable(f"{qual or 'module'} has hooks")
        classes.add(type(m))
        put("module", qual, _qualname(type(m)), m.training,
            sorted(getattr(m, "_non_persistent_buffers_set", ())))
        put(walker.state(m))
    for name, t in list(module.named_parameters(remove_duplicate=False)) + \
            list(module.named_buffers(remove_duplicate=False)):
        put("tensor", name, tuple(t.shape), t.dtype, t.device, t.requires_grad)
    fn = getattr(module, "_mirage_function", None)
    if fn is not None:  # a function wrapped as a module (capture.as_module)
        if not inspect.isfunction(fn):
            raise Uncacheable(f"a callable of type {type(fn).__name__}")
        classes.add(fn)
        put("function", _qualname(fn), walker.function_state(fn))
    put(_code_fingerprint(classes))
    from torch.utils._pytree import tree_flatten
    leaves, spec = tree_flatten((tuple(args), dict(kwargs)))
    put("call", spec)
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            put("tensor", tuple(leaf.shape), leaf.dtype, leaf.device, leaf.requires_grad)
        elif leaf is None or isinstance(leaf, (bool, int, float, str)):
            put(type(leaf).__name__, repr(leaf))
        else:
            raise Uncacheable(f"a call argument of type {type(leaf).__name__}")
    return h.hexdigest()


def _has_hooks(m: Any) -> bool:
    return any(getattr(m, a, None) for a in (
        "_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
        "_state_dict_hooks", "_load_state_dict_pre_hooks"))


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}"


@functools.cache
def _module_internals() -> frozenset[str]:
    """The attributes every ``nn.Module`` has (parameters, buffers, submodules, hook tables,
    mode: keyed on their own), and ``forward`` (``CompiledModule.generate``'s routing)."""
    import torch
    return frozenset(vars(torch.nn.Module())) | {"forward", "_mirage_function"}


class _StateWalker:
    """Attribute values as text for the key; objects seen before (a config shared by every
    layer) are written once and referred to by their first position."""

    def __init__(self) -> None:
        self._seen: dict[int, int] = {}

    def state(self, m: Any) -> str:
        skip = _module_internals()
        return self.value({k: v for k, v in vars(m).items() if k not in skip})

    def function_state(self, fn: Any) -> str:
        """What a plain function's trace can read besides its code: its defaults, closure
        cells and the module-level values its code names."""
        code = fn.__code__
        named = {n: fn.__globals__[n] for n in code.co_names if n in fn.__globals__}
        cells = [c.cell_contents for c in (fn.__closure__ or ())]
        return self.value({"defaults": fn.__defaults__, "kwdefaults": fn.__kwdefaults__,
                           "cells": cells, "globals": named})

    def value(self, v: Any, depth: int = 0) -> str:
        import enum
        import torch
        if v is None or isinstance(v, (bool, int, float, complex, str, bytes)):
            return repr(v)
        if isinstance(v, (torch.dtype, torch.device, torch.Size, enum.Enum)):
            return repr(v)
        if isinstance(v, torch.Tensor):
            if v.numel() > _MAX_TENSOR:
                raise Uncacheable(f"a plain tensor attribute of {v.numel()} elements")
            data = v.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
            digest = hashlib.sha256(data.numpy().tobytes()).hexdigest()
            return f"tensor{tuple(v.shape)}{v.dtype}{digest}"
        if isinstance(v, torch.nn.Module):  # not a registered submodule: its weights would be
            raise Uncacheable(f"an unregistered module ({_qualname(type(v))})")  # constants
        if inspect.isroutine(v) or inspect.isclass(v):
            return f"code:{_qualname(v)}"
        if inspect.ismodule(v):
            return f"pymodule:{v.__name__}"
        if depth >= _DEPTH:
            raise Uncacheable(f"an attribute nested deeper than {_DEPTH} ({type(v).__name__})")
        if isinstance(v, (list, tuple, set, frozenset)):
            items = [self.value(x, depth + 1) for x in v]
            return f"{type(v).__name__}[{', '.join(sorted(items) if isinstance(v, (set, frozenset)) else items)}]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{self.value(k, depth + 1)}: {self.value(x, depth + 1)}"
                                   for k, x in sorted(v.items(), key=lambda kv: repr(kv[0]))) + "}"
        if hasattr(v, "__dict__"):
            seen = self._seen.get(id(v))
            if seen is not None:
                return f"@{seen}"
            self._seen[id(v)] = len(self._seen)
            fields = {k: x for k, x in vars(v).items() if not k.endswith("_hash")}
            return f"{_qualname(type(v))}({self.value(fields, depth + 1)})"
        raise Uncacheable(f"an attribute of type {type(v).__name__}")


def _code_fingerprint(classes: set[Any]) -> str:
    """The code the classes (and their bases) run: per top-level package, its version and
    every source file's path, size and modification time; a script's own bytes."""
    packages: set[str] = set()
    scripts: set[str] = set()
    for c in classes:
        for k in getattr(c, "__mro__", (c,)):
            mod = getattr(k, "__module__", None) or ""
            top = mod.split(".")[0]
            if top in ("builtins", "torch", "typing", "abc", "collections"):
                continue
            m = sys.modules.get(mod)
            f = getattr(m, "__file__", None)
            if f is None:
                raise Uncacheable(f"the source of {_qualname(k)} is not a file")
            pkg = sys.modules.get(top)
            if getattr(pkg, "__path__", None):
                packages.add(top)
            else:
                scripts.add(os.path.abspath(f))
    h = hashlib.sha256()
    for top in sorted(packages):
        h.update(f"package {top} {_version(top)}\0".encode())
        for root in sorted(sys.modules[top].__path__):
            for where, dirs, files in os.walk(root):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
                for f in sorted(files):
                    if f.endswith(".py"):
                        st = os.stat(os.path.join(where, f))
                        h.update(f"{where}/{f} {st.st_size} {st.st_mtime_ns}\0".encode())
    for path in sorted(scripts):
        with open(path, "rb") as f:
            h.update(f"script {path}\0".encode())
            h.update(f.read())
    return h.hexdigest()


def _version(top: str) -> str:
    try:
        return importlib.metadata.version(top)
    except importlib.metadata.PackageNotFoundError:
        return str(getattr(sys.modules.get(top), "__version__", ""))


__all__ = ["CaptureCache", "Uncacheable", "capture_key"]
