"""Errors raised by hessviz.

Every error is a :class:`ValueError` subclass, so ``except ValueError`` catches them,
and every message names the offending field and what is allowed.
"""

from __future__ import annotations


class HessvizError(ValueError):
    """Base class: bad input that hessviz refuses rather than computing a wrong number."""


class ConfigError(HessvizError):
    """A :class:`~hessviz.BlockConfig` field is out of range."""


class InputError(HessvizError):
    """Parameters, inputs or targets have the wrong names, shapes, dtypes or values."""


class CheckpointError(HessvizError):
    """A model checkpoint folder is missing, unreadable, of an unsupported architecture, or
    holds its weights in a format hessviz refuses to read (pickle)."""


class ModelRangeError(CheckpointError, ConfigError, InputError):
    """A layer index, a ``seq_len`` or a text beyond what a checkpoint has (a layer it does not
    have, more tokens than its positions). A :class:`CheckpointError`, and also the
    :class:`ConfigError` / :class:`InputError` these were before."""


class SizeError(HessvizError):
    """A dense result would not fit in the memory hessviz is allowed to use."""

    def __init__(self, message: str, *, needed_bytes: int, limit_bytes: int):
        super().__init__(message)
        self.needed_bytes = needed_bytes
        self.limit_bytes = limit_bytes
