"""engine/step."""
