"""Process plumbing and terminal-safe text: forked children, process limits, escaping, quoting."""
