"""μGraph JSON: exact round trips, canonical renaming, structural hashes, malformed input."""

import json
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from benchmarks.programs import NAMES, get_program
from mirage_py.errors import MirageError, SerializationError
from mirage_py.ugraph import (Accum, BlockOp, DTensor, Fused, InputIter, KernelGraph, KernelOp,
                              OutputSaver, canonicalize, loads, naive_lowering, run)
from ugraph_cases import CASES, R, inputs_for, thread

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)


def roundtrip(g: KernelGraph) -> KernelGraph:
    text = g.dumps()
    h = loads(text)
    assert h == g
    assert h.dumps() == text
    assert h.structural_hash() == g.structural_hash()
    assert KernelGraph.loads(text) == g and KernelGraph.from_json(json.loads(text)) == g
    return h


@pytest.mark.parametrize("name", NAMES)
def test_naive_lowering_roundtrip(name):
    roundtrip(naive_lowering(get_program(name, 1)))


def test_fixture_roundtrip():
    fixtures = pytest.importorskip("benchmarks.fixtures")
    for name in NAMES:
        roundtrip(fixtures.hand_built(name, 1))


@pytest.mark.parametrize("name", sorted(CASES))
def test_hand_written_roundtrip_runs_identically(name):
    g, _ = CASES[name]()
    h = roundtrip(g)
    x = inputs_for(g)
    for precision in ("float64", "gpu"):
        a, b = run(g, x, precision=precision), run(h, x, precision=precision)
        for o in g.outputs:
            np.testing.assert_array_equal(a[o], b[o])


def test_float_constants_are_exact():
    consts = [0.1, 1 / 3, 1e-6, 2.0**-1074, 1.7976931348623157e308, -0.0, 123456789.123456789,
              np.float64(0.7)]
    ops = [Fused(f"f{i}", ("x",), thread(("v", "mul", "in0", c), ("w", "add", "v", c),
                                         ninputs=1)) for i, c in enumerate(consts)]
    ops += [BlockOp("s", "add", ("f0", consts[1]))]
    for i in range(1, len(consts)):
        ops.append(BlockOp(f"s{i}", "add", ("s" if i == 1 else f"s{i - 1}", f"f{i}")))
    g = KernelGraph("consts", (DTensor("X", (4, 8)),), (
        KernelOp("mul", ("X", 0.1), DTensor("Y", (4, 8))),
        KernelOp("rms_norm", ("Y",), DTensor("Z", (4, 8)), (("eps", 1e-5),)),
        replace(CASES["bias_add"]()[0].ops[0], inputs=("Z",), outputs=(DTensor("O", (4, 8)),),
                block=replace(CASES["bias_add"]()[0].ops[0].block, grid=(1, 1, 1), ops=(
                    InputIter("x", 0, (R, R, R)), *ops,
                    OutputSaver(f"s{len(consts) - 1}", 0, (R, R, R))))),
    ), ("O",))
    g.validate()
    h = roundtrip(g)
    got = [o.thread.ops[0].operands[1] for o in h.ops[2].block.ops if isinstance(o, Fused)]
    assert all(type(c) is float for c in got)
    assert [c.hex() for c in got] == [float(c).hex() for c in consts]
    assert str(got[5]) == "-0.0"
    assert h.ops[1].attrs == (("eps", 1e-5),) and h.ops[0].operands == ("X", 0.1)
    x = inputs_for(g)
    np.testing.assert_array_equal(run(g, x)["O"], run(h, x)["O"])


def test_ints_and_floats_stay_distinct():
    g = KernelGraph("k", (DTensor("X", (4,)),), (KernelOp("mul", ("X", 2), DTensor("Y", (4,))),),
                    ("Y",))
    h = roundtrip(g)
    assert type(h.ops[0].operands[1]) is int
    g2 = replace(g, ops=(KernelOp("mul", ("X", 2.0), DTensor("Y", (4,))),))
    assert type(roundtrip(g2).ops[0].operands[1]) is float
    # 2 and 2.0 mean different graphs to the serializer (the verifier may treat them alike)
    assert g.structural_hash() != g2.structural_hash()


# -- canonical renaming and the structural hash ---------------------------------------------------

def renamed(g: KernelGraph, tag: str) -> KernelGraph:
    """``g`` with every intermediate tensor, tile and thread value renamed (inputs and outputs
    keep their names)."""
    keep = {t.name for t in g.inputs} | set(g.outputs)

    def t(n):
        return n if n in keep else f"{tag}_{n}"

    def tile(n):
        return f"{tag}{n}" if isinstance(n, str) else n

    def th(tg):
        m = lambda o: o if not isinstance(o, str) or o.startswith("in") else f"{tag}{o}"  # noqa
        return replace(tg, ops=tuple(replace(o, out=m(o.out), operands=tuple(map(m, o.operands)))
                                     for o in tg.ops))

    ops = []
    for op in g.ops:
        if isinstance(op, KernelOp):
            ops.append(replace(op, operands=tuple(t(o) if isinstance(o, str) else o
                                                  for o in op.operands),
                               output=replace(op.output, name=t(op.output.name))))
            continue
        nodes = []
        for n in op.block.ops:
            if isinstance(n, InputIter):
                n = replace(n, out=tile(n.out))
            elif isinstance(n, BlockOp):
                n = replace(n, out=tile(n.out), operands=tuple(map(tile, n.operands)))
            elif isinstance(n, Fused):
                n = replace(n, out=tile(n.out), operands=tuple(map(tile, n.operands)),
                            thread=th(n.thread))
            elif isinstance(n, Accum):
                n = replace(n, out=tile(n.out), input=tile(n.input))
            elif isinstance(n, OutputSaver):
                n = replace(n, input=tile(n.input))
            nodes.append(n)
        ops.append(replace(op, inputs=tuple(map(t, op.inputs)),
                           outputs=tuple(replace(o, name=t(o.name)) for o in op.outputs),
                           block=replace(op.block, ops=tuple(nodes))))
    return replace(g, ops=tuple(ops))


@pytest.mark.parametrize("name", sorted(CASES))
def test_renaming_does_not_change_the_hash(name):
    g, _ = CASES[name]()
    h = renamed(g, "zz")
    h.validate()
    assert h != g
    assert canonicalize(h) == canonicalize(g)
    assert h.structural_hash() == g.structural_hash()
    assert replace(g, name="other").structural_hash() == g.structural_hash()
    x = inputs_for(g)
    for o in g.outputs:
        np.testing.assert_array_equal(run(g, x)[o], run(h, x)[o])


def test_naive_lowering_renaming_does_not_change_the_hash():
    g = naive_lowering(get_program("qknorm_gqa", 1))
    assert renamed(g, "q").structural_hash() == g.structural_hash()
    c = g.canonical()
    assert c.canonical() == c  # idempotent
    c.validate()


def test_canonical_names_avoid_kept_names():
    # an input called t0 must not collide with the first renamed intermediate
    g = KernelGraph("c", (DTensor("t0", (4,)),), (
        KernelOp("exp", ("t0",), DTensor("a", (4,))),
        KernelOp("neg", ("a",), DTensor("t1", (4,))),
        KernelOp("mul", ("a", "t1"), DTensor("out", (4,))),
    ), ("out", "t1"))
    g.validate()
    c = g.canonical()
    c.validate()
    assert [op.output.name for op in c.ops] == ["t2", "t1", "out"]


def structural_variants(g: KernelGraph) -> dict[str, KernelGraph]:
    gk = g.ops[0]
    bg = gk.block

    def nodes(j, n):
        ops = list(bg.ops)
        ops[j] = n
        return replace(g, ops=(replace(gk, block=replace(bg, ops=tuple(ops))),) + g.ops[1:])

    def blk(**kw):
        return replace(g, ops=(replace(gk, block=replace(bg, **kw)),) + g.ops[1:])

    return {
        "grid": blk(grid=(1, 3, 1)),
        "threads": blk(threads=256),
        "forloop": blk(forloop=2),
        "imap": nodes(0, replace(bg.ops[0], imap=(R, R, R))),
        "fmap": nodes(1, replace(bg.ops[1], fmap=R)),
        "op": nodes(2, BlockOp("c", "mul", ("a", "b"))),
        "operand order": nodes(2, BlockOp("c", "matmul", ("b", "a"))),
        "omap": nodes(4, replace(bg.ops[4], omap=(1, 0, R))),
        "dtype": replace(g, inputs=(replace(g.inputs[0], dtype="bfloat16"), g.inputs[1])),
        "shape": replace(g, inputs=(replace(g.inputs[0], shape=(64, 256)), g.inputs[1])),
        "output name": replace(g, outputs=("D",), ops=(replace(gk, outputs=(
            replace(gk.outputs[0], name="D"),)),)),
        "extra kernel": replace(g, ops=g.ops + (KernelOp("exp", ("C",), DTensor("E", (64, 96))),),
                                outputs=("E",)),
    }


def test_structural_changes_change_the_hash():
    g, _ = CASES["tiled_matmul"]()
    hashes = {"base": g.structural_hash()}
    for what, h in structural_variants(g).items():
        hashes[what] = h.structural_hash()
    assert len(set(hashes.values())) == len(hashes), hashes


def test_thread_graph_changes_change_the_hash():
    g, _ = CASES["rms_matmul"]()
    gk = g.ops[0]
    y = gk.block.ops[7]
    variants = [
        replace(y, thread=replace(y.thread, ops=y.thread.ops[:1] + (
            replace(y.thread.ops[1], operands=("m", 1e-5)),) + y.thread.ops[2:])),
        replace(y, thread=replace(y.thread, ops=y.thread.ops[:3] + (
            replace(y.thread.ops[3], op="mul"),))),
        replace(y, operands=("acc_ss", "acc_xw")),
    ]
    seen = {g.structural_hash()}
    for v in variants:
        ops = list(gk.block.ops)
        ops[7] = v
        seen.add(replace(g, ops=(replace(gk, block=replace(gk.block, ops=tuple(ops))),))
                 .structural_hash())
    assert len(seen) == 4


def test_hash_is_cached_per_graph_and_not_shared_by_replace():
    g, _ = CASES["tiled_matmul"]()
    h0 = g.structural_hash()
    g2 = replace(g, inputs=(replace(g.inputs[0], dtype="float32"), g.inputs[1]))
    assert g2.structural_hash() != h0 and g.structural_hash() == h0


HASH_SCRIPT = """
import sys
sys.path[:0] = [{root!r}, {tests!r}]
from benchmarks.programs import get_program
from mirage_py.ugraph import naive_lowering
from ugraph_cases import CASES
for name in sorted(CASES):
    print(CASES[name]()[0].structural_hash())
print(naive_lowering(get_program("lora", 1)).structural_hash())
"""


def test_hash_is_stable_across_processes():
    here = [CASES[name]()[0].structural_hash() for name in sorted(CASES)]
    here.append(naive_lowering(get_program("lora", 1)).structural_hash())
    script = HASH_SCRIPT.format(root=ROOT, tests=TESTS)
    outs = []
    for seed in ("0", "12345"):  # different str hash randomisation in each process
        env = dict(os.environ, PYTHONHASHSEED=seed)
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        outs.append(proc.stdout.split())
    assert outs[0] == outs[1] == here
    assert all(len(h) == 64 for h in here)


# -- malformed and foreign documents ------------------------------------------------------------

def _doc():
    return json.loads(CASES["rms_matmul"]()[0].dumps())


def _edit(fn):
    d = _doc()
    fn(d)
    return json.dumps(d)


BAD = {
    "not json": "{nope",
    "empty": "",
    "a list": "[1, 2, 3]",
    "a number": "42",
    "null": "null",
    "foreign format": json.dumps({"format": "something.else", "version": 1}),
    "a program": get_program("lora", 1).dumps(),
    "no format": _edit(lambda d: d.pop("format")),
    "future version": _edit(lambda d: d.update(version=99)),
    "missing ops": _edit(lambda d: d.pop("ops")),
    "unknown node": _edit(lambda d: d["ops"][0].update(node="Teleport")),
    "node tag missing": _edit(lambda d: d["ops"][0].pop("node")),
    "missing field": _edit(lambda d: d["ops"][0]["block"].pop("forloop")),
    "extra field": _edit(lambda d: d["ops"][0]["block"].update(stages=3)),
    "bad float": _edit(lambda d: d["ops"][0]["block"]["ops"][7]["thread"]["ops"][0]
                       ["operands"].__setitem__(1, {"f": "one"})),
    "string grid": _edit(lambda d: d["ops"][0]["block"].update(grid="4,1,1")),
    "short grid": _edit(lambda d: d["ops"][0]["block"].update(grid=[4, 1])),
    "bool threads": _edit(lambda d: d["ops"][0]["block"].update(threads=True)),
    "string shape": _edit(lambda d: d["inputs"][0].update(shape="(8, 256)")),
    "float dim": _edit(lambda d: d["inputs"][0].update(shape=[8.5, 256])),
    "input not a tensor": _edit(lambda d: d["inputs"].__setitem__(0, 7)),
    "op not a kernel": _edit(lambda d: d["ops"].__setitem__(0, d["inputs"][0])),
    "block node not a node": _edit(lambda d: d["ops"][0]["block"]["ops"].__setitem__(0, "x")),
    "thread not a thread graph": _edit(lambda d: d["ops"][0]["block"]["ops"][3]
                                       .update(thread=[])),
    "outputs not names": _edit(lambda d: d.update(outputs=[1])),
    "inputs an object": _edit(lambda d: d.update(inputs={"a": 1})),
    "node tag a list": _edit(lambda d: d["ops"][0].update(node=["GraphKernel"])),
}


@pytest.mark.parametrize("what", sorted(BAD))
def test_malformed_json_is_a_serialization_error(what):
    with pytest.raises(SerializationError) as e:
        loads(BAD[what])
    assert isinstance(e.value, MirageError) and isinstance(e.value, ValueError)


def test_from_json_rejects_non_documents():
    for doc in (None, [], "text", 3):
        with pytest.raises(SerializationError):
            KernelGraph.from_json(doc)
    with pytest.raises(SerializationError):
        loads(None)


def test_new_nodes_roundtrip_and_old_thread_ops_keep_their_json():
    """Mask iterators, max/min accumulators, slices, reshapes and thread-op attributes round
    trip; a thread op without attributes is written as before (no "attrs" key), so graphs made
    before attributes existed keep their JSON and structural hash."""
    import codegen_cases as cc
    g = cc.causal_two_pass_attention()
    h = roundtrip(g)
    x = cc.random_inputs(g, seed=1)
    np.testing.assert_array_equal(run(g, x)["O"], run(h, x)["O"])
    roundtrip(naive_lowering(cc.new_ops_program()))
    doc = json.loads(g.dumps())
    ops = [t for k in doc["ops"] for n in k["block"]["ops"] if n["node"] == "Fused"
           for t in n["thread"]["ops"]]
    assert any("attrs" in t for t in ops) and any("attrs" not in t for t in ops)
    assert {n["node"] for k in doc["ops"] for n in k["block"]["ops"]} >= {"MaskIter", "Accum"}
    fixtures = pytest.importorskip("benchmarks.fixtures")
    assert '"attrs"' not in json.dumps([o for k in json.loads(
        fixtures.hand_built("gqa", 1).dumps())["ops"] for o in k.get("block", {}).get("ops", [])
        if o["node"] == "Fused"])
