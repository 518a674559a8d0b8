"""The analytic cost model: cases with known answers, each effect the tuner relies on, the
interface and its test double, and the targets' figures."""

import json
import math

import pytest

from mirage_py.cost_model import (L2_SPEEDUP, AnalyticModel, RandomModel, create, estimate_us,
                                  kernel_costs, occupancy)
from mirage_py.errors import MirageError
from mirage_py.targets import TARGETS, get_target
from mirage_py.tuning import AnnotatedGraph
from mirage_py.ugraph import (Accum, BlockOp, DTensor, InputIter, KernelGraph, KernelOp,
                              OutputSaver, attrs_of)
from ugraph_cases import R, one_kernel, tiled_matmul

H100 = get_target("h100")


def copy_graph(M=8192, N=8192, tile=64, threads=128):
    return one_kernel("copy", [DTensor("X", (M, N))], [DTensor("Y", (M, N))],
                      (M // tile, N // tile, 1), 1,
                      [InputIter("x", 0, (0, 1, R)), OutputSaver("x", 0, (0, 1, R))], threads)


def matmul_graph(M, K, N, tm, tn, tk, threads=256):
    """C = A @ B with (tm, tn) output tiles per block and the loop over K in chunks of tk."""
    return one_kernel("mm", [DTensor("A", (M, K)), DTensor("B", (K, N))], [DTensor("C", (M, N))],
                      (M // tm, N // tn, 1), K // tk, [
                          InputIter("a", 0, (0, R, R), fmap=1),
                          InputIter("b", 1, (R, 1, R), fmap=0),
                          BlockOp("c", "matmul", ("a", "b")),
                          Accum("acc", "c"),
                          OutputSaver("acc", 0, (0, 1, R))], threads)


# ---- known answers -------------------------------------------------------------------------

def test_pure_copy_is_launch_plus_bytes_over_measured_bandwidth():
    g = copy_graph()
    nbytes = 2 * 8192 * 8192 * 2
    want = H100.launch_us + 1e6 * nbytes / H100.mem_bw  # 2.5 + 89.48 us
    assert estimate_us(g, "h100") == pytest.approx(want, rel=1e-9)
    (c,) = kernel_costs(g, "h100")
    assert c.bytes == nbytes and c.tc_flops == 0 and c.bound == "memory"
    # the same copy on an H200 is faster by the ratio of measured bandwidths
    assert estimate_us(g, "h200") == pytest.approx(H100.launch_us + 1e6 * nbytes / 4.3e12)


def test_pure_copy_as_a_library_kernel():
    p = KernelGraph("t", (DTensor("X", (8192, 8192)),),
                    (KernelOp("transpose", ("X",), DTensor("Y", (8192, 8192)),
                              attrs_of(perm=(1, 0))),), ("Y",))
    assert estimate_us(p, "h100") == pytest.approx(2.5 + 1e6 * 2 * 8192 * 8192 * 2 / 3.0e12)


def test_large_matmul_library_kernel_runs_at_measured_tensor_rate():
    n = 8192
    g = KernelGraph("mm", (DTensor("A", (n, n)), DTensor("B", (n, n))),
                    (KernelOp("matmul", ("A", "B"), DTensor("C", (n, n))),), ("C",))
    want = H100.launch_us + 1e6 * 2 * n ** 3 / 790e12  # 1394.3 us: compute bound
    assert estimate_us(g, "h100") == pytest.approx(want, rel=1e-9)
    assert kernel_costs(g, "h100")[0].bound == "tensor"


def test_large_matmul_graph_kernel_runs_near_the_tensor_roofline():
    """8192^3 in 128x128 output tiles, 3 stages: within 15 % of the library kernel's time once
    the partial last wave is paid for (the tiles' L2 traffic is close to the limit too)."""
    n = 8192
    g = matmul_graph(n, n, n, 128, 128, 32, threads=256)
    (c,) = kernel_costs(AnnotatedGraph(g, (3,)), "h100")
    roofline = 1e6 * 2 * n ** 3 / H100.tc_flops
    slots = H100.sm_count * c.blocks_per_sm
    quantised = roofline * math.ceil(4096 / slots) * slots / 4096  # 32 waves for 31.03 waves
    assert c.tc_us == pytest.approx(quantised, rel=1e-9)
    assert quantised + H100.launch_us <= c.us <= 1.15 * quantised + H100.launch_us


def test_tiny_kernel_costs_the_launch():
    g = one_kernel("tiny", [DTensor("X", (1, 64))], [DTensor("Y", (1, 64))], (1, 1, 1), 1,
                   [InputIter("x", 0, (R, R, R)), BlockOp("y", "mul", ("x", 2.0)),
                    OutputSaver("y", 0, (R, R, R))], 64)
    us = estimate_us(g, "h100")
    # one launch and one dependent global load, nothing else worth counting
    assert us == pytest.approx(H100.launch_us + H100.mem_latency_us, rel=1e-3)
    assert kernel_costs(g, "h100")[0].bound in ("latency", "launch")
    op = KernelGraph("t", (DTensor("X", (1, 64)),),
                     (KernelOp("mul", ("X", 2.0), DTensor("Y", (1, 64))),), ("Y",))
    assert estimate_us(op, "h100") == pytest.approx(H100.launch_us, rel=1e-3)
    assert kernel_costs(op, "h100")[0].bound == "launch"


# ---- effects ---------------------------------------------------------------------------------

def test_replicated_reads_hit_l2_and_dram_sees_each_byte_once():
    # every one of 64 blocks reads all of A (replicated): 64x the loads, 1x the DRAM traffic
    g = matmul_graph(64, 4096, 8192, 64, 128, 64, threads=128)
    (c,) = kernel_costs(g, "h100")
    a, b, out = 64 * 4096 * 2, 4096 * 8192 * 2, 64 * 8192 * 2
    assert c.dram_bytes == a + b + out
    assert c.load_bytes == 64 * a + b + out
    assert c.bytes == pytest.approx(a + 63 * a / L2_SPEEDUP + b + out)


def test_split_reduction_pays_for_its_combine_step():
    """A reduction split over 8 blocks saves float32 partials and a second kernel sums them:
    the partials' write and read-back and the extra launch are all charged."""
    M, K, N, S = 64, 4096, 64, 8
    split = KernelGraph("splitk", (DTensor("A", (M, K)), DTensor("B", (K, N))), (
        one_kernel("k1", [DTensor("A", (M, K)), DTensor("B", (K, N))],
                   [DTensor("P", (M, N * S), "float32")], (S, 1, 1), 8, [
                       InputIter("a", 0, (1, R, R), fmap=1), InputIter("b", 1, (0, R, R), fmap=0),
                       BlockOp("c", "matmul", ("a", "b")), Accum("acc", "c"),
                       OutputSaver("acc", 0, (1, R, R))]).ops[0],
        one_kernel("k2", [DTensor("P", (M, N * S), "float32")], [DTensor("C", (M, N))],
                   (1, 1, 1), S, [
                       InputIter("p", 0, (R, R, R), fmap=1), Accum("acc", "p"),
                       OutputSaver("acc", 0, (R, R, R))]).ops[0]), ("C",))
    c1, c2 = kernel_costs(split, "h100")
    partial = M * N * S * 4
    assert c1.intermediate_bytes == partial and c2.intermediate_bytes == partial
    assert c2.dram_bytes == partial + M * N * 2
    assert c2.us >= H100.launch_us


def test_occupancy_from_threads_registers_and_shared_memory():
    assert occupancy(H100, 128, 0) == 8  # registers: 65536 / (128 * 64)
    assert occupancy(H100, 1024, 0) == 1
    assert occupancy(H100, 64, 100 * 1024) == 2  # shared memory
    assert occupancy(H100, 128, 228 * 1024) == 0  # does not fit at all


def test_wave_quantisation_one_block_more_costs_a_wave():
    """Latency-bound blocks (64 dependent iterations): a wave costs the same however full it is,
    and a grid one wave and a bit long costs two."""
    def us(gx, gy):
        return estimate_us(matmul_graph(16 * gx, 1024, 16 * gy, 16, 16, 16, threads=128)) - 2.5
    c = kernel_costs(matmul_graph(16 * 32, 1024, 16 * 33, 16, 16, 16, threads=128))[0]
    assert c.blocks == H100.sm_count * c.blocks_per_sm == 1056  # exactly one full wave
    half, full, over = us(32, 16), us(32, 33), us(32, 34)
    assert half == pytest.approx(full, rel=0.05)
    assert over == pytest.approx(2 * full, rel=0.05)


def test_stages_hide_loop_latency_and_cost_shared_memory():
    g = matmul_graph(64, 8192, 64, 64, 64, 64, threads=128)  # one block, 128 iterations
    c1, c4 = (kernel_costs(AnnotatedGraph(g, (s,)), "h100")[0] for s in (1, 4))
    assert c1.latency_us == pytest.approx(H100.mem_latency_us * 128)
    assert c4.latency_us == pytest.approx(H100.mem_latency_us * (1 + 127 / 4))
    assert c4.us < c1.us / 2
    assert c4.smem == c1.smem + 3 * (64 * 64 * 2 * 2)  # three more copies of both input tiles
    # stages beyond what shared memory holds make the kernel impossible
    big = matmul_graph(256, 4096, 256, 128, 128, 64, threads=256)
    assert math.isinf(estimate_us(AnnotatedGraph(big, (4,)), "h100"))
    # no loop: stages change nothing
    cp = copy_graph(512, 512)
    assert estimate_us(AnnotatedGraph(cp, (4,))) == estimate_us(cp)


def test_idle_threads_are_charged():
    g = one_kernel("ew", [DTensor("X", (64, 64))], [DTensor("Y", (64, 64))], (64, 1, 1), 1,
                   [InputIter("x", 0, (0, R, R)), BlockOp("y", "exp", ("x",)),
                    OutputSaver("y", 0, (0, R, R))], 1024)
    assert kernel_costs(g, "h100")[0].simt_flops == 64 * 1024  # 64 elements, 1024 threads


def test_more_warps_until_the_tensor_cores_are_busy():
    g = matmul_graph(128, 4096, 128 * 16, 128, 128, 64)
    t64, t256 = (kernel_costs(AnnotatedGraph(replace_threads(g, th), (4,)), "h100")[0].tc_us
                 for th in (64, 256))
    assert t64 == pytest.approx(4 * t256)


def replace_threads(g, th):
    from mirage_py.tuning import with_threads
    return with_threads(g, (th,))


# ---- interface ---------------------------------------------------------------------------------

def test_interface_and_test_double():
    g, _ = tiled_matmul()
    assert AnalyticModel().predict(g, "h100") == estimate_us(g, "h100")
    assert create("analytic").predict(g, H100) == estimate_us(g)
    r = create("random", seed=1)
    assert isinstance(r, RandomModel)
    assert r.predict(g, "h100") == RandomModel(1).predict(g, "h100")
    assert r.predict(AnnotatedGraph(g, (2,)), "h100") != r.predict(g, "h100")
    assert 1 <= r.predict(g, "h100") < 1001
    with pytest.raises(MirageError, match="unknown cost model"):
        create("learned")
    with pytest.raises(MirageError, match="expected a KernelGraph"):
        AnalyticModel().predict("not a graph", "h100")


def test_targets_hold_the_issue_figures():
    for name in ("a100", "h100", "h200"):
        t = TARGETS[name]
        for f in ("sm_count", "smem_per_block", "smem_per_sm", "regs_per_sm", "regs_per_block",
                  "regs_per_thread", "l2_bytes", "mem_bw", "mem_bw_datasheet", "tc_flops",
                  "tc_flops_datasheet", "launch_us", "max_threads_per_sm"):
            assert getattr(t, f) > 0, (name, f)
        assert t.mem_bw < t.mem_bw_datasheet and t.tc_flops < t.tc_flops_datasheet
    assert TARGETS["a100"].arch == "sm_80" and TARGETS["h100"].arch == TARGETS["h200"].arch == \
        "sm_90"
    assert TARGETS["h100"].mem_bw == 3.0e12 and TARGETS["h200"].mem_bw == 4.3e12
    assert TARGETS["h100"].tc_flops == TARGETS["h200"].tc_flops == 790e12


def test_planned_shared_memory_is_what_code_generation_lays_out():
    """With the layout planner's footprint (what superopt ranks with), the model's shared memory
    and pipeline depth are those of the plan code generation uses; validation's bound is an
    upper bound of it. A loop whose loads go into accumulators keeps the requested depth."""
    from benchmarks.fixtures import hand_built
    from mirage_py.layout import plan_graph, planned_shared_memory
    from mirage_py.superopt import default_model
    model = default_model()
    for name in ("gqa", "rmsnorm_linear", "ntrans"):
        g = AnnotatedGraph(hand_built(name, 1), (3, 3))
        plan = plan_graph(g.graph, "h100", g.stages_full())
        planned = planned_shared_memory(g.graph, "h100", g.stages_full())
        rough = kernel_costs(g, "h100")
        for c, (k, kp), r in zip(model.kernel_costs(g, "h100"), plan.kernels.items(), rough):
            assert planned[k][0] == kp.smem.total_bytes == c.smem <= r.smem
            if kp.pipelined:
                assert c.stages == kp.pipeline
            else:
                assert c.stages == min(3, g.graph.ops[k].block.forloop)
    # four stages exceed shared memory under the bound (impossible), not as planned: the
    # planner reuses buffers (and would lower the depth until they fit)
    big = matmul_graph(256, 4096, 256, 128, 128, 64, threads=256)
    assert math.isinf(estimate_us(AnnotatedGraph(big, (4,)), "h100"))
    (c,) = model.kernel_costs(AnnotatedGraph(big, (4,)), "h100")
    assert c.smem <= H100.smem_per_block and c.us < math.inf

    def cannot(*_):
        from mirage_py.layout import LayoutError
        raise LayoutError("does not fit")
    assert math.isinf(AnalyticModel(smem_planner=cannot).predict(big, "h100"))


def test_register_tiles_cost_occupancy_under_the_planned_model():
    """Kernels keeping register tiles are assumed to need 40 + 2 registers per tile float
    (fitted to ptxas), which lowers occupancy where that exceeds 64."""
    from mirage_py.cost_model import estimated_registers
    from mirage_py.superopt import default_model
    assert estimated_registers(0) == 64 and estimated_registers(8) == 64
    assert estimated_registers(36) == 112 and estimated_registers(500) == 255
    assert occupancy(H100, 512, 0, 112) == 1 and occupancy(H100, 512, 0) == 2
    g = matmul_graph(256, 4096, 256, 64, 64, 64, threads=512)
    with_tiles, without = (AnalyticModel(smem_planner=lambda *a, f=f: {0: (16384, 2, f)})
                           .kernel_costs(g, "h100")[0] for f in (36, 0))
    assert (with_tiles.blocks_per_sm, without.blocks_per_sm) == (1, 2)
    # the planner reports the floats of the plan's register tiles
    from benchmarks.fixtures import hand_built
    from mirage_py.layout import planned_shared_memory
    (smem, depth, floats), _ = planned_shared_memory(hand_built("gqa", 1)).values()
    assert floats == 64  # scores (the probabilities replace them) and the output, 32 floats each
    assert default_model().kernel_costs(hand_built("gqa", 1), "h100")[0].blocks_per_sm == \
        occupancy(H100, 128, smem, estimated_registers(64))


def test_operator_costs_and_masks():
    """An element-wise operator is charged its op-table cost per element (mish is seven
    operations, exp one); a mask iterator reads no memory, two operations per element."""
    from mirage_py.ugraph import MaskIter

    def ew(op):
        return one_kernel("ew", [DTensor("X", (64, 256))], [DTensor("Y", (64, 256))], (64, 1, 1),
                          1, [InputIter("x", 0, (0, R, R)), BlockOp("y", op, ("x",)),
                              OutputSaver("y", 0, (0, R, R))], 256)

    exp, mish = (kernel_costs(ew(op), "h100")[0] for op in ("exp", "mish"))
    assert mish.simt_flops == 7 * exp.simt_flops and mish.bytes == exp.bytes
    masked = one_kernel("m", [DTensor("X", (64, 256))], [DTensor("Y", (64, 256))], (64, 1, 1), 1,
                        [InputIter("x", 0, (0, R, R)), MaskIter("m", (64, 256), 0, 0, (0, R, R)),
                         BlockOp("y", "where", ("m", "x", -1.0)),
                         OutputSaver("y", 0, (0, R, R))], 256)
    c = kernel_costs(masked, "h100")[0]
    assert c.bytes == exp.bytes  # the mask adds no traffic
    assert c.simt_flops == exp.simt_flops * 3  # 2 per element for the mask, 1 for the where


# ---- the lower bound -----------------------------------------------------------------------

def _boundary(d: int = 512, f: int = 1408) -> "object":
    """A decoder layer boundary: down projection, residual add, the next RMSNorm and query
    projection. The query's row statistic needs all of Wd (f x d) in one block."""
    import mirage_py as mp
    p = mp.Program("boundary")
    h, wd = p.input("H", (1, f)), p.input("Wd", (f, d))
    r, wq = p.input("R", (1, d)), p.input("Wq", (d, 256))
    x = h @ wd + r
    p.output(x, "X")
    p.output(mp.rms_norm(x) @ wq, "Q")
    return p


def test_lower_bound_holds_for_every_candidate_the_search_finds():
    """Every candidate of one, two or three kernels costs at least the bound for its kernel
    count, under the model superopt ranks with (the layout planner's shared memory): on the
    layer boundary the one-kernel bound is the read cone's (all of Wd in one block at one
    SM's pull), far above launch + latency, and the one-kernel answers really cost that."""
    from mirage_py.examples import get_program
    from mirage_py.generator.kernel_search import search
    from mirage_py.superopt.search import default_model
    from mirage_py.cost_model import lower_bound_us
    import time
    model = default_model()
    per_sm = 4.0 * H100.mem_bw / H100.sm_count
    wd_us = 1e6 * 1408 * 512 * 2 / per_sm
    one = lower_bound_us(_boundary(), H100, kernels=1)
    assert one >= H100.launch_us + wd_us  # ~18 us, where launch + latency is 3
    assert lower_bound_us(_boundary(), H100) == lower_bound_us(_boundary(), H100, kernels=2)
    checked = {1: 0, 2: 0}
    for prog, mk in [(_boundary(), 2), (_boundary(256, 512), 2), (get_program("gqa"), 1),
                     (get_program("mqa"), 2), (get_program("rmsnorm_linear"), 1),
                     (get_program("ntrans"), 2)]:
        found = search(prog, H100, max_kernels=mk, deadline=time.perf_counter() + 20)
        assert found, prog.name
        if prog.name == "gqa":  # one kernel: each block reads a head's whole K and V
            assert lower_bound_us(prog, H100, kernels=1) > lower_bound_us(prog, H100, kernels=2)
        bound = lower_bound_us(prog, H100)
        for c in found:
            k = c.graph.num_kernels
            cost = model.predict(c.graph, H100)
            assert cost >= lower_bound_us(prog, H100, kernels=k) - 1e-9, (prog.name, k)
            assert cost >= bound - 1e-9
            checked[min(k, 2)] += 1
    assert checked[1] and checked[2]


def test_lower_bound_kernels_must_be_positive():
    from mirage_py.cost_model import lower_bound_us
    with pytest.raises(MirageError, match="0 kernels"):
        lower_bound_us(_boundary(), H100, kernels=0)


def _random_chain(seed: int):
    """A random chain at sizes where read cones matter: a matmul, element-wise operators, maybe
    a row norm or a softmax, maybe a second matmul, maybe a row sum, one or two outputs."""
    import mirage_py as mp
    import numpy as np
    rng = np.random.default_rng(seed)
    m, k, n, q = (int(rng.choice(c)) for c in ([1, 8, 16], [256, 512, 1024],
                                                 [256, 512, 1024], [64, 128, 256]))
    p = mp.Program(f"chain{seed}")
    x, w1 = p.input("X", (m, k)), p.input("W1", (k, n))
    h = x @ w1
    for op in rng.choice(["silu", "exp", "square", "add", "mul"], size=int(rng.integers(0, 3))):
        h = {"silu": mp.silu, "exp": lambda t: mp.exp(t * 0.01), "square": mp.square,
             "add": lambda t: t + 1.0, "mul": lambda t: t * 0.5}[str(op)](h)
    shape = rng.integers(0, 3)
    if shape == 1:
        h = mp.rms_norm(h)
    elif shape == 2:
        h = mp.softmax(h, axis=-1)
    if rng.random() < 0.5:
        p.output(h, "H")
    if rng.random() < 0.7:
        h = h @ p.input("W2", (n, q))
    if rng.random() < 0.3:
        h = mp.sum(h, axis=-1, keepdims=True)
    p.output(h, "Y")
    return p


def test_lower_bound_holds_on_random_chains():
    """Random matmul chains with norms and softmaxes at real sizes: no candidate of one or two
    kernels the search finds costs less than the bound for its kernel count (and the read cone
    is what sets the one-kernel bound for some of them)."""
    import time
    from mirage_py.cost_model import lower_bound_us
    from mirage_py.generator.kernel_search import search
    from mirage_py.superopt.search import default_model
    model = default_model()
    checked, cone_bound = 0, 0
    for seed in range(8):
        prog = _random_chain(seed)
        one = lower_bound_us(prog, H100, kernels=1)
        cone_bound += one > H100.launch_us + H100.mem_latency_us + 0.5
        for c in search(prog, H100, max_kernels=2, deadline=time.perf_counter() + 4):
            cost = model.predict(c.graph, H100)
            assert cost >= lower_bound_us(prog, H100, kernels=c.graph.num_kernels) - 1e-9, seed
            assert cost >= lower_bound_us(prog, H100) - 1e-9, seed
            checked += 1
    assert checked >= 8 and cone_bound >= 2


def test_targets_fp32_and_tf32_rates_follow_from_the_chips():
    """Every target's CUDA-core fp32 rate is its SMs x fp32 lanes per SM (64 on sm_75 / sm_80,
    128 on sm_86 and later) x 2 (an FMA) x boost clock, within 2 %; TF32 runs on tensor cores
    where the part has them (at least the CUDA-core rate, at most the fp16 rate), and the parts
    of KernelBench's published timings are all there (H100 PCIe beside the SXM h100)."""
    lanes = {"sm_75": 64, "sm_80": 64, "sm_86": 128, "sm_89": 128, "sm_90": 128}
    for name, t in TARGETS.items():
        peak = t.sm_count * lanes[t.arch] * 2 * t.clock_ghz * 1e9
        assert abs(t.fp32_flops / peak - 1) < 0.02, (name, t.fp32_flops, peak)
        assert t.fp32_flops <= t.tf32_flops <= t.tc_flops_datasheet, name
        assert t.mem_bw < t.mem_bw_datasheet, name
    assert TARGETS["t4"].tf32_flops == TARGETS["t4"].fp32_flops  # Turing: no TF32
    for name in ("h100_pcie", "a100_40gb", "l40s", "l4", "a10g", "a10", "t4"):
        assert name in TARGETS
    assert TARGETS["h100_pcie"].sm_count < TARGETS["h100"].sm_count
    assert TARGETS["h100_pcie"].mem_bw_datasheet < TARGETS["h100"].mem_bw_datasheet


def test_calibrated_model_by_name_scales_bandwidth_and_launch():
    """``create("calibrated")`` is the analytic model on targets whose bandwidth and launch
    carry the fitted factors (calibration.json; here given): a copy costs the scaled launch plus
    its bytes at the scaled bandwidth, and the default model is untouched."""
    from mirage_py.cost_model import CALIBRATION, CalibratedModel
    g = copy_graph()
    nbytes = 2 * 8192 * 8192 * 2
    m = create("calibrated", mem_eff=0.5, launch_scale=2.0)
    assert isinstance(m, CalibratedModel) and m.name == "calibrated"
    assert m.predict(g, "h100") == pytest.approx(5.0 + 1e6 * nbytes / 1.5e12, rel=1e-9)
    assert estimate_us(g, "h100") == pytest.approx(2.5 + 1e6 * nbytes / 3.0e12, rel=1e-9)
    fitted = json.loads(CALIBRATION.read_text())
    assert 0 < fitted["mem_eff"] and "h100_pcie" in fitted["target_mem_eff"]
    shipped = CalibratedModel()
    assert shipped.target("h100_pcie").mem_bw == pytest.approx(
        1.8e12 * fitted["mem_eff"] * fitted["target_mem_eff"]["h100_pcie"])
    import mirage_py as mp
    p = mp.Program("t")
    x = p.input("X", (64, 256), dtype="float16")
    p.output(mp.exp(x), name="Y")
    assert shipped.lower_bound(p, "h100") > 0


def test_shared_memory_traffic_counts_every_tile_read_and_written():
    """KernelCost.smem_traffic of a tiled matmul: per loop iteration the two operand tiles are
    stored, read by the matmul, its product written, then read and added into the accumulator
    (read and written); the saver reads the accumulator once per block. The calibrated model
    with ``smem_eff`` prices a kernel at least at that traffic over the occupied SMs' 128 bytes a
    clock; without it, as the analytic model."""
    from mirage_py.cost_model import CalibratedModel, kernel_costs, smem_us
    M = K = N = 1024
    tm, tn, tk = 128, 128, 32
    g = matmul_graph(M, K, N, tm, tn, tk)
    (c,) = kernel_costs(g, "h100")
    blocks, iters = (M // tm) * (N // tn), (M // tm) * (N // tn) * (K // tk)
    a, b = tm * tk * 2, tk * tn * 2  # float16 operand tiles
    prod = acc = tm * tn * 4  # float32 product and accumulator
    per_iteration = (a + b) + (a + b + prod) + (prod + acc + acc)
    assert c.smem_traffic == per_iteration * iters + acc * blocks
    t = get_target("h100")
    us = c.smem_traffic / (min(blocks, t.sm_count) * 128 * t.clock_ghz * 1e9) * 1e6
    assert smem_us(c, t) == pytest.approx(us)
    plain = CalibratedModel(mem_eff=1.0, launch_scale=1.0)
    slow = CalibratedModel(mem_eff=1.0, launch_scale=1.0, smem_eff=0.01)
    assert plain.predict(g, "h100") == pytest.approx(estimate_us(g, "h100"))
    assert slow.predict(g, "h100") == pytest.approx(t.launch_us + 100 * us)
