"""backtranslate: sentences -> positive candidates by round-trip translation (DenoSent, DebCSE,
BSL)."""
