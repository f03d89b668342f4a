"""evaluate: trained encoders and the encoder they started from on the 7 STS tasks and the demo
evaluation set."""
