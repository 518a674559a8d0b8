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
