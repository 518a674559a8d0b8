"""Errors of the verifier; every one is a :class:`~mirage_py.errors.MirageError`."""

from __future__ import annotations

from ..errors import MirageError, ProgramError


class VerifierError(MirageError):
    """Root of the verifier's errors."""


class InterfaceMismatchError(VerifierError, ProgramError):
    """The program and the μGraph do not have the same inputs or outputs (names or shapes)."""


class NestedExpError(VerifierError, ValueError):
    """exp applied to a value that already went through an exp (outside the Lax fragment): in
    the field, exp needs its argument mod q, and an exp result exists only mod p."""


class UnverifiableOperatorError(VerifierError, ValueError):
    """An operator with no finite-field semantics (not in the op table's ``field`` slot)."""


class VerifierMemoryError(VerifierError, MemoryError):
    """A check whose values cannot fit the memory left (``verifier/memory.py``): raised before
    it starts, naming the program's largest tensor, its shape and why it was not shrunk."""


class VerifierArgumentError(VerifierError, ValueError):
    """A bad argument to the verifier (e.g. a number of tests below 1)."""


class FieldValueError(VerifierError, TypeError):
    """A value that is not a field value was given where the field backend needs one."""


__all__ = ["VerifierError", "VerifierMemoryError", "InterfaceMismatchError", "NestedExpError",
           "UnverifiableOperatorError", "VerifierArgumentError", "FieldValueError"]
