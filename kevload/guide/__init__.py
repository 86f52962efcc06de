"""kevload.guide."""
