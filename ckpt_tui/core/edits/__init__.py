"""Pure edits of a tree: tree -> (tree, change), renames, sanitizing, an editing session."""
