"""The URLs a scenario names (target.base_url, target.metrics_url): checked whole when it is read,
not mid-run, and quoted in messages without a password."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from kevload.inputs.fieldrules import Failer

METRICS_OFF = ("", "off")  # target.metrics_url values that read no metrics
BASE_URL_EXPECTED = "an http:// or https:// URL such as http://127.0.0.1:8000/v1"
METRICS_URL_EXPECTED = (
    '"auto", "off" (or "") or an http:// or https:// URL of Prometheus text, without user:password@'
)


def check_base_url(url: str, source: str) -> None:
    """``url`` as target.base_url takes it, or a ScenarioError naming ``source`` (an option such as
    ``--url``) and the key: for a command that gives a server's URL outside a scenario, refused as a
    scenario's would be."""
    check_url(Failer(source), "target.base_url", url, BASE_URL_EXPECTED)


def url_problem(url: str) -> str | None:
    """Why ``url`` is no http(s) URL that can be sent to as written, in a few words; None when it is
    one. Checked whole at load, so a bad one is bad input there: a port out of range or an open IPv6
    bracket would raise in the client mid-run, and a blank (a copy-pasted trailing space) would go
    raw into the request line."""
    if any(ord(ch) <= 0x20 or ord(ch) >= 0x7F for ch in url):
        return (
            "no spaces, control or non-ASCII characters: percent-encode them, a host as punycode "
            "(xn--…)"
        )
    try:
        parsed = urlsplit(url)
        port = parsed.port
    except ValueError as exc:
        if "IPv6" in str(exc):
            return "an IPv6 host in closed brackets, e.g. http://[::1]:8000/v1"
        if "Port" in str(exc):
            return "a port from 1 to 65535"
        return str(exc)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return "a host after http:// or https://"
    if port == 0:
        return "a port from 1 to 65535"
    return None


def check_url(fail: Failer, key: str, url: str, expected: str) -> None:
    problem = url_problem(url)
    if problem is not None:
        fail(key, f"{expected} ({problem})", shown_url(url))


def shown_url(url: str) -> str:
    """``url`` as a message quotes it, any ``user:password@`` shown as ``***@``: a password never
    goes into a message. Read without urlsplit, which raises on the very URLs shown here."""
    rest = url.partition("://")[2]
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    userinfo, at, _ = authority.rpartition("@")
    return url.replace(userinfo + at, "***@", 1) if at else url


def check_metrics_url(fail: Failer, url: str) -> None:
    if url == "auto" or url in METRICS_OFF:
        return
    check_url(fail, "target.metrics_url", url, METRICS_URL_EXPECTED)
    if "@" in urlsplit(url).netloc:
        # The metrics are read without credentials; one written here would land in run.json.
        fail("target.metrics_url", METRICS_URL_EXPECTED, shown_url(url))
