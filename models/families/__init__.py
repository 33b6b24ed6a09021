"""One file per model family: its config reading, where its checkpoints store each weight, and its model
composed from the shared layers (models/family.py says what a family is; models/registry.py lists them)."""
