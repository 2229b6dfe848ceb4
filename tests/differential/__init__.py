"""Differential testing against the real torch: generated files judged by ckpt-tui and by torch.load."""
