"""kevload.records."""
