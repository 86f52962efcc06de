"""Comparing: records folded into cells, each against its serial reference, into a verdict and a
summary."""
