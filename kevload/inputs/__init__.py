"""What is sent: scenarios, probes and graders, datasets, traces, conversations, workloads, the
graded set."""
