"""The wire: HTTP/1.1 and aiohttp transports, Server-Sent Events, one OpenAI exchange into an
``Outcome``."""
