"""The inert model of a checkpoint: nodes, byte sources, dtypes, key paths, descriptions."""
