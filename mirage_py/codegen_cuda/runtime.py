"""Run emitted CUDA on a GPU through CuPy: NVRTC compiles the device code (cached by source
hash), and the kernels are launched in graph order on the current CuPy stream, following the
same :class:`LaunchSpec` list as the C++ host launcher.

Inputs may be CuPy arrays, anything with DLPack (PyTorch CUDA tensors) or the CUDA array
interface, or NumPy arrays (copied to the device). Outputs come back as CuPy arrays by name.
CuPy has no bfloat16 dtype: bfloat16 tensors travel as uint16 / int16 arrays of raw bits
(a PyTorch bfloat16 tensor is viewed that way automatically); :func:`bf16_bits_to_float32`
widens them.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Mapping

import numpy as np

from ..errors import DTypeError, IndexRangeError, ProgramError, ShapeError
from ..ugraph.graph import KernelGraph, KernelOp
from . import tensor_map
from .emit import CudaSource, emit_cuda
from .errors import CodegenError, CompileError, ToolMissing

_MODULES: dict[str, Any] = {}  # sha256 of device code + options -> cupy.RawModule
COMPILED_FOR: dict[str, str] = {}  # the same key -> "sm_90a" (warpgroup MMA) or "cupy default"


def _cupy() -> Any:
    try:
        import cupy
    except ImportError as e:
        raise ToolMissing("running on a GPU needs CuPy (pip install cupy-cuda13x)") from e
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise ToolMissing("CuPy sees no CUDA device")
    except cupy.cuda.runtime.CUDARuntimeError as e:
        raise ToolMissing(f"CuPy sees no CUDA device ({e})") from e
    return cupy


def gpu_available() -> bool:
    try:
        _cupy()
        return True
    except ToolMissing:
        return False


def load_module(code: str, options: tuple[str, ...] = ("--std=c++17",)) -> Any:
    """A cupy.RawModule for ``code``, compiled once per process and source hash (CuPy keeps
    its own on-disk cache of NVRTC output, keyed by the source too). On an sm_90 device the
    code is built for sm_90a (warpgroup MMA) unless ``MIRAGE_PY_NO_WGMMA`` is set."""
    cp = _cupy()
    hopper = _hopper(cp)
    key = module_key(code, options, hopper)
    mod = _MODULES.get(key)
    if mod is None:
        mod, built = _hopper_module(cp, code, options, key) if hopper else (None, "")
        COMPILED_FOR.pop(key, None)  # the latest compile last
        COMPILED_FOR[key] = built or "cupy default"
        if mod is None:
            try:
                mod = cp.RawModule(code=code, options=options)
                mod.compile()
            except cp.cuda.compiler.CompileException as e:
                raise CompileError(f"NVRTC rejected the emitted code:\n{e}") from e
        _MODULES[key] = mod
    return mod


def module_key(code: str, options: tuple[str, ...], hopper: bool) -> str:
    """The cache key of a module: its device code, NVRTC options and whether it is built for
    sm_90a (what :func:`load_module` and :func:`prebuild_cubin` name the module's files by)."""
    return hashlib.sha256((code + "\0" + " ".join(options) + f"\0{hopper}").encode()).hexdigest()


def cubin_path(key: str) -> Any:
    """Where a module's sm_90a cubin built ahead of time lies (under the cache directory,
    ``$MIRAGE_PY_CACHE``): :func:`load_module` loads it instead of calling NVRTC."""
    from .emulator import cache_dir
    return cache_dir() / f"module_{key[:24]}_sm90a.cubin"


def module_options(source: CudaSource, tma: bool) -> tuple[str, ...]:
    """The NVRTC options of ``source``'s module (:class:`CompiledGraph`): TMA copies compiled
    in when the graph has tensor maps and the device takes them."""
    return ("--std=c++17",) + (() if tma else ("-DMIRAGE_NO_TMA",))


def prebuild_cubin(source: CudaSource, tma: bool = True) -> tuple[str, bool]:
    """Build ``source``'s module for an H100 / H200 (sm_90a; TMA on where the graph has tensor
    maps, unless ``tma`` is false: the ``MIRAGE_PY_NO_TMA`` build) with nvcc, without a GPU,
    into :func:`cubin_path`: a GPU machine given the cache directory loads it instead of
    compiling (a GPU session's minutes go to measuring). Returns (the cache key, whether it
    was built now rather than found)."""
    from .nvcc import compile_with_nvcc
    tma = tma and any(s.tensor_maps for s in source.launches)
    options = module_options(source, tma)
    code = source.device_code()
    key = module_key(code, options, True)
    path = cubin_path(key)
    if path.exists():
        return key, False
    defines = tuple(o for o in options if o.startswith("-D"))
    res = compile_with_nvcc(code, ("sm_90a",), host=False, extra=defines,
                            name=path.stem + ".tmp", out_dir=path.parent)
    os.replace(res.output, path)
    return key, True


def _hopper(cp: Any) -> bool:
    """Build for sm_90a (warpgroup MMA)? On an sm_90 device unless ``MIRAGE_PY_NO_WGMMA``."""
    return _compute_capability(cp) == (9, 0) and not os.environ.get("MIRAGE_PY_NO_WGMMA")


def _compute_capability(cp: Any) -> tuple[int, int] | None:
    try:
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())
        return int(props["major"]), int(props["minor"])
    except Exception:  # noqa: BLE001 -- a runtime without the query: take CuPy's own path
        return None


def tma_enabled(cp: Any) -> bool:
    """Compile the TMA copies in? On devices of compute capability 9.0 or later whose driver
    encodes tensor maps, unless ``MIRAGE_PY_NO_TMA`` is set (then every tile arrives by
    cp.async, for comparison)."""
    cc = _compute_capability(cp)
    if cc is None or cc < (9, 0) or os.environ.get("MIRAGE_PY_NO_TMA"):
        return False
    try:
        tensor_map._encoder()
        return True
    except ToolMissing:
        return False


_encode_map = tensor_map.encode  # (TmaCopy, device address) -> the 128 bytes of the map
_MAP_DTYPE = np.dtype({"names": ["opaque"], "formats": [("<u8", (16,))]})


def _map_argument(raw: bytes) -> Any:
    """A tensor map as a by-value kernel argument: a one-element NumPy structured array of 128
    bytes, which CuPy passes as a struct."""
    buf = np.zeros(2 * tensor_map.MAP_BYTES, np.uint8)  # 128-byte aligned, as the type is
    start = (-buf.ctypes.data) % 128
    arg = buf[start:start + tensor_map.MAP_BYTES]
    arg[:] = np.frombuffer(raw, np.uint8)
    return arg.view(np.uint64).view(_MAP_DTYPE)


def _hopper_module(cp: Any, code: str, options: tuple[str, ...], key: str) -> tuple[Any, str]:
    """On an sm_90 device: the module's cubin built ahead of time (:func:`prebuild_cubin`), else
    the code as PTX for ``compute_90a`` -- warpgroup MMA enabled (``__CUDA_ARCH_FEAT_SM90_ALL``)
    -- loaded by the driver. CuPy picks the architecture itself and rejects a second ``-arch``
    option, so NVRTC is called directly. Returns the module and how it was built; (None, "")
    when every step fails: CuPy's own compile (``mma.sync``, same results) is used then."""
    prebuilt = cubin_path(key)
    if prebuilt.exists():
        try:
            mod = cp.RawModule(path=str(prebuilt))
            mod.compile()
            return mod, "sm_90a (prebuilt cubin)"
        except Exception:  # noqa: BLE001 -- a cubin this driver rejects: compile here
            pass
    try:
        from .emulator import cache_dir
        from .nvrtc import compile_with_nvrtc
        ptx, _ = compile_with_nvrtc(code, "compute_90a", options)
        path = cache_dir() / f"module_{key[:24]}_sm90a.ptx"
        path.write_text(ptx)
        mod = cp.RawModule(path=str(path))
        mod.compile()  # RawModule(path=) loads lazily: let a driver that rejects the PTX fail here
        return mod, "sm_90a"
    except Exception:  # noqa: BLE001 -- fall back to the portable path
        return None, ""


_STORAGE = {"float16": ("float16",), "float32": ("float32",),
            "bfloat16": ("uint16", "int16"),
            "int32": ("int32",), "int64": ("int64",)}


def _to_cupy(x: Any, cp: Any) -> Any:
    if isinstance(x, cp.ndarray):
        return x
    if type(x).__module__.startswith("torch"):
        import torch
        if x.dtype == torch.bfloat16:
            x = x.view(torch.int16)  # CuPy has no bfloat16: move the raw bits
        return cp.from_dlpack(x)
    if hasattr(x, "__dlpack__"):
        return cp.from_dlpack(x)
    return cp.asarray(x)


def bf16_bits_to_float32(a: Any) -> Any:
    """uint16 / int16 bfloat16 bits (CuPy or NumPy) -> float32 values."""
    xp = type(a).__module__.split(".")[0]
    mod = __import__(xp)
    return (a.view(mod.uint16).astype(mod.uint32) << 16).view(mod.float32)


def check_gather_indices(graph: KernelGraph, extrema: Any) -> None:
    """Before launching: every take kernel's indices that are graph inputs lie in its table's
    rows (``extrema(name)`` -> (min, max) of an input), else IndexRangeError naming the kernel,
    the table's shape and the bad index -- a GPU gather cannot raise."""
    names = {t.name for t in graph.inputs}
    tensors = graph.tensors()
    for op in graph.ops:
        if isinstance(op, KernelOp) and op.op == "take" and op.operands[1] in names:
            lo, hi = extrema(op.operands[1])
            rows = tensors[op.operands[0]].shape[0]
            if lo < 0 or hi >= rows:
                bad = lo if lo < 0 else hi
                raise IndexRangeError(f"take -> {op.output.name!r}: index {bad} in "
                                      f"{op.operands[1]!r} is out of range for the table "
                                      f"{op.operands[0]!r} {tensors[op.operands[0]].shape} "
                                      f"(valid 0 .. {rows - 1})")


def dim_values(source: CudaSource, sizes: Mapping[str, int] | None) -> dict[str, np.ndarray]:
    """The size of each dim a call of ``source`` passes (its masks', trip counts' and launch
    grids'), as a C int (a kernel argument by value)."""
    need = source.dims
    missing = [d for d in need if d not in (sizes or {})]
    if missing:
        raise CodegenError(f"μGraph {source.graph.name!r}: its masks, trip counts or grids name "
                           f"dims {missing}: give their sizes (sizes=...)")
    return {d: np.array([int(sizes[d])], np.int32) for d in need}


class CompiledGraph:
    """A kernel graph compiled for the GPU. ``graph(inputs)`` -> outputs by name.

    ``outputs`` may pass preallocated (e.g. NaN-poisoned) output arrays; ``poison=True`` fills
    the workspace with NaN bits first, so a read of an unwritten intermediate shows.

    A call's host work is kept small (a call of a one-kernel graph is a few microseconds of GPU
    time, so the launcher's Python shows): what does not depend on the call -- the kernels,
    the workspace views of the intermediates, each launch's argument slots -- is made once
    here, and a call checks its arrays and fills the slots. :meth:`capture` records the
    launches of one set of buffers as a CUDA graph, replayed with a single launch."""

    def __init__(self, graph: KernelGraph | CudaSource, target: Any = "h100"):
        cp = _cupy()
        self.source = graph if isinstance(graph, CudaSource) else emit_cuda(graph, target)
        self.tma = any(s.tensor_maps for s in self.source.launches) and tma_enabled(cp)
        options = module_options(self.source, self.tma)
        code = self.source.device_code()
        self.module = load_module(code, options)
        # how this module was built: "sm_90a (prebuilt cubin)", "sm_90a" or "cupy default"
        self.built_for = COMPILED_FOR.get(module_key(code, options, _hopper(cp)), "")
        self._maps: dict[tuple, Any] = {}  # (kernel, map, address) -> encoded map
        self.kernels = {}
        for spec in self.source.launches:
            k = self.module.get_function(spec.kernel)
            if spec.smem_bytes > 48 * 1024:
                k.max_dynamic_shared_size_bytes = spec.smem_bytes
            self.kernels[spec.kernel] = k
        dev = self.source.plan.device
        self._workspace = cp.empty(max(dev.workspace_bytes, 1), cp.uint8)
        g = self.graph
        tensors = g.tensors()
        self._inputs = tuple((t.name, tuple(t.shape), t.dtype) for t in g.inputs)
        self._outputs = tuple((n, tuple(tensors[n].shape), tensors[n].dtype) for n in g.outputs)
        # the intermediates' views of the workspace: the same every call
        self._views = {n: self._workspace[off:off + dev.layouts[n].nbytes]
                       for n, off in dev.workspace.items()}
        self._gathers = any(isinstance(op, KernelOp) and op.op == "take" for op in g.ops)
        self._static_grid = not any(c is not None for s in self.source.launches
                                    for c in s.grid_counts)

    @property
    def graph(self) -> KernelGraph:
        return self.source.graph

    def _check(self, name: str, a: Any, shape: tuple[int, ...], dtype: str, cp: Any) -> Any:
        if tuple(a.shape) != shape:
            raise ShapeError(f"μGraph {self.graph.name!r}: {name!r} has shape {tuple(a.shape)}, "
                             f"expected {shape}")
        if a.dtype.name not in _STORAGE[dtype]:
            raise DTypeError(f"μGraph {self.graph.name!r}: {name!r} is {a.dtype.name}, expected "
                             f"{dtype}" + (" (as uint16/int16 bits)" if dtype == "bfloat16" else ""))
        if not a.flags.c_contiguous or a.data.ptr % 16:
            a = cp.ascontiguousarray(a).copy()
        return a

    def _dims(self, sizes: Mapping[str, int] | None) -> dict[str, Any]:
        """The dims' sizes the kernels take by value (none for a graph without masks)."""
        if not self.source.dims:
            return {}
        return {d: np.int32(v[0]) for d, v in dim_values(self.source, sizes).items()}

    def _arrays(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any] | None,
                cp: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """Every array a launch names (inputs checked, outputs allocated or checked,
        intermediates' workspace views) and the outputs by name."""
        g = self.graph
        missing = [n for n, _, _ in self._inputs if n not in inputs]
        if missing:
            raise ProgramError(f"μGraph {g.name!r}: missing input(s) {missing}")
        arrays = dict(self._views)
        for n, shape, dtype in self._inputs:
            arrays[n] = self._check(n, _to_cupy(inputs[n], cp), shape, dtype, cp)
        if self._gathers:
            check_gather_indices(g, lambda n: (int(arrays[n].min()), int(arrays[n].max())))
        result = {}
        for n, shape, dtype in self._outputs:
            if outputs is not None and n in outputs:
                a = _to_cupy(outputs[n], cp)
                if not a.flags.c_contiguous or a.data.ptr % 16:
                    raise ValueError(f"output buffer {n!r} must be contiguous and 16-byte aligned")
                a = self._check(n, a, shape, dtype, cp)
            else:
                a = cp.empty(shape, _STORAGE[dtype][0])
            arrays[n] = result[n] = a
        return arrays, result

    def __call__(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any] | None = None,
                 poison: bool = False, sizes: Mapping[str, int] | None = None) -> dict[str, Any]:
        """Run on ``inputs`` (``sizes``: the sizes of the dims a padded graph's masks name,
        passed to its kernels)."""
        cp = _cupy()
        dims = self._dims(sizes)
        arrays, result = self._arrays(inputs, outputs, cp)
        if poison:
            self._workspace.fill(0xFF)
        self._launch(arrays, dims, sizes)
        return result

    def _launch(self, arrays: dict[str, Any], dims: dict[str, Any],
                sizes: Mapping[str, int] | None) -> None:
        for spec in self.source.launches:
            args = tuple(arrays[p.tensor] for p in spec.params) + \
                tuple(dims[d] for d in spec.dims) + \
                tuple(self._tensor_map(spec.kernel, m, arrays[m.tensor].data.ptr)
                      for m in spec.tensor_maps)
            grid = spec.grid if self._static_grid else spec.grid_at(sizes)
            self.kernels[spec.kernel](grid, spec.block, args, shared_mem=spec.smem_bytes)

    def capture(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any] | None = None,
                sizes: Mapping[str, int] | None = None) -> "CapturedCall":
        """The launches of one call on these buffers recorded as a CUDA graph (one launch per
        replay instead of one per kernel, no Python in between: what PyTorch's
        ``mode="reduce-overhead"`` does). The buffers are the graph's: write new inputs into
        ``inputs``' arrays and read the results from :attr:`CapturedCall.outputs`."""
        cp = _cupy()
        dims = self._dims(sizes)
        arrays, result = self._arrays(inputs, outputs, cp)
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            self._launch(arrays, dims, sizes)  # maps encoded and kernels loaded before capture
            stream.synchronize()
            stream.begin_capture()
            try:
                self._launch(arrays, dims, sizes)
            finally:
                graph = stream.end_capture()
        return CapturedCall(graph, result, arrays)

    def _tensor_map(self, kernel: str, m: Any, address: int) -> Any:
        """The kernel argument of TMA map ``m`` over the tensor at ``address``: encoded by the
        driver once per address (maps hold the address), zeros when TMA is compiled out."""
        key = (kernel, m.cname, address) if self.tma else None  # compiled out: one zero map
        arg = self._maps.get(key)
        if arg is None:
            if len(self._maps) > 256:
                self._maps.clear()
            raw = _encode_map(m.copy, address) if self.tma else bytes(tensor_map.MAP_BYTES)
            arg = self._maps[key] = _map_argument(raw)
        return arg


class CapturedCall:
    """A :class:`CompiledGraph` call recorded as a CUDA graph (:meth:`CompiledGraph.capture`):
    ``call()`` replays it on the current CuPy stream and returns :attr:`outputs`."""

    def __init__(self, graph: Any, outputs: dict[str, Any], arrays: dict[str, Any]):
        self._graph = graph
        self.outputs = outputs
        self._arrays = arrays  # kept alive: the graph holds their addresses

    def __call__(self) -> dict[str, Any]:
        import cupy
        self._graph.launch(stream=cupy.cuda.get_current_stream())
        return self.outputs
