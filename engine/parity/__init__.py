"""engine/parity."""
