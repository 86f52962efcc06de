"""kevload.compare."""
