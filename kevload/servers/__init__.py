"""kevload.servers."""
