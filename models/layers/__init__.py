"""The decoder's building blocks: RMSNorm (norm.py), the SwiGLU MLP (mlp.py), RoPE (rope.py), the reference
attention for tests (reference_attention.py); and which fused kernel runs each norm, projection and
activation on the fused path (norm.py, linear.py, activation.py, rope.py)."""
