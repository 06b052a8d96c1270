"""``Idempotency-Key`` on the POSTs that create: a repeat gets the first request's answer.

A client that sent a create and saw no answer (the connection broke, the server was killed
after its commit) cannot know whether it happened. With the header (named as in the IETF
httpapi draft), it sends the same request again with the same key and gets the answer of what
the first one made -- status, ``Location`` and the made thing as it is now -- instead of a
second job. The key is written in the create's own transaction (:mod:`jupyter_gpusched.store.
idempotency`), so this holds across restarts, ``kill -9`` and a standby taking over.

Keys are the caller's own (a user's key never meets another's). The same key with another
request (route or body) is refused with 422; a repeat while the first is still being answered
gets 409 with ``Retry-After``; a malformed key 400. Handlers stay as they were, calling
:func:`create_once` with their create and their answer for a stored key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from jupyter_gpusched.core.errors import (
    BadRequestError,
    InFlightError,
    InvalidSpecError,
    KeyTakenError,
)
from jupyter_gpusched.store.idempotency import KeyClaim, KeyRecord

HEADER = "Idempotency-Key"
#: Longest key accepted (a UUID is 36 characters).
MAX_KEY_CHARS = 255
#: Header telling a client its answer is a replay of an earlier request's.
REPLAYED_HEADER = "Idempotent-Replayed"
#: Seconds a client is told to wait while the first request with its key is answered.
IN_FLIGHT_RETRY_S = 1.0
_HOW = f"send a unique string of 1 to {MAX_KEY_CHARS} printable ASCII characters, e.g. a UUID"


def parse_key(values: list[str]) -> str | None:
    """The key of the request's ``Idempotency-Key`` header(s); None without one.

    The draft makes it a structured-field string (``"..."``); a bare token is taken too.
    """
    if not values:
        return None
    if len(values) > 1:
        raise BadRequestError(f"{HEADER} was sent {len(values)} times; send it once")
    text = values[0].strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    if not text:
        raise BadRequestError(f"{HEADER} is empty; {_HOW}")
    if len(text) > MAX_KEY_CHARS:
        raise BadRequestError(f"{HEADER} is {len(text)} characters long; {_HOW}")
    if bad := next((c for c in text if not " " <= c <= "~"), None):
        raise BadRequestError(f"{HEADER} holds the character {bad!r}; {_HOW}")
    return text


def fingerprint(route: str, body: bytes) -> str:
    """What tells two requests with one key apart: the route and the exact body."""
    digest = hashlib.sha256(route.encode())
    digest.update(b"\n")
    digest.update(body)
    return digest.hexdigest()


async def create_once(
    handler: Any,
    sched: Any,
    route: str,
    create: Callable[[KeyClaim | None], Awaitable[None]],
    replay: Callable[[KeyRecord], Awaitable[None]],
) -> None:
    """Answer a create: ``create(claim)`` once per key, ``replay(stored)`` for its repeats.

    ``create`` passes ``claim`` to the transaction that makes the thing (None: no header);
    both write the answer. ``route`` names the create (a key is for one route and body).
    """
    key = parse_key(handler.request.headers.get_list(HEADER))
    if key is None:
        await create(None)
        return
    claim = KeyClaim(handler.username, key, fingerprint(route, handler.request.body or b""))
    if (stored := _stored(handler, sched, claim)) is not None:
        await _replay(handler, claim, stored, replay)
        return
    flights: set[tuple[str, str]] = handler.settings.setdefault("gpusched_key_flights", set())
    mark = (claim.owner, claim.key)
    if mark in flights:
        raise in_flight()
    flights.add(mark)
    try:
        await create(claim)
    except KeyTakenError:  # another server made it meanwhile: answer what it made
        stored = _stored(handler, sched, claim)
        if stored is None:
            raise in_flight() from None
        await _replay(handler, claim, stored, replay)
    finally:
        flights.discard(mark)


def in_flight() -> InFlightError:
    """The 409 of a repeat whose first request is still being answered."""
    return InFlightError(
        f"a request with this {HEADER} is still being answered; send it again after the "
        "Retry-After seconds to get its answer",
        retry_after_s=IN_FLIGHT_RETRY_S,
    )


def _stored(handler: Any, sched: Any, claim: KeyClaim) -> KeyRecord | None:
    """The stored key, unless it is past the keep time (then it is forgotten, and reusable)."""
    stored: KeyRecord | None = sched.store.find_key(claim.owner, claim.key)
    if stored is None:
        return None
    keep_s = float(handler.settings.get("gpusched_idempotency_keep_s", 86400.0))
    before = sched.clock.now() - timedelta(seconds=keep_s)
    if stored.created_at >= before:
        return stored
    sched.store.forget_key(claim.owner, claim.key, before=before)
    return None


async def _replay(
    handler: Any,
    claim: KeyClaim,
    stored: KeyRecord,
    replay: Callable[[KeyRecord], Awaitable[None]],
) -> None:
    if stored.fingerprint != claim.fingerprint:
        raise InvalidSpecError(
            HEADER,
            f"this key was used for another request (another route or body) at "
            f"{stored.created_at:%Y-%m-%d %H:%M:%S} UTC; send a new key with a new request",
        )
    handler.set_header(REPLAYED_HEADER, "true")
    await replay(stored)
