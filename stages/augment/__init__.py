"""The parts of the augment stages (``backtranslate``, ``rewrite``, and the demo's ``standin``).

- ``engines``: one ``Translator`` interface, a transformers (MarianMTModel) and a CTranslate2
  engine, model identity (hub revision or content hash) and the on-disk CTranslate2 conversions;
- ``decoding``: decoding settings (greedy, beam, sampling) and their canonical labels;
- ``batching``: length-sorted batches under a token budget;
- ``cache``: a persistent key-value cache (SQLite) for translations and LLM responses;
- ``noise``: DebCSE's discrete noise (insert frequent words, mask words), seeded per sentence;
- ``quality``: the cheap quality signals of a candidate (identical, length ratio, edit ratio);
- ``translate``: the pure per-shard function of ``backtranslate``;
- ``llm``: the OpenAI-compatible client, rate limiting, retries and output validation of ``rewrite``;
- ``standin``: the tiny locally built Marian models the offline demo translates with.
"""
