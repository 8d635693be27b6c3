"""The kit: its script generated from the package, its notebook, its archive and verification."""
