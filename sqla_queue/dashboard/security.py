"""Who may use the dashboard and what its pages may do: credentials, the CSRF cookie, the
proof that a notice is the dashboard's own, and the headers that keep injected markup inert."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from sqla_queue.errors import ConfigurationError

CSRF_COOKIE = "sqla_queue_csrf"
CSRF_FIELD = "csrf_token"
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'"
)


def notice_proof(secret: str, notice: str) -> str:
    """The proof that this dashboard wrote `notice` for the browser holding `secret` (its
    CSRF cookie): a link made elsewhere cannot show text on its pages."""
    message = b"notice:" + notice.encode(errors="surrogatepass")
    digest = hmac.new(secret.encode(), message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest[:18]).decode()


def csrf_matches(sent: object, cookie: str | None) -> bool:
    """Whether a form's CSRF token is the browser's cookie (compared in constant time)."""
    if not isinstance(sent, str) or not cookie:
        return False
    return hmac.compare_digest(sent, cookie)


@dataclass(frozen=True)
class Auth:
    """HTTP Basic credentials (`user:password`), or a token (no colon): the token is
    accepted as `Authorization: Bearer TOKEN` or as the Basic password of any user."""

    user: str | None
    secret: str

    @classmethod
    def parse(cls, value: str) -> Auth:
        user, colon, password = value.partition(":")
        if not colon:
            if not value:
                raise ConfigurationError(detail="--auth is empty; pass user:password or a token")
            return cls(None, value)
        if not user or not password:
            raise ConfigurationError(detail="--auth must be user:password with neither empty")
        return cls(user, password)

    def allows(self, header: str | None) -> bool:
        if not header:
            return False
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and self.user is None:
            return hmac.compare_digest(value.strip().encode(), self.secret.encode())
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return False
        user, _, password = decoded.partition(":")
        user_ok = self.user is None or hmac.compare_digest(user.encode(), self.user.encode())
        password_ok = hmac.compare_digest(password.encode(), self.secret.encode())
        return user_ok and password_ok


def is_loopback(host: str) -> bool:
    """Whether `host` only listens on this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, auth: Auth | None) -> None:
    """Refuse to serve beyond this machine without credentials: the pages act on jobs."""
    if auth is None and not is_loopback(host):
        raise ConfigurationError(
            detail=f"refusing to serve the dashboard on {host} without --auth: anyone who "
            "reaches it could retry, cancel and delete jobs. Pass --auth user:password (or "
            "--auth TOKEN), or listen on 127.0.0.1"
        )


API_PREFIX = "/api"


def is_api(request: Request) -> bool:
    """Whether the request is the HTTP API's (under `/api/` of this app, wherever mounted)."""
    path: str = request.scope.get("path", "")
    root: str = request.scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path == API_PREFIX or path.startswith(API_PREFIX + "/")


class SecurityMiddleware(BaseHTTPMiddleware):
    """Authentication, the CSRF cookie, and headers that keep injected markup inert."""

    def __init__(self, app: Any, auth: Auth | None) -> None:
        super().__init__(app)
        self.auth = auth

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        api = is_api(request)  # its own bearer tokens: no cookie, no CSRF, no --auth
        if (
            not api
            and self.auth is not None
            and not self.auth.allows(request.headers.get("authorization"))
        ):
            return PlainTextResponse(
                "authentication required",
                status_code=401,
                headers={"WWW-Authenticate": 'Basic realm="sqla-queue", charset="UTF-8"'},
            )
        token = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(32)
        request.state.csrf = token
        response = await call_next(request)
        if not api and CSRF_COOKIE not in request.cookies:
            response.set_cookie(
                CSRF_COOKIE,
                token,
                httponly=True,
                samesite="strict",
                path=request.scope.get("root_path") or "/",
            )
        response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "same-origin"
        return response
