"""Bytes to numbers: tensor values, stats, NaN/Inf scans, digests."""
