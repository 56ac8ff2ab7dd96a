"""What sparkctl remembers: the SQLite store of deployments, phases and resolved digests."""
