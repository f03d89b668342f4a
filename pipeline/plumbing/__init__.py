"""The plumbing every stage runs on: config and params, the stage declaration and fingerprint,
shard datasets (writer, manifests, locks, verification), the shard runner, metrics, progress and
errors. It imports nothing from ``pipeline/science/``, ``stages/`` or ``train/``
(tests/pipeline/test_layers.py)."""

# Package docstring only: no stage output depends on it.
CHANGES_NO_OUTPUT = True
