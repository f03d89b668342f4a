"""rewrite: sentences -> LLM rewrites (DenoSent's alternative to back-translation), optional."""
