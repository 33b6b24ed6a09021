"""engine/lifecycle."""
