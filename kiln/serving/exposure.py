"""Whether a server about to start is reachable from other machines without a key."""

from __future__ import annotations

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def public_bind_warning(host: str, api_key: str | None) -> str | None:
    """One line to print when `host` exposes the endpoint beyond this machine with no API key."""
    if api_key or host in LOOPBACK or host.startswith("127."):
        return None
    return (
        f"kiln: warning: serving on {host} without an API key: anyone who can reach this "
        "machine can use the endpoint (set --api-key or KILN_API_KEY)"
    )
