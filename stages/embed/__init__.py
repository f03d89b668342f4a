"""embed: sentence and augmentation-candidate embeddings, L2-normalised, in Parquet shards."""
