"""Who may call the HTTP API and what a repeated call does: bearer tokens with a scope
(`read` or `admin`), and the idempotency keys of actions.

Tokens come from the dashboard's `api_tokens` option or, failing that, the environment
(`SQLA_QUEUE_API_TOKENS="token:admin,other:read"`). A token travels in the
`Authorization: Bearer TOKEN` header, which a browser never adds by itself to a request
another site makes: the API needs no CSRF token, and never reads the dashboard's cookies.

Idempotency keys are kept in the database (`IdempotencyKeys`, table
`sqla_queue.api_idempotency`): a retried request gets the first answer and acts once,
whichever dashboard process of a fleet behind a load balancer it reaches.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import Engine

from sqla_queue.db.queries import idempotency as statements
from sqla_queue.errors import ConfigurationError

TOKENS_ENV = "SQLA_QUEUE_API_TOKENS"
SCOPES = ("read", "admin")
"""`read`: every GET; `admin`: the actions as well."""
MAX_KEY = 255
"""The longest idempotency key taken."""


def parse_tokens(value: str | Mapping[str, str]) -> dict[str, str]:
    """{token: scope} from "token:admin,other:read" (or a mapping); ConfigurationError
    naming the bad entry and the fix."""
    pairs = (
        list(value.items())
        if isinstance(value, Mapping)
        else [entry.strip().rpartition(":")[::2] for entry in value.split(",") if entry.strip()]
    )
    found: dict[str, str] = {}
    for token, scope in pairs:
        if not token or any(c.isspace() for c in token) or scope not in SCOPES:
            shown = f"{token[:4]}…" if token else "(empty)"
            raise ConfigurationError(
                detail=f"API token {shown}:{scope} is not TOKEN:SCOPE with a token without "
                f"spaces and a scope of {' or '.join(SCOPES)}: write e.g. "
                f'{TOKENS_ENV}="s3cret:admin,reader:read"'
            )
        found[token] = scope
    return found


def tokens_from(option: str | Mapping[str, str] | None) -> dict[str, str]:
    """The API's tokens: the option if given, else `SQLA_QUEUE_API_TOKENS`, else none (then
    every API request is refused with 401 and the way to configure one)."""
    if option is None:
        option = os.environ.get(TOKENS_ENV, "")
    return parse_tokens(option)


@dataclass(frozen=True)
class Caller:
    """Who called: the scope of the token, and its digest (idempotency keys are per token)."""

    scope: str
    digest: str

    @property
    def admin(self) -> bool:
        return self.scope == "admin"


def caller_of(tokens: Mapping[str, str], header: str | None) -> Caller | None:
    """The caller a `Bearer` header names, or None (no header, another scheme, no such
    token). Every token is compared, in constant time each."""
    if not header:
        return None
    scheme, _, sent = header.partition(" ")
    sent = sent.strip()
    if scheme.lower() != "bearer" or not sent:
        return None
    found: str | None = None
    for token, scope in tokens.items():
        if hmac.compare_digest(sent.encode(), token.encode()):
            found = scope
    if found is None:
        return None
    return Caller(found, hashlib.sha256(sent.encode()).hexdigest()[:16])


@dataclass(frozen=True)
class Answer:
    """A response kept for an idempotency key: what the first request got."""

    status: int
    body: bytes
    request: str
    """The digest of the request it answered (method, path, body)."""


class KeyInUse(Exception):
    """A request with this key is being answered now."""


class IdempotencyKeys:
    """Answers kept per (caller, key) for `ttl` seconds in `sqla_queue.api_idempotency`,
    shared by every process on the database. A key is reserved while its first request is
    answered, for at most `answer_within` seconds (a process that died answering it does
    not hold it longer); expired keys are deleted a batch at a time as keys are taken."""

    def __init__(self, engine: Engine, ttl: float = 86400.0, answer_within: float = 300.0) -> None:
        self.engine = engine
        self.ttl = ttl
        self.answer_within = answer_within

    def claim(self, caller: Caller, key: str, request: str) -> Answer | None:
        """The kept answer for `key`, or None after reserving it for `request` (which must
        then `keep` or `release` it); KeyInUse while another request holds it."""
        which = {"caller": caller.digest, "key": key}
        for _ in range(3):  # a row expired or released between the two reads: take it again
            with self.engine.begin() as conn:
                conn.execute(statements.DELETE_EXPIRED, {**which, "batch": statements.EXPIRE_BATCH})
                reserve = {**which, "request": request, "seconds": self.answer_within}
                if conn.execute(statements.RESERVE, reserve).first() is not None:
                    return None
                kept = conn.execute(statements.KEPT, which).first()
            if kept is not None:
                status, body, digest = kept
                if status is None:
                    raise KeyInUse
                return Answer(int(status), bytes(body or b""), str(digest))
        raise KeyInUse

    def keep(self, caller: Caller, key: str, answer: Answer) -> None:
        params = {
            "caller": caller.digest,
            "key": key,
            "status": answer.status,
            "body": answer.body,
            "request": answer.request,
            "seconds": self.ttl,
        }
        with self.engine.begin() as conn:
            conn.execute(statements.KEEP, params)

    def release(self, caller: Caller, key: str) -> None:
        """Forget a reservation whose request raised: a retry may act."""
        with self.engine.begin() as conn:
            conn.execute(statements.RELEASE, {"caller": caller.digest, "key": key})


def request_digest(method: str, path: str, body: bytes) -> str:
    return hashlib.sha256(b"\0".join((method.encode(), path.encode(), body))).hexdigest()


def check_key(key: str) -> str | None:
    """Why `key` is not a usable idempotency key, or None."""
    if not key or len(key) > MAX_KEY or not key.isprintable():
        return f"Idempotency-Key must be 1 to {MAX_KEY} printable characters (e.g. a UUID)"
    return None
