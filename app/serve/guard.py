"""Who may use the local API, checked before any route runs, as pure ASGI: a BaseHTTPMiddleware
(`@app.middleware("http")`) would hide a client's disconnect from the answer it left.

A web page the user visits can send requests to 127.0.0.1, and with DNS rebinding read the
answers too. So, as Ollama's origin allowlist and vLLM's JSON-only bodies do:
- a `Host` must name this server: a loopback name, or the address served (a rebound name is refused);
- a request with an `Origin` (a browser's) is refused unless the user allowed that origin, and
  only allowed origins get CORS headers (a preflight from one is answered);
- the API key, when one is set, is required on every route but /health.
The JSON-only rule lives with the body's reading (server._json_body): 415 for any other type.
"""
from __future__ import annotations

import hmac
import ipaddress
import json
from dataclasses import dataclass, field

from starlette.datastructures import Headers

CORS_METHODS = "GET, POST, OPTIONS"
CORS_HEADERS = "Authorization, Content-Type"


@dataclass
class Access:
    """api_key: what clients must send (None: no key); allowed_origins: the web origins
    (scheme://host[:port]) whose pages may call the API, "*" for any; served_host: the address
    the server listens on (a wildcard address accepts any Host: the key guards it then)."""

    api_key: str | None = None
    allowed_origins: frozenset[str] = field(default_factory=frozenset)
    served_host: str = "127.0.0.1"

    def host_allowed(self, host_header: str) -> bool:
        name = _host_name(host_header)
        if is_loopback(name) or name == self.served_host.strip("[]").lower():
            return True
        return self.served_host in ("0.0.0.0", "::", "")

    def origin_allowed(self, origin: str) -> bool:
        return "*" in self.allowed_origins or origin.rstrip("/").lower() in self.allowed_origins


def is_loopback(host: str) -> bool:
    """localhost, a name under .localhost (RFC 6761), or a loopback address."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_origins(text: str) -> frozenset[str]:
    """Origins as the user writes them (commas or spaces between them), in the form browsers send."""
    return frozenset(part.strip().rstrip("/").lower() for part in text.replace(",", " ").split() if part.strip())


def _host_name(host_header: str) -> str:
    host = host_header.strip().lower()
    if host.startswith("["):  # [::1]:8765
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class Guard:
    """The ASGI app `app` behind these checks; `access` is read at each request (the window's
    settings may change while it serves)."""

    def __init__(self, app, access) -> None:
        self.app, self.access = app, access

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        access: Access = self.access() if callable(self.access) else self.access
        headers = Headers(scope=scope)
        host = headers.get("host")
        if host is not None and not access.host_allowed(host):
            await _refuse(send, 403, f"the Host '{host}' does not name this server: only a loopback name or the "
                          "address served is answered (a web page's rebound name is refused)", "forbidden_host")
            return
        origin = headers.get("origin")
        cors: list[tuple[bytes, bytes]] = []
        if origin is not None:
            if not access.origin_allowed(origin):
                await _refuse(send, 403, f"requests from web pages are refused, and '{origin}' is not an allowed "
                              "origin (python -m app serve --allow-origin, or the window's server settings)",
                              "forbidden_origin")
                return
            cors = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]
            if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
                await _send(send, 204, b"", cors + [(b"access-control-allow-methods", CORS_METHODS.encode()),
                                                    (b"access-control-allow-headers", CORS_HEADERS.encode()),
                                                    (b"access-control-max-age", b"600")])
                return
        if access.api_key is not None and scope["path"] != "/health":
            given = headers.get("authorization", "").removeprefix("Bearer ").strip()
            if not hmac.compare_digest(given.encode(), access.api_key.encode()):
                await _refuse(send, 401, "a missing or wrong API key: send it as 'Authorization: Bearer KEY'",
                              "invalid_api_key", kind="authentication_error", extra=cors)
                return

        async def send_with_cors(message) -> None:
            if cors and message["type"] == "http.response.start":
                message = {**message, "headers": list(message.get("headers", [])) + cors}
            await send(message)

        await self.app(scope, receive, send_with_cors)


async def _refuse(send, status: int, message: str, code: str, kind: str = "invalid_request_error",
                  extra: list[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()
    await _send(send, status, body, [(b"content-type", b"application/json")] + list(extra))


async def _send(send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": headers + [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
