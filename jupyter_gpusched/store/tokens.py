"""API tokens of the lab-wide service when there is no JupyterHub to vouch for users.

``jupyter gpusched service token USER`` mints one; the service maps ``Authorization: token T``
to its user. Only a SHA-256 digest of each token is stored: tokens are 32 random bytes, so a
fast digest is as good as a slow password hash, and a copy of the database lets no one in.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select

from jupyter_gpusched.core.errors import InvalidSpecError

from .orm import ApiTokenRow
from .store import Store

#: Tokens minted here start with this, so a leaked one is recognisable in logs and scanners.
TOKEN_PREFIX = "gsk_"


@dataclass(frozen=True)
class TokenInfo:
    """A token as listed: never the token itself."""

    id: int
    username: str
    prefix: str
    note: str | None
    created_at: datetime


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def mint(store: Store, username: str, *, note: str | None = None) -> str:
    """A new token for ``username``; shown once, stored only as a digest."""
    if not username or len(username) > 200 or username != username.strip():
        raise InvalidSpecError("user", f"{username!r} is not a user name")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with store.write_session() as s:
        s.add(
            ApiTokenRow(
                username=username,
                digest=_digest(token),
                prefix=token[: len(TOKEN_PREFIX) + 4],
                note=note,
                created_at=store.clock.now(),
            )
        )
    return token


def revoke(store: Store, username: str) -> int:
    """Revoke every token of ``username``; how many there were."""
    with store.write_session() as s:
        result = s.execute(delete(ApiTokenRow).where(ApiTokenRow.username == username))
        return int(result.rowcount or 0)


def list_tokens(store: Store, username: str | None = None) -> list[TokenInfo]:
    """Tokens (of one user, or everyone's), oldest first."""
    with store.read_session() as s:
        stmt = select(ApiTokenRow).order_by(ApiTokenRow.id)
        if username is not None:
            stmt = stmt.where(ApiTokenRow.username == username)
        return [
            TokenInfo(r.id, r.username, r.prefix, r.note, r.created_at) for r in s.scalars(stmt)
        ]


def user_for(store: Store, token: str) -> str | None:
    """The user a token belongs to, or None for an unknown (or revoked) token."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    digest = _digest(token)
    with store.read_session() as s:
        row = s.scalars(select(ApiTokenRow).where(ApiTokenRow.digest == digest)).first()
        if row is None or not hmac.compare_digest(row.digest, digest):
            return None
        return row.username
