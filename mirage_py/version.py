"""Which code this is: the release number and a fingerprint of the package's source.

A leaf module (the standard library only), so every stage -- the results database, the Ray
tasks, ``mirage_py/__init__.py`` -- can ask without importing the package above it.

The release number names what a user installed; the fingerprint names the code that runs. The
results database keys answers by the fingerprint (``superopt.store.AnswerKey``), so an edit to
the generator, the cost model or the code generator is never answered from the database by the
code before it, with or without a release bump.
"""

from __future__ import annotations

import hashlib
import os
from functools import cache

__version__ = "0.6.0"

#: the files whose text is the package's code (Python modules and the CUDA headers it ships)
SOURCE_SUFFIXES = (".py", ".h", ".cuh")


def source_files(root: str | None = None) -> list[str]:
    """The package's source files under ``root`` (default: this package), as paths relative to
    it with ``/`` separators, sorted."""
    root = root or os.path.dirname(os.path.abspath(__file__))
    found = []
    for where, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__" and not d.startswith(".")]
        rel = os.path.relpath(where, root)
        for f in files:
            if f.endswith(SOURCE_SUFFIXES):
                found.append(f if rel == "." else f"{rel}/{f}".replace(os.sep, "/"))
    return sorted(found)


@cache
def source_fingerprint() -> str:
    """SHA-256 over every source file of this package (its path and its bytes), computed once
    per process (a few ms): equal for two copies of the same code wherever they are
    installed, different after any edit."""
    root = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for rel in source_files(root):
        with open(os.path.join(root, rel), "rb") as f:
            data = f.read()
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


__all__ = ["__version__", "source_fingerprint", "source_files", "SOURCE_SUFFIXES"]
