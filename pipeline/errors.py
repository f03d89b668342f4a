"""Errors that the CLI turns into one clear line instead of a traceback."""

from __future__ import annotations


class PairforgeError(Exception):
    """A problem with the user's data or setup; the CLI prints it and exits 1."""


class ConfigError(PairforgeError):
    """Invalid configuration; the CLI prints it and exits 2."""


class IncompleteDatasetError(PairforgeError):
    """A dataset has no complete manifest (its stage did not finish)."""


class DataIntegrityError(PairforgeError):
    """A shard is missing, truncated or does not match its manifest."""
