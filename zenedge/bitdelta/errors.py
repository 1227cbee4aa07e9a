"""Errors of the bitdelta package: one-line messages, typed like the rest of zenedge (their codes
are rows of zenedge.errors.ERRORS) so the CLI prints `error: …` with exit 2 and the daemon answers 400.

They stay ValueErrors as well, for callers that treat any bad value alike.
"""

from zenedge.errors import InvalidAdapter, InvalidInput


class BitDeltaError(InvalidInput, ValueError):
    """Base of every bitdelta error."""

    code = "invalid_bitdelta"


class BitDeltaFormatError(BitDeltaError, InvalidAdapter):
    """A .bitdelta safetensors file is malformed (missing metadata, bad JSON, wrong format name)."""

    code = "invalid_bitdelta_file"


class UnknownFormatVersion(BitDeltaFormatError):
    """The file was written by a format version this code does not know."""


class InconsistentShapes(BitDeltaFormatError):
    """Packed signs, alphas and recorded in_features disagree."""


class BadDtype(BitDeltaFormatError):
    """A tensor has the wrong dtype (packed must be uint8, alpha float32)."""


class NonFiniteAlpha(BitDeltaFormatError):
    """An alpha is NaN or infinite."""


class MissingTensor(BitDeltaFormatError):
    """A tensor named in the metadata is absent from the file."""


class CheckpointMismatch(BitDeltaError):
    """Base and fine-tuned checkpoints cannot be paired (missing tensors, different shapes)."""

    code = "checkpoint_mismatch"
