"""UI-free core: reading, the tree model, stats, edits and writing. Never imports Textual."""
