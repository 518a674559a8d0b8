"""Graphviz DOT text for μGraphs: well-formed, escaped, complete; rendering through ``dot``."""

import os
import re
import shutil
import subprocess
from dataclasses import replace

import pytest

from benchmarks.programs import NAMES, get_program
from mirage_py.errors import MirageError, ToolError, ToolNotFoundError
from mirage_py.ugraph import DTensor, KernelGraph, KernelOp, naive_lowering
from mirage_py.ugraph import dot as dotmod
from ugraph_cases import CASES

HAVE_DOT = shutil.which("dot") is not None


def _tokens(text: str) -> list[tuple[str, str]]:
    """Split DOT text into ("str", unescaped value) and ("sym", text) tokens."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == '"':
            j, buf = i + 1, []
            while text[j] != '"':
                if text[j] == "\\":
                    nxt = text[j + 1]
                    buf.append({"n": "\n", '"': '"', "\\": "\\"}.get(nxt, "\\" + nxt))
                    j += 2
                else:
                    buf.append(text[j])
                    j += 1
            out.append(("str", "".join(buf)))
            i = j + 1
        elif c.isspace():
            i += 1
        else:
            m = re.match(r"->|[A-Za-z_][A-Za-z0-9_]*|[-0-9.]+|.", text[i:], re.S)
            out.append(("sym", m.group(0)))
            i += len(m.group(0))
    return out


def parse(text: str) -> dict:
    """A small structural DOT parser: checks braces and brackets balance outside strings, and
    returns node ids (declared with an attribute list), edges and every label."""
    toks = _tokens(text)
    depth = brackets = 0
    nodes: list[str] = []
    edges: list[tuple[str, str]] = []
    labels: list[str] = []
    for k, (kind, v) in enumerate(toks):
        if kind != "sym":
            continue
        if v == "{":
            depth += 1
        elif v == "}":
            depth -= 1
            assert depth >= 0, "unbalanced '}'"
        elif v == "[":
            brackets += 1
            prev = toks[k - 1]
            if prev[0] == "sym" and prev[1] not in ("graph", "node", "edge") and \
                    toks[k - 2][1] != "->":
                nodes.append(prev[1])
        elif v == "]":
            brackets -= 1
            assert brackets >= 0, "unbalanced ']'"
        elif v == "->":
            edges.append((toks[k - 1][1], toks[k + 1][1]))
        elif v == "label" and toks[k + 1][1] == "=":
            labels.append(toks[k + 2][1])
    assert depth == 0 and brackets == 0, "unbalanced braces or brackets"
    assert toks[0] == ("sym", "digraph") and toks[-1] == ("sym", "}")
    return {"nodes": nodes, "edges": edges, "labels": labels}


def check_wellformed(text: str) -> dict:
    d = parse(text)
    assert len(d["nodes"]) == len(set(d["nodes"])), "a node is declared twice"
    declared = set(d["nodes"])
    for a, b in d["edges"]:
        assert a in declared and b in declared, f"edge {a} -> {b} has an undeclared endpoint"
    return d


def dot_accepts(text: str) -> None:
    proc = subprocess.run(["dot", "-Tcanon"], input=text.encode(), capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    assert not proc.stderr.strip(), proc.stderr.decode()  # no warnings either


@pytest.mark.parametrize("name", sorted(CASES))
def test_hand_written_graphs_draw_every_part(name):
    g, _ = CASES[name]()
    text = g.to_dot()
    d = check_wellformed(text)
    labels = "\n".join(d["labels"])
    for t in g.tensors().values():
        assert f"{t.name}\n{dotmod._shape(t.shape)} {t.dtype}" in d["labels"]
    for k, op in enumerate(g.ops):
        if isinstance(op, KernelOp):
            assert op.op in labels
            continue
        bg = op.block
        assert f"subgraph cluster_k{k} {{" in text
        assert f"grid {bg.grid}  threads {bg.threads}  forloop {bg.forloop}" in labels
        assert "shared memory" in labels
        for n in bg.ops:
            kind = type(n).__name__
            if kind == "InputIter":
                assert f"{n.out} = iter {op.inputs[n.input]}" in labels
            elif kind == "OutputSaver":
                assert f"save {n.input} -> {op.outputs[n.output].name}" in labels
            elif kind == "Fused":
                assert n.thread.describe() in labels.replace("\n", "")
            elif kind == "Accum":
                assert f"{n.out} = accum.sum({n.input})" in labels
            else:
                assert f"{n.out} = {n.op}(" in labels
        if bg.forloop > 1:
            assert f"for i in range({bg.forloop})" in labels
    if HAVE_DOT:
        dot_accepts(text)


def test_edges_connect_tensors_iterators_and_savers():
    g, _ = CASES["split_k"]()
    d = check_wellformed(g.to_dot())
    label_of = {}
    text = g.to_dot()
    for m in re.finditer(r"^\s*(\w+) \[label=\"([^\"]*)\"", text, re.M):
        label_of[m.group(1)] = m.group(2).split("\\n")[0]
    named = {(label_of[a], label_of[b]) for a, b in d["edges"]}
    assert ("A", "a = iter A") in named and ("B", "b = iter B") in named
    assert ("save acc -> P", "P") in named and ("P", "p = iter P") in named
    assert ("save s -> S", "S") in named
    assert ("S", "div(S, 3.0)") in named and ("div(S, 3.0)", "C") in named
    assert ("a = iter A", "p = matmul(a, b)") in named
    assert ("p = matmul(a, b)", "acc = accum.sum(p)") in named


def test_labels_are_escaped():
    nasty = 'say "hi" \\l back\\slash\nnew line {brace} [x] -> y'
    g = KernelGraph(nasty, (DTensor('in"put\\', (4, 4)),),
                    (KernelOp("exp", ('in"put\\',), DTensor("o}ut", (4, 4))),), ("o}ut",))
    text = dotmod.to_dot(g)
    d = check_wellformed(text)
    assert "kernel graph " + nasty in d["labels"]
    assert 'in"put\\\n(4, 4) float16' in d["labels"]
    assert "exp(in\"put\\)" in d["labels"]
    assert "\n" not in dotmod.quote("a\nb\r\nc")
    if HAVE_DOT:
        dot_accepts(text)


@pytest.mark.parametrize("name", NAMES)
def test_benchmark_graphs_are_wellformed(name):
    text = naive_lowering(get_program(name, 1)).to_dot()
    check_wellformed(text)
    try:
        from benchmarks.fixtures import hand_built
    except ImportError:
        return
    check_wellformed(hand_built(name, 1).to_dot())


def test_invalid_graph_still_draws():
    g, _ = CASES["tiled_matmul"]()
    gk = g.ops[0]
    bad = replace(g, ops=(replace(gk, inputs=("A", "nowhere"),
                                  block=replace(gk.block, grid=(3, 3, 1))),),
                  outputs=("C", "ghost"))
    text = bad.to_dot()
    d = check_wellformed(text)
    labels = "\n".join(d["labels"])
    assert "invalid:" in labels
    assert "nowhere\nundefined" in labels and "ghost\nundefined" in labels
    if HAVE_DOT:
        dot_accepts(text)


def test_render_dot_text_always_works(tmp_path, monkeypatch):
    g, _ = CASES["rms_matmul"]()
    monkeypatch.setattr(shutil, "which", lambda name: None)  # as if Graphviz were missing
    for suffix in ("dot", "gv"):
        path = dotmod.render(g, tmp_path / f"g.{suffix}")
        with open(path, encoding="utf-8") as f:
            assert f.read() == g.to_dot()
    path = dotmod.render(g, tmp_path / "g.txt", format="dot")
    assert os.path.exists(path)


def test_render_without_graphviz_raises_typed_error(tmp_path, monkeypatch):
    g, _ = CASES["rms_matmul"]()
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(ToolNotFoundError, match="Graphviz") as e:
        dotmod.render(g, tmp_path / "g.svg")
    assert "install" in str(e.value) and isinstance(e.value, MirageError)
    assert not (tmp_path / "g.svg").exists()


def test_render_rejects_unknown_format(tmp_path):
    g, _ = CASES["rms_matmul"]()
    with pytest.raises(ToolError, match="format"):
        dotmod.render(g, tmp_path / "g.bmpx")
    with pytest.raises(ToolError, match="no suffix"):
        dotmod.render(g, tmp_path / "g")


@pytest.mark.skipif(not HAVE_DOT, reason="Graphviz 'dot' is not installed")
@pytest.mark.parametrize("fmt", ["svg", "png"])
def test_render_with_graphviz(tmp_path, fmt):
    g, _ = CASES["split_k"]()
    path = dotmod.render(g, tmp_path / f"g.{fmt}")
    data = open(path, "rb").read()
    if fmt == "svg":
        assert b"<svg" in data and b"graph kernel #1" in data
    else:
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
    # format overrides the suffix
    other = dotmod.render(g, tmp_path / "pic.out", format="svg")
    assert b"<svg" in open(other, "rb").read()
