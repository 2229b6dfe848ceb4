"""One module per user verb: info, check, compare, diff, stats, convert, average."""
