"""kevload.outputs."""
