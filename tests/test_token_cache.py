"""The service remembers a store token's owner for ``cache_s``, and forgets it on refusal."""

from __future__ import annotations

import asyncio

from jupyter_gpusched.server.auth import StoreTokenIdentityProvider


def test_a_tokens_owner_is_remembered_for_cache_s_and_forgotten_once_refused() -> None:
    owners = {"t-alice": "alice"}
    asked: list[str] = []

    def lookup(token: str) -> str | None:  # the store's answer, as the service wires it
        asked.append(token)
        return owners.get(token)

    provider = StoreTokenIdentityProvider(cache_s=3600.0, admin_users={"carol"})
    provider.lookup = lookup
    for _ in range(3):
        user = asyncio.run(provider.identify("t-alice"))
        assert user is not None and user.username == "alice" and not user.gpusched_admin
    assert asked == ["t-alice"]  # asked once, then remembered

    del owners["t-alice"]  # revoked
    assert asyncio.run(provider.identify("t-alice")) is not None  # within cache_s
    assert asyncio.run(provider.identify_now("t-alice")) is None  # a stream's recheck
    assert asyncio.run(provider.identify("t-alice")) is None  # and so every request after
    assert asyncio.run(provider.identify("t-nobody")) is None

    never = StoreTokenIdentityProvider(cache_s=0.0)
    never.lookup = lookup
    owners["t-bob"] = "bob"
    asked.clear()
    for _ in range(2):
        asyncio.run(never.identify("t-bob"))
    assert asked == ["t-bob", "t-bob"]
