"""Who calls the lab-wide service: JupyterHub tokens, or tokens the service minted itself.

The service answers only API calls with a token (no login page, no cookies): each user's
Jupyter server in client mode, the CLI and scripts send ``Authorization: token T``. Under
JupyterHub, the Hub says whose token it is and what it may do (the scope
``access:services!service=<name>``, re-checked after a short cache); admins are the users whose
token carries the custom scope ``custom:gpusched:admin`` or who are in an admin group, decided
by the Hub's admin, not by the users. Without a Hub, ``jupyter gpusched service token USER``
mints the tokens (:mod:`jupyter_gpusched.store.tokens`) and the service's own
``admin_users`` (in the service's config, which only its operator writes) names the admins.

Streams (a log follow, the events websocket) outlive the check made when they open: they ask
:meth:`~_TokenOnlyIdentityProvider.recheck` every ``stream_recheck_s`` (see
:mod:`.streams`), which asks the store or the Hub afresh -- once per token however many
streams it holds.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jupyter_server.auth.authorizer import Authorizer
from jupyter_server.auth.identity import IdentityProvider, User
from tornado import web
from traitlets import Any as AnyTrait
from traitlets import Float, Integer, Set, Unicode, default

from jupyter_gpusched.core.errors import UnavailableError

#: The one resource every route of the gpusched API declares.
AUTH_RESOURCE = "gpusched"
#: The JupyterHub custom scope of the queue's admins.
ADMIN_SCOPE = "custom:gpusched:admin"
#: What a caller hears while the service cannot yet tell whose token it is (a 503).
STARTING = "the service is starting: tokens are checked once its store is open; try again shortly"


@dataclass
class GpuSchedUser(User):
    """A caller of the service, whether they administer the queue (anyone's jobs), and groups.

    ``gpusched_admin`` None: the identity does not say (the server's ``admin_users`` decide).
    ``groups``: what the identity says (JupyterHub's groups), for the per-group limits.
    """

    gpusched_admin: bool | None = False
    groups: tuple[str, ...] = ()


class ServiceAuthorizer(Authorizer):
    """Every identified caller may use the gpusched API, and nothing else of the server.

    Whose job a caller may change is the scheduler's check (owner or admin), not this one's.
    """

    def is_authorized(
        self, handler: web.RequestHandler, user: User, action: str, resource: str
    ) -> bool:
        """Allow the gpusched API only."""
        return resource == AUTH_RESOURCE


class _TokenOnlyIdentityProvider(IdentityProvider):
    """Token in the ``Authorization`` header (or ``?token=`` on a websocket), never a cookie."""

    stream_recheck_s = Float(
        2.0,
        min=0.1,
        help="""Seconds between checks that the token of an open log follow or events
        websocket still holds (and its admin right, when it had one): revoking either ends
        those streams within about this long plus one answer of the store or the Hub. Each
        token with open streams costs one lookup per this many seconds.""",
    ).tag(config=True)
    #: token -> (when asked, the answer): the streams of one token share one fresh lookup
    _rechecks: dict[str, tuple[float, asyncio.Future[GpuSchedUser | None]]] | None = None

    @default("need_token")
    def _need_token_default(self) -> bool:
        return False

    @default("token")
    def _token_default(self) -> str:
        return ""

    @property
    def auth_enabled(self) -> bool:  # noqa: D102
        return True

    @property
    def login_available(self) -> bool:  # noqa: D102
        return False

    def get_handlers(self) -> list[tuple[str, object]]:
        """No login or logout pages: the service speaks API only."""
        return []

    def bearer(self, handler: web.RequestHandler) -> str:
        """The token of a request: ``token T`` / ``Bearer T`` header, or ``?token=``."""
        header = handler.request.headers.get("Authorization", "")
        kind, _, value = header.partition(" ")
        if kind.lower() in ("token", "bearer") and value.strip():
            return value.strip()
        return handler.get_query_argument("token", "")

    async def identify(self, token: str) -> GpuSchedUser | None:
        """The user a token belongs to (None: refused)."""
        raise NotImplementedError

    async def identify_now(self, token: str) -> GpuSchedUser | None:
        """:meth:`identify`, asking its source afresh (no cached answer)."""
        return await self.identify(token)

    async def recheck(self, handler: web.RequestHandler) -> GpuSchedUser | None:
        """Who an open stream's token names now (None: nobody any more).

        Answers younger than half of ``stream_recheck_s`` are shared, so the Hub (or the
        store) is asked once per token and period however many streams the token holds.
        Raises what asking raised (the Hub or the store away): the caller decides.
        """
        token = self.bearer(handler)
        if not token:
            return None
        now = time.monotonic()
        fresh_s = self.stream_recheck_s / 2
        if self._rechecks is None:
            self._rechecks = {}
        for key, (asked_at, _) in list(self._rechecks.items()):
            if now - asked_at > fresh_s:
                del self._rechecks[key]
        entry = self._rechecks.get(token)
        if entry is None:
            answer = asyncio.ensure_future(self.identify_now(token))
            # retrieved here too: a stream that stopped waiting leaves no unread exception
            answer.add_done_callback(lambda f: f.cancelled() or f.exception())
            entry = self._rechecks[token] = (now, answer)
        return await asyncio.shield(entry[1])

    async def get_user(self, handler: web.RequestHandler) -> User | None:  # type: ignore[override]
        """Identify the caller by their token; remember it on the handler for XSRF checks."""
        cached = getattr(handler, "_jupyter_current_user", None)
        if cached is not None:
            return cached  # type: ignore[no-any-return]
        token = self.bearer(handler)
        if not token:
            return None
        user = await self.identify(token)
        if user is not None:
            handler._token_authenticated = True  # type: ignore[attr-defined]
        return user

    def is_token_authenticated(self, handler: web.RequestHandler) -> bool:
        """Every caller of the service is (there are no cookie sessions)."""
        handler.current_user  # noqa: B018  (identify first)
        return bool(getattr(handler, "_token_authenticated", False))


class StoreTokenIdentityProvider(_TokenOnlyIdentityProvider):
    """Without a Hub: tokens minted by ``jupyter gpusched service token USER``."""

    admin_users = Set(
        Unicode(),
        help="Users who may cancel or change anyone's jobs (set by the service's operator).",
    ).tag(config=True)
    #: Set by the service: token -> user name or None. It raises
    #: :class:`~jupyter_gpusched.core.errors.UnavailableError` (503 with ``Retry-After``)
    #: while it cannot tell -- the store not open yet, or away -- never calling a valid token
    #: invalid (a 401 while the service started made clients drop valid tokens).
    lookup: Callable[[str], str | None] | None = None
    cache_s = Float(
        10.0,
        help="Seconds a token's owner is remembered before the store is asked again: a "
        "revoked token's requests are refused within this time (its open streams within "
        "stream_recheck_s). 0 asks the store at every request.",
    ).tag(config=True)
    #: Most tokens remembered; the oldest answers go first.
    CACHE_SIZE = 10_000

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._known: dict[str, tuple[GpuSchedUser, float]] = {}  # token -> (owner, asked at)

    async def identify(self, token: str) -> GpuSchedUser | None:
        """The token's owner, remembered ``cache_s`` rather than read at every request."""
        known = self._known.get(token)
        if known is not None and time.monotonic() - known[1] < self.cache_s:
            return known[0]
        return await self.identify_now(token)

    async def identify_now(self, token: str) -> GpuSchedUser | None:  # noqa: D102
        if self.lookup is None:  # the service has not wired its store in yet
            raise UnavailableError(STARTING, retry_after_s=1.0)
        name = self.lookup(token)
        if name is None:
            self._known.pop(token, None)
            return None
        user = GpuSchedUser(username=name, gpusched_admin=name in self.admin_users)
        self._known[token] = (user, time.monotonic())
        if len(self._known) > self.CACHE_SIZE:
            del self._known[next(iter(self._known))]
        return user


class HubIdentityProvider(_TokenOnlyIdentityProvider):
    """Under JupyterHub: the Hub identifies each token and says what it may do."""

    admin_scope = Unicode(
        ADMIN_SCOPE, help="JupyterHub scope that makes its holder an admin of the queue."
    ).tag(config=True)
    admin_groups = Set(
        Unicode(), help="JupyterHub groups whose members are admins of the queue."
    ).tag(config=True)
    cache_s = Integer(
        30, help="Seconds a token's identity and scopes are cached before the Hub is asked again."
    ).tag(config=True)
    hub_auth = AnyTrait(help="The jupyterhub.services.auth.HubAuth that asks the Hub.")

    @default("hub_auth")
    def _hub_auth_default(self) -> Any:
        from jupyterhub.services.auth import HubAuth

        return HubAuth(cache_max_age=self.cache_s, parent=self)

    async def identify(self, token: str) -> GpuSchedUser | None:  # noqa: D102
        return self._user(await self.hub_auth.user_for_token(token, sync=False))

    async def identify_now(self, token: str) -> GpuSchedUser | None:  # noqa: D102
        return self._user(await self.hub_auth.user_for_token(token, use_cache=False, sync=False))

    def _user(self, model: dict[str, Any] | None) -> GpuSchedUser | None:
        """The caller the Hub's model of a token says, if it may use the service."""
        if not model or model.get("kind", "user") != "user":
            return None
        if not self.hub_auth.check_scopes(self.hub_auth.access_scopes, model):
            self.log.info(
                "gpusched: token of %s lacks %s; refused",
                model.get("name"),
                json.dumps(sorted(self.hub_auth.access_scopes)),
            )
            return None
        admin = self.admin_scope in set(model.get("scopes", ())) or bool(
            self.admin_groups & set(model.get("groups", ()))
        )
        groups = tuple(str(g) for g in model.get("groups") or ())
        return GpuSchedUser(username=str(model["name"]), gpusched_admin=admin, groups=groups)
