"""kevload.wire."""
