"""What a run shows: terminal tables, Markdown, HTML, Prometheus and JUnit, graded views, the
baseline."""
