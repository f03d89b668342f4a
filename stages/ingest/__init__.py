"""ingest: raw corpus files -> clean, deduplicated, id'd sentence shards (+ a quarantine)."""
