"""The Python examples in README.md run as written."""

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python_blocks(path):
    with open(path) as f:
        text = f.read()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.mark.parametrize("doc", ["README.md"])
def test_python_examples_run(doc, tmp_path, monkeypatch, capsys):
    blocks = _python_blocks(os.path.join(ROOT, doc))
    assert blocks, f"{doc} has no python example"
    monkeypatch.chdir(tmp_path)  # examples may write files
    for code in blocks:
        exec(compile(code, doc, "exec"), {"__name__": "__doc_example__"})


DOCS = ["README.md"] + sorted(f"docs/{f}" for f in os.listdir(os.path.join(ROOT, "docs"))
                              if f.endswith(".md"))


@pytest.mark.parametrize("doc", DOCS)
def test_the_code_a_document_names_exists(doc):
    """Every ``mirage_py/...`` path a document names is there (``mirage_py/superopt.py`` stayed
    in the docs long after it became a package), and every ``module.function`` it names in
    the layout and superopt packages exists."""
    import importlib
    with open(os.path.join(ROOT, doc)) as f:
        text = f.read()
    missing = [p for p in re.findall(r"`(mirage_py/[\w./-]*)`", text)
               if not os.path.exists(os.path.join(ROOT, p.rstrip("/")))]
    assert not missing, missing
    for mod, name in re.findall(r"`(schedule|part|search|store|structure|bound|local|cluster|"
                                r"jobs|option)\.(\w+)`", text):
        if name == "py":
            continue  # a file name
        package = "layout" if mod == "schedule" else "superopt"
        module = importlib.import_module(f"mirage_py.{package}.{mod}")
        assert hasattr(module, name), f"{doc}: `{mod}.{name}`"
