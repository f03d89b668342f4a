"""The science more than one stage shares: the model layer (``models/``: specs, loading, pooling,
encoding, MLM heads, translation model files), text normalisation, corpus readers, negative
pools, the mining inputs, candidate quality, dataset cards and STS scoring. It builds on
``pipeline/plumbing/`` and imports nothing from ``stages/`` or ``train/``."""

# Package docstring only: no stage output depends on it.
CHANGES_NO_OUTPUT = True
