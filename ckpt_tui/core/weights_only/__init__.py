"""``torch.load(weights_only=True)`` emulated: the verdict, the scan and torch's tables."""
