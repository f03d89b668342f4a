"""Names of the training-data columns that the objectives read.

Provisional: the schema module of the pipeline may rename them; every objective and the registry
refer to these constants only, so a rename happens here and nowhere else.
"""

from __future__ import annotations

# SimCSE: one sentence per row; the positive is the same sentence under another dropout mask.
TEXT = "text"

# DebCSE: an anchor, its mined positives (augmentations, sampled by eqs. 5-6 of the paper) and
# its mined hard negatives (other corpus sentences, sampled by eqs. 3-4).
ANCHOR_TEXT = "anchor_text"
POSITIVE_TEXTS = "positive_texts"
NEGATIVE_TEXTS = "negative_texts"

# DenoSent: the sentence (TEXT) and its discrete-noise version (a back-translation).
POSITIVE_TEXT = "positive_text"

# BSL: two augmented views of one sentence (en-de-en and en-fr-en back-translations).
VIEW1_TEXT = "view1_text"
VIEW2_TEXT = "view2_text"
