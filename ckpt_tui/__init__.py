"""ckpt-tui: open, check and fix PyTorch checkpoints without loading them."""

__version__ = "0.1.0"
