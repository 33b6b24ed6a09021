"""models/kernels."""
