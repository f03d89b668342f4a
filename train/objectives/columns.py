"""Names of the training-data columns that the objectives read.

They are the column names of the ``pairs`` dataset that the ``sample`` stage writes; the schema
module (``pipeline.plumbing.schemas``) owns them and this module only re-exports them under the names the
objectives use.
"""

from __future__ import annotations

from pairforge.pipeline.plumbing import schemas as S

# SimCSE: one sentence per row; the positive is the same sentence under another dropout mask.
TEXT = S.TEXT

# DebCSE: an anchor, its mined positives (augmentations, sampled by eqs. 5-6 of the paper) and
# its mined hard negatives (other corpus sentences, sampled by eqs. 3-4).
ANCHOR_TEXT = S.TEXT
POSITIVE_TEXTS = S.POSITIVE_TEXTS
NEGATIVE_TEXTS = S.NEGATIVE_TEXTS

# DenoSent: the sentence (TEXT) and its discrete-noise version (a back-translation).
POSITIVE_TEXT = S.POSITIVE_TEXT

# BSL: two augmented views of one sentence (en-de-en and en-fr-en back-translations).
VIEW1_TEXT = S.VIEW1_TEXT
VIEW2_TEXT = S.VIEW2_TEXT
