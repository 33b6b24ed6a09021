"""models/checkpoint."""
