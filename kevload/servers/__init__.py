"""Servers kevload starts: processes, the built-in real targets, sweeps of settings (local or Ray
tasks)."""
