"""kevload.inputs."""
