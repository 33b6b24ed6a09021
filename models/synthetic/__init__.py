"""models/synthetic."""
