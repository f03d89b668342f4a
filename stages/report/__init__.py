"""report: DebCSE's pair diagnostics (Tables 1 and 4, Figures 1 and 4) for the mined pairs."""
