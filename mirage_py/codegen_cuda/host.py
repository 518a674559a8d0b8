"""The host side of an emitted .cu file: the C API header and the launcher that runs every
kernel of the graph in order on one stream, with intermediates in a caller-provided workspace."""

from __future__ import annotations

from ..layout.tensors import DevicePlan
from ..ugraph.graph import KernelGraph
from .cexpr import CTYPES, Names
from .launch import DIM_PARAM, LaunchSpec
from .tensor_map import DATA_TYPES


def io_fields(graph: KernelGraph) -> list[tuple[str, str, bool]]:
    """(tensor name, struct field, is_input) for the graph's inputs then outputs."""
    names = Names()
    out = [(t.name, names(t.name), True) for t in graph.inputs]
    out += [(n, names(n), False) for n in graph.outputs]
    return out


def header_text(prefix: str, graph: KernelGraph, device: DevicePlan, target: str,
                dims: tuple[str, ...] = ()) -> str:
    """The C API; ``dims``: the sizes a call passes (a padded graph's: ``emit.call_dims``)."""
    guard = f"MIRAGE_{prefix.upper()}_H"
    tensors = graph.tensors()
    lines = [f"// Host API of the CUDA code mirage_py generated for the μGraph {graph.name!r} "
             f"(target {target}).",
             f"#ifndef {guard}", f"#define {guard}", "", "#include <stddef.h>",
             "#include <cuda_runtime_api.h>", "", "#ifdef __cplusplus", 'extern "C" {',
             "#endif", "",
             "// Device pointers of the graph's inputs and outputs: dense row-major arrays,",
             "// 16-byte aligned" + (" (and the sizes of the dims its masks name)."
                                     if dims else "."),
             "typedef struct {"]
    for name, field, is_in in io_fields(graph):
        t = tensors[name]
        q = "const void*" if is_in else "void*"
        lines.append(f"  {q} {field};  // {'input' if is_in else 'output'} {name}: "
                     f"{t.shape} {t.dtype}")
    for d in dims:
        lines.append(f"  int {DIM_PARAM}{d};  // the size of dim {d} this call runs at (a padded "
                     f"graph's valid size)")
    lines += [f"}} {prefix}_tensors;", "",
              f"// Bytes of device workspace {prefix}_launch needs for intermediates: "
              f"{device.workspace_bytes}",
              "// (when 0, pass NULL).",
              f"size_t {prefix}_workspace_bytes(void);", "",
              "// Launch every kernel of the graph on `stream`, in order; returns the first CUDA "
              "error.",
              f"cudaError_t {prefix}_launch(const {prefix}_tensors* tensors, void* workspace,",
              "                          cudaStream_t stream);", "",
              "#ifdef __cplusplus", "}", "#endif", f"#endif  // {guard}", ""]
    return "\n".join(lines)


def launcher_text(prefix: str, graph: KernelGraph, device: DevicePlan,
                  launches: list[LaunchSpec]) -> str:
    fields = {name: field for name, field, _ in io_fields(graph)}
    tensors = graph.tensors()
    lines = [f'extern "C" size_t {prefix}_workspace_bytes(void) {{ '
             f"return {device.workspace_bytes}; }}", "",
             f'extern "C" cudaError_t {prefix}_launch(const {prefix}_tensors* tensors, '
             "void* workspace,",
             f"{' ' * (30 + len(prefix))}cudaStream_t stream) {{"]
    if device.workspace:
        lines.append("  unsigned char* ws = static_cast<unsigned char*>(workspace);")
    else:
        lines.append("  (void)workspace;")
    local = Names("d_")
    for name in tensors:
        ct = CTYPES[tensors[name].dtype]
        if name in device.workspace:
            lines.append(f"  {ct}* {local(name)} = reinterpret_cast<{ct}*>"
                         f"(ws + {device.workspace[name]});  // intermediate {name}")
        elif name in fields:
            is_in = any(t.name == name for t in graph.inputs)
            q = "const " if is_in else ""
            lines.append(f"  {q}{ct}* {local(name)} = static_cast<{q}{ct}*>"
                         f"(tensors->{fields[name]});")
    lines.append("  cudaError_t err = cudaSuccess;")
    for spec in launches:
        args = ", ".join([local(p.tensor) for p in spec.params] +
                         [f"tensors->{DIM_PARAM}{d}" for d in spec.dims] +
                         [f"{p.cname}_{spec.op_index}" for p in spec.tensor_maps])
        lines.append(f"  // kernel #{spec.op_index}")
        lines += _encode_maps(spec, local)
        if spec.smem_bytes > 48 * 1024:
            lines += [f"  err = cudaFuncSetAttribute({spec.kernel}, "
                      f"cudaFuncAttributeMaxDynamicSharedMemorySize, {spec.smem_bytes});",
                      "  if (err != cudaSuccess) return err;"]
        g, b = spec.grid_c(lambda n: f"tensors->{DIM_PARAM}{n}"), spec.block
        if spec.grid_dims:
            lines.append(f"  // grid computed from the sizes: blocks wholly past them are left "
                         f"out (at most {spec.grid})")
        lines += [f"  {spec.kernel}<<<dim3({g[0]}, {g[1]}, {g[2]}), dim3({b[0]}, {b[1]}, {b[2]}), "
                  f"{spec.smem_bytes}, stream>>>({args});",
                  "  err = cudaGetLastError();", "  if (err != cudaSuccess) return err;"]
    lines += ["  return err;", "}", ""]
    return "\n".join(lines)


def _encode_maps(spec: LaunchSpec, local: Names) -> list[str]:
    """Encode the TMA tensor maps of ``spec`` (they hold the tensors' addresses)."""
    lines = []
    for p in spec.tensor_maps:
        c = p.copy
        name = f"{p.cname}_{spec.op_index}"
        lines += [f"  mp_tensor_map {name};  // {c.tile}: box {c.box} of {c.tensor}", "  {",
                  f"    const cuuint64_t dims[] = {{{', '.join(map(str, c.dims))}}};",
                  f"    const cuuint64_t strides[] = {{{', '.join(map(str, c.strides)) or '0'}}};",
                  f"    const cuuint32_t box[] = {{{', '.join(map(str, c.box))}}};",
                  f"    err = mp_encode_tensor_map(&{name}, {DATA_TYPES[c.dtype]}, {c.rank}, "
                  f"{local(c.tensor)}, dims, strides, box, {c.swizzle});",
                  "    if (err != cudaSuccess) return err;", "  }"]
    return lines
