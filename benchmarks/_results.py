"""Writing a benchmark's results: ``<out>.json`` (the numbers) and ``<out>.md`` (the table)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterable

RESULTS = Path(__file__).resolve().parent / "results"


def write_results(out: str | Path, doc: Any, markdown: Callable[[Any], str]) -> str:
    """Write ``doc`` as ``<out>.json`` and ``markdown(doc)`` as ``<out>.md``; returns the
    markdown (the scripts print it)."""
    out = Path(out)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    md = markdown(doc)
    out.with_suffix(".md").write_text(md)
    return md


def table(columns: list[str], rows: Iterable[Iterable[Any]]) -> list[str]:
    """A markdown table's lines: the header of ``columns``, its rule, one line per row of
    cells (each written with ``str``)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines
