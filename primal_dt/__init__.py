"""primal-dt: a Decision Transformer with masked (causal) Primal-Attention for offline RL."""

__version__ = "0.1.0"
