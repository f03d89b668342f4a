"""A sentence-transformers module that pools the state at the last [MASK] token.

This file is copied into every model folder exported with ``mask`` pooling (as
``pairforge_pooling.py``) and named in its ``modules.json``, so the folder loads without
pairforge installed: ``SentenceTransformer(path, trust_remote_code=True)``. It imports only
torch. The sentence is put into the prompt by the folder's tokenizer (a template post-processor),
so the input ids reaching this module hold the template's [MASK] after the sentence.
"""

from __future__ import annotations

import json
import os

import torch


class MaskPooling(torch.nn.Module):
    """``sentence_embedding`` = ``token_embeddings`` at the last ``mask_token_id`` of each row."""

    config_keys = ["mask_token_id", "embedding_dimension"]

    def __init__(self, mask_token_id: int, embedding_dimension: int) -> None:
        super().__init__()
        self.mask_token_id = int(mask_token_id)
        self.embedding_dimension = int(embedding_dimension)

    def forward(self, features: dict) -> dict:
        input_ids = features["input_ids"]  # (batch, seq)
        tokens = features["token_embeddings"]  # (batch, seq, dim)
        is_mask = input_ids == self.mask_token_id
        if not bool(is_mask.any(dim=1).all()):
            raise ValueError("MaskPooling: a row has no mask token (was the prompt truncated?)")
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        last = torch.where(is_mask, positions, -1).amax(dim=1)  # (batch,)
        rows = torch.arange(input_ids.shape[0], device=input_ids.device)
        features["sentence_embedding"] = tokens[rows, last]
        return features

    def get_sentence_embedding_dimension(self) -> int:
        return self.embedding_dimension

    def get_embedding_dimension(self) -> int:
        return self.embedding_dimension

    def get_config_dict(self) -> dict:
        return {key: getattr(self, key) for key in self.config_keys}

    def save(self, output_path: str, *args, **kwargs) -> None:
        os.makedirs(output_path, exist_ok=True)
        with open(os.path.join(output_path, "config.json"), "w") as fh:
            json.dump(self.get_config_dict(), fh, indent=2)

    @staticmethod
    def load(input_path: str) -> MaskPooling:
        with open(os.path.join(input_path, "config.json")) as fh:
            return MaskPooling(**json.load(fh))
