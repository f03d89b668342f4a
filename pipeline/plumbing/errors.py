"""Errors that the CLI turns into one clear line instead of a traceback."""

from __future__ import annotations

# Plumbing: no stage's output depends on this module, so it is no stage's code (its edits rerun
# nothing): pipeline/plumbing/stagedefs.py.
CHANGES_NO_OUTPUT = True


class PairforgeError(Exception):
    """A problem with the user's data or setup; the CLI prints it and exits 1."""


class ConfigError(PairforgeError):
    """Invalid configuration; the CLI prints it and exits 2."""


class IncompleteDatasetError(PairforgeError):
    """A dataset has no complete manifest (its stage did not finish); ``path``: its folder."""

    path: str | None = None


class DataIntegrityError(PairforgeError):
    """A shard is missing, truncated or does not match its manifest."""


class CorruptShardError(DataIntegrityError):
    """A shard's bytes differ from its manifest (size or checksum); the CLI exits 2."""

    exit_code = 2


class DatasetLockedError(PairforgeError):
    """Another process is writing the same output; the CLI exits 2."""

    exit_code = 2
