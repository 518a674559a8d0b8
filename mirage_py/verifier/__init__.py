"""Verifier: random testing over finite fields, with a false-acceptance bound, plus a
floating-point check of a μGraph against the float64 reference.

* :func:`verify` -- exact equivalence check of a μGraph against a program (docs/verifier.md).
* :func:`check_numerics` -- the GPU-like float interpreter against the float64 reference.
* :mod:`.field` -- finite-field semantics of every operator (registered in the op table's
  ``field`` slot) and the field backend of the interpreter.
* :mod:`.degree` -- degree bounds for the Schwartz--Zippel bound.
* :mod:`.mutate` -- structural mutants of a μGraph, for testing the verifier.
"""

from .errors import (FieldValueError, InterfaceMismatchError, NestedExpError,
                     UnverifiableOperatorError, VerifierArgumentError, VerifierError)
from .field import SAFE_PRIMES, FieldBackend, FieldParams, FieldValue
from .numerics import (PROBES, NumericEvent, NumericsReport, NumericsVerdict, Probe,
                       check_numerics, numerics_verdict)
from .equivalence import Mismatch, Verifier, VerifyResult, check_interface, verify

__all__ = ["verify", "Verifier", "VerifyResult", "Mismatch", "check_interface", "check_numerics",
           "numerics_verdict", "NumericsVerdict", "Probe", "PROBES",
           "NumericsReport", "NumericEvent", "FieldBackend", "FieldParams", "FieldValue",
           "SAFE_PRIMES", "VerifierError", "InterfaceMismatchError", "NestedExpError",
           "UnverifiableOperatorError", "VerifierArgumentError", "FieldValueError"]
