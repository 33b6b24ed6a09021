"""models/layers."""
