"""train: the pairs dataset -> one trained sentence encoder per objective (``models/<objective>``)."""
