"""Per-format readers: each turns one kind of checkpoint into the inert tree, metadata only."""
