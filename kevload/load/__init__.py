"""kevload.load."""
