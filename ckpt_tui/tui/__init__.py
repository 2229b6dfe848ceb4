"""The Textual browser: a thin layer over :mod:`ckpt_tui.core`."""
