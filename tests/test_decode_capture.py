"""A captured decode step fuses like the hand-written decode block (issue #28).

A decode step captured from transformers has what the hand-written block leaves out: the new
token's k / v projections, rotary embeddings from a position (``cos`` / ``sin`` of a table
``cat(f, f)``), the KV cache's ``cat(past, new)`` viewed and transposed before the scores, grouped
heads, and the output projection in heads form summed over heads. The programs below take that
form (as ``frontend_torch/region_programs.py`` writes it) at a tiny size; each test evaluates what
the search finds against the program in float64 and verifies it.
"""

import numpy as np
import pytest

import mirage_py as mp
from mirage_py.generator.kernel_search import Searcher
from mirage_py.regions.candidates import search_regions
from mirage_py.regions.region import PartDag, extract
from mirage_py.targets import get_target
from mirage_py.verifier import verify

TARGET = get_target("h100")
D, H, KV, HD, PAST = 32, 4, 2, 8, 6


def _layer(bias: bool = False) -> tuple[mp.Program, dict]:
    """One attention half of a Llama decode layer in captured form (``bias``: Qwen2's, with
    biases on the q, k and v projections); returns the program and its operators by role
    (tensors)."""
    p = mp.Program("captured_decode_attention")
    x = p.input("x", (1, 1, D))
    g = p.input("g", (D,))
    wq = p.input("wq", (H, D, HD))
    wk = p.input("wk", (KV, D, HD))
    wv = p.input("wv", (KV, D, HD))
    wo = p.input("wo", (H, HD, D))
    pos = p.input("pos", (1, 1, 1))
    inv = p.input("inv_freq", (HD // 2,))
    pk = p.input("past_k", (1, KV, PAST, HD))
    pv = p.input("past_v", (1, KV, PAST, HD))
    n = mp.reshape(mp.rms_norm(x, g), (1, 1, 1, D))
    f = pos * inv
    table = mp.concat([f, f], axis=2)
    cos, sin = mp.reshape(mp.cos(table), (1, 1, 1, HD)), mp.reshape(mp.sin(table), (1, 1, 1, HD))

    def rope(t):
        half = HD // 2
        rot = mp.concat([-mp.slice(t, 3, half, HD), mp.slice(t, 3, 0, half)], axis=3)
        return t * cos + rot * sin

    def project(w, heads):
        return n @ w + p.input(f"{w.name}_bias", (heads, 1, HD)) if bias else n @ w

    q = mp.reshape(rope(project(wq, H)), (1, KV, H // KV, 1, HD))
    k = mp.concat([pk, rope(project(wk, KV))], axis=2)
    kt = mp.transpose(mp.reshape(k, (1, KV, 1, PAST + 1, HD)), (0, 1, 2, 4, 3))
    s = (q @ kt) * (HD ** -0.5)
    e = mp.exp(s - mp.max(s, axis=4, keepdims=True))
    a = e / mp.sum(e, axis=4, keepdims=True)
    v = mp.reshape(mp.concat([pv, project(wv, KV)], axis=2), (1, KV, 1, PAST + 1, HD))
    o = mp.reshape(a @ v, (1, H, 1, HD))
    h = mp.sum(o @ wo, axis=1) + x
    p.output(h, name="h")
    return p, {"n": n, "table": table, "kt": kt, "s": s, "a": a, "o": o, "h": h,
               "caches": (pk, pv)}


def _positions(p: mp.Program, dag: PartDag, t) -> set[int]:
    return {dag.pos[t.digest]}


def _found(program: mp.Program) -> list:
    return Searcher(program, TARGET).search(max_kernels=1)


def _check(program: mp.Program, graph) -> None:
    assert verify(program, graph).equivalent
    x = program.random_inputs(seed=3)
    ref = program.evaluate(x)
    got = graph.run(x, precision="float64")
    for k in ref:
        assert np.linalg.norm(got[k] - ref[k]) <= 1e-9 * max(np.linalg.norm(ref[k]), 1.0), k


def _smallest_is_one_kernel(dag: PartDag, regions: list, what: str) -> None:
    """The smallest of ``regions`` has one-kernel candidates, each verified and equal to the
    float64 reference (the first three)."""
    assert regions, f"no region holds {what}"
    reg = extract(dag, min(regions, key=len))
    cands = _found(reg.program)
    assert cands, f"no one-kernel candidate for {what}"
    for c in cands[:3]:
        _check(reg.program, c.graph)


def _ops_between(dag: PartDag, first, last) -> frozenset:
    """The operators at positions between ``first`` and ``last`` (tensors), both included,
    that ``last`` depends on."""
    lo, hi = dag.pos[first.digest], dag.pos[last.digest]
    anc = dag.ancestors({last.digest}) | {last.digest}
    return frozenset(d for d in anc if lo <= dag.pos[d] <= hi)


def test_kv_cache_attention_is_a_region_with_its_concatenation():
    """``cat(past, new)`` viewed and transposed before the scores is one piece of glue: a region
    holds the concatenation with the scores and softmax (and the values' product), so no copy
    kernel writes the cache; one kernel computes it."""
    p, v = _layer()
    dag = PartDag(p)
    regions = set(search_regions(dag))
    kt = v["kt"]
    cat = kt.inputs[0].inputs[0]
    assert cat.op == "concat"
    # the region from the concatenation of the cache to the softmax
    want = frozenset({cat.digest, kt.inputs[0].digest, kt.digest}) | \
        _ops_between(dag, v["s"].inputs[0], v["a"]) - {d for d in _ops_between(
            dag, v["s"].inputs[0], v["a"]) if dag.pos[d] < dag.pos[v["s"].inputs[0].digest]}
    have = [r for r in regions if want <= r and cat.digest in r and
            not any(dag.by_digest[d].op == "matmul" and dag.pos[d] < dag.pos[cat.digest]
                    for d in r)]
    assert have, "no region holds the cache's concatenation with the scores"
    reg = extract(dag, min(have, key=len))
    cands = _found(reg.program)
    assert cands
    _check(reg.program, min(cands, key=lambda c: len(c.graph.ops)).graph)


def test_q_k_v_projections_of_one_token_are_one_region_and_one_kernel():
    """The q, k and v projections of one normalised token with their rotary embeddings (what
    the decode step's cover takes: the norm is a kernel of its own) are a region, and one block
    computes it: each projection has heads of its own, so no label is common to the outputs and
    no grid splits them all (no plan at all before ``Searcher._one_block``)."""
    p, v = _layer()
    dag = PartDag(p)
    mms = [d for d in dag.by_digest if dag.by_digest[d].op == "matmul" and
           dag.by_digest[d].inputs[0].digest == v["n"].digest]
    assert len(mms) == 3
    # with both rotary embeddings (q's and k's ``t * cos + rotate_half(t) * sin``), without
    # the norm (an anchor more) and the softmax
    regions = [r for r in search_regions(dag) if set(mms) <= r and
               sum(dag.by_digest[d].op == "add" for d in r) == 2 and
               not any(dag.by_digest[d].op in ("exp", "sum") for d in r)]
    _smallest_is_one_kernel(dag, regions, "the three projections and their rotary")


def test_biased_q_k_v_projections_are_a_region_without_the_cache():
    """With a bias on each projection (Qwen2), q, k and v with their biases and rotary
    embeddings are still a region that leaves the KV cache's concatenations to the attention
    (the epilogue core takes ``cat(past_v, v + b)`` in, since it reads nothing computed
    outside; ``_trimmed`` offers the region without it), and one block computes it. Before,
    every such region also wrote the cache, and the captured Qwen2 decode step ran the v
    projection with the attention's value product: 15 kernels against Llama's 13."""
    p, v = _layer(bias=True)
    dag = PartDag(p)
    mms = [d for d in dag.by_digest if dag.by_digest[d].op == "matmul" and
           dag.by_digest[d].inputs[0].digest == v["n"].digest]
    caches = {t.digest for t in v["caches"]}
    assert len(mms) == 3
    regions = [r for r in search_regions(dag) if set(mms) <= r and
               sum(dag.by_digest[d].op == "add" for d in r) == 5 and
               not any(dag.by_digest[d].op in ("exp", "sum") for d in r) and
               not any(dag.by_digest[d].op == "concat" and
                       {i.digest for i in dag.by_digest[d].inputs} & caches for d in r)]
    _smallest_is_one_kernel(dag, regions, "the biased projections and their rotary")


def test_norm_with_its_sibling_projections_is_one_region_and_one_kernel():
    """Products of one operand with weights count as one anchor: the norm (its sum of squares)
    with the q, k and v projections that read it is a region (four anchors: none without the
    counting), and one block computes it (the tiny Llama prefill's cover takes the down
    projection with the next norm and the k and v projections: 12 -> 11 kernels)."""
    p, v = _layer()
    dag = PartDag(p)
    mms = [d for d in dag.by_digest if dag.by_digest[d].op == "matmul" and
           dag.by_digest[d].inputs[0].digest == v["n"].digest]
    sums = [d for d in dag.by_digest if dag.by_digest[d].op == "sum" and
            dag.pos[d] < dag.pos[v["n"].digest]]
    assert len(mms) == 3 and len(sums) == 1
    regions = [r for r in search_regions(dag) if set(mms) | set(sums) <= r and
               not any(dag.by_digest[d].op == "exp" for d in r)]
    _smallest_is_one_kernel(dag, regions, "the norm and its three projections")


def test_rotary_table_of_one_position_is_one_kernel():
    """``cos`` and ``sin`` of ``cat(f, f)`` at one position: the concatenation's axis is the
    only label of the outputs, which no input carries; one block computes both."""
    p = mp.Program("rotary_table")
    f = p.input("pos", (1, 1, 1)) * p.input("inv_freq", (4,))
    t = mp.concat([f, f], axis=2)
    p.output(mp.cos(t), name="cos")
    p.output(mp.sin(t), name="sin")
    cands = _found(p)
    assert cands
    _check(p, cands[0].graph)


def test_partial_rotary_key_concatenated_to_the_cache_is_one_kernel():
    """GPT-NeoX's key: a rotary embedding of the first ``r`` features only,
    ``cat(rope(k[..., :r]), k[..., r:])``, then the cache's ``cat(past, that)`` transposed for
    the scores. The new row is made by a concatenation of its own, a round after the cache's
    tile: the block search never tried the cache's concatenation with it (no candidate; the
    captured decode step ran it as 13 naive kernels a layer). Also the plain ``cat(past, new)``
    written as an output (no candidate before either)."""
    half = 2
    for scores in (True, False):
        p = mp.Program("partial_rotary_key")
        k = p.input("k", (1, H, 1, HD))
        cos, sin = p.input("cos", (1, 1, 1, 2 * half)), p.input("sin", (1, 1, 1, 2 * half))
        past = p.input("past", (1, H, PAST, HD))
        r = mp.slice(k, 3, 0, 2 * half)
        rot = mp.concat([-mp.slice(r, 3, half, 2 * half), mp.slice(r, 3, 0, half)], axis=3)
        new = mp.concat([r * cos + rot * sin, mp.slice(k, 3, 2 * half, HD)], axis=3)
        cache = mp.concat([past, new], axis=2)
        if scores:
            q = p.input("q", (1, H, 1, HD))
            p.output(q @ mp.transpose(cache, (0, 1, 3, 2)), name="s")
        else:
            p.output(cache, name="cache")
        cands = _found(p)
        assert cands, f"no one-kernel candidate (scores={scores})"
        _check(p, cands[0].graph)


def test_normalised_row_written_beside_its_projection():
    """A region that writes the normalised token and its projection (the token is read by
    other projections outside it): one block holds the row whole."""
    p = mp.Program("row_and_projection")
    x = p.input("x", (1, 1, D))
    n = mp.reshape(mp.rms_norm(x, p.input("g", (D,))), (1, 1, 1, D))
    p.output(n, name="n")
    p.output(n @ p.input("wq", (H, D, HD)), name="q")
    cands = _found(p)
    assert cands
    _check(p, cands[0].graph)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_decode_step_fuses_like_the_hand_written_block(arch):
    """The tiny Llama of ``benchmarks/models.py`` at decode (2 layers, one token over a cache of
    16) through ``mp.compile``: one region, nothing eager, equal to eager, and at most 13
    kernels -- the embedding lookup and the rotary table, then about five a layer like the
    hand-written decode block, the final norm and head fused into the last (25 before the
    KV cache's concatenation joined the attention region, the three projections one region and
    the rotary table one kernel). Qwen2 (biases on q, k and v) too: 15 before ``_trimmed``.
    Minutes of search: slow."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from benchmarks.models import ARCHITECTURES, _decode
    model, inputs = _decode(ARCHITECTURES[arch])()
    model = model.eval()
    g = torch.Generator().manual_seed(1)
    for prm in model.parameters():
        prm.data = torch.randn(prm.shape, generator=g) * 0.2
    past = inputs.pop("past")
    with torch.no_grad():
        ref = model(inputs["input_ids"], *past)
        cm = mp.compile(model, workers=1, database=False)
        got = cm(inputs["input_ids"], *past)
    assert float((got - ref).norm() / ref.norm()) <= 1e-5
    rows = cm.regions()
    assert len(rows) == 1 and not cm.eager_ops() and rows[0]["verified"], cm.report()
    assert rows[0]["kernels"] <= 13, cm.report()
