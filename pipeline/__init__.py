"""What the stages share, on two floors: ``plumbing/`` (config, declarations, shards, runner) and
``science/`` above it (models, text, pools, STS). Neither imports ``stages/`` or ``train/``."""
