"""export: a ``pairs`` dataset -> the column layouts sentence-transformers trains on (``pairforge
export``)."""
