"""sample: DebCSE inverse-propensity-weighted sampling of positives and negatives ->
``data/pairs``."""
