"""The stages over measurements: the chain, sweeps, results logs, merge, fit and report."""
