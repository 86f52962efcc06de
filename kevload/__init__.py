"""kevload: load-test OpenAI-compatible LLM servers and find out whether the same input gives the same output."""

__version__ = "0.1.0"
