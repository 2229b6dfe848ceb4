"""The unpickler that never runs anything, and the global names it knows."""
