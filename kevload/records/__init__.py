"""What a run leaves on disk: a typed record per request, the run directory, the server's
metrics."""
