"""Pure decisions: which images may run, what fits in memory, how to switch."""
