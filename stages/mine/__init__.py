"""mine: each sentence's DebCSE negative candidate pool, from a FAISS index over its embeddings."""
