"""Errors raised by the merge math, as members of zenedge's typed hierarchy.

The merge math is pure (tensor in, tensor out), so the only things that can go wrong are the
inputs: a non-finite value, shapes that do not line up, an option out of range, a method name
nobody registered. Each belongs to a family in `zenedge.errors` and its code is a row of
`zenedge.errors.ERRORS`, so the CLI and server report them without knowing the merge code exists.
"""

from __future__ import annotations

from zenedge.errors import InvalidAdapter, InvalidInput


class NonFiniteValues(InvalidAdapter):
    """An input or a result holds NaN or ±inf; nothing was merged."""

    code = "non_finite_values"


class IncompatibleAdapters(InvalidAdapter):
    """Adapters whose modules cannot be combined (shapes or ranks disagree)."""

    code = "incompatible_adapters"


class InvalidMergeOption(InvalidInput):
    """A merge option out of its range (alpha, density, rank cap, weights)."""

    code = "invalid_merge_option"


class UnknownMergeMethod(InvalidInput):
    """A method name that is not in `zenedge.merge.methods.MERGE_METHODS`."""

    code = "unknown_merge_method"
