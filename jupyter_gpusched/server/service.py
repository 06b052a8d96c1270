"""``jupyter gpusched service``: the lab's one queue, as a long-lived process of its own.

It runs the scheduler, the store and the node pool, and serves the same REST + websocket API
(the same OpenAPI) under ``{base_url}gpusched/api/`` -- and nothing else: no notebooks, no
kernels, no files, no login page. Users' Jupyter servers run the extension in client mode and
forward their API calls here with the user's identity (:mod:`.client_mode`).

Configuration is the extension's (``c.GpuSchedApp.nodes``, ``c.GpuSchedPolicy.windows``,
``c.GpuSchedApp.store_url`` -- PostgreSQL recommended), read from
``jupyter_gpusched_service_config.py`` on the Jupyter config path or ``--config=FILE``.

Two ways to know who calls (``--GpuSchedService.auth``):

* ``hub`` -- a JupyterHub-managed service (``c.JupyterHub.services`` entry with ``command`` and
  ``url``): the Hub identifies each token; ``auto`` picks this when the Hub's environment
  (``JUPYTERHUB_SERVICE_NAME``, ``JUPYTERHUB_API_TOKEN``) is there, and takes the address and
  prefix from ``JUPYTERHUB_SERVICE_URL`` / ``JUPYTERHUB_SERVICE_PREFIX``.
* ``token`` -- tokens minted with ``jupyter gpusched service token USER``.
"""

from __future__ import annotations

import os
import sys
import urllib.parse
from typing import Any

from jupyter_server.serverapp import ServerApp
from traitlets import Bool, Enum, Float, Int, Unicode, default

from jupyter_gpusched.core.cmdline import StrictLoader

from .auth import HubIdentityProvider, ServiceAuthorizer, StoreTokenIdentityProvider
from .config import GpuSchedPolicy

#: Where the service listens when no Hub says: loopback, a port of its own.
DEFAULT_PORT = 10101
#: How long one of the service's threads may hold Python's GIL while another waits for it
#: (Python's own: 5 ms). Big submits and answers are built in worker threads so the event loop
#: stays free, but the loop needs the GIL for each request: at 5 ms a turn, another user's read
#: waited tens of milliseconds behind a flood's chunks (BENCHMARKS.md, "One user's flood").
GIL_SWITCH_S = 0.001


def under_hub() -> bool:
    """Whether this process was started by JupyterHub as a managed service."""
    return bool(
        os.environ.get("JUPYTERHUB_SERVICE_NAME") and os.environ.get("JUPYTERHUB_API_TOKEN")
    )


class GpuSchedService(ServerApp):
    """The lab-wide GPU queue: the gpusched API and nothing else of a Jupyter server."""

    name = "jupyter-gpusched-service"
    description = __doc__.split("\n", 1)[0]
    # No contents, kernels, terminals, files or pages: only what extensions add (ours).
    default_services = ()
    subcommands: dict[str, Any] = {
        "token": (
            "jupyter_gpusched.server.service_tokens.TokenApp",
            "Mint, list or revoke a user's API token of the service (no JupyterHub).",
        )
    }

    auth = Enum(
        ["auto", "hub", "token"],
        default_value="auto",
        help="""How callers are identified: 'hub' (JupyterHub tokens; the service must be
        managed by the Hub), 'token' (tokens minted by 'jupyter gpusched service token USER'),
        or 'auto' (hub when started by JupyterHub, else token).""",
    ).tag(config=True)
    quiet_extensions = Bool(
        True, help="Load no other server extension, whatever the Jupyter config path enables."
    ).tag(config=True)
    data_dir = Unicode(
        help="""Directory of the service's own files: each user's uploaded notebooks and
        inputs and the executed notebooks and logs that come back (users/<name>/). Default:
        gpusched-service under the Jupyter data dir."""
    ).tag(config=True)

    header_timeout_s = Float(
        30.0,
        min=1.0,
        help="""Seconds a client has to send a request's headers, counted from when its
        connection opened or its previous answer ended (so also how long an idle kept-alive
        connection stays open); then its connection is closed.""",
    ).tag(config=True)
    body_timeout_s = Float(
        30.0,
        min=1.0,
        help="""Seconds a request body may go without a byte arriving; then its connection is
        closed. Past these first seconds a body must also average body_min_rate_bytes_s.""",
    ).tag(config=True)
    body_min_rate_bytes_s = Int(
        8192,
        min=0,
        help="""Slowest average rate, in bytes per second, at which a request body may arrive
        once body_timeout_s has passed (0: any); slower bodies are cut. At 8192 the largest
        body the API reads (GpuSchedApp.max_request_bytes, 96 MB) may take 3.4 hours.""",
    ).tag(config=True)
    max_connections_per_address = Int(
        128,
        min=0,
        help="""Connections one client address may hold open at once (0: no cap); the next
        is answered 503 and closed at once. Under JupyterHub with a local spawner every
        user's server reaches the service from one address: size it for the lab there.""",
    ).tag(config=True)

    classes = [*ServerApp.classes, GpuSchedPolicy, StoreTokenIdentityProvider, HubIdentityProvider]

    def _create_loader(  # type: ignore[override]
        self, argv: list[str] | None, aliases: Any, flags: Any, classes: Any
    ) -> StrictLoader:
        """Refuse a misspelt option (traitlets only warns and goes on without it).

        ``--GpuSchedApp.*`` is checked too; another extension's options pass as they are.
        """
        from .app import GpuSchedApp

        loader = StrictLoader(
            argv,
            aliases,
            flags,
            classes=classes,
            log=self.log,
            subcommands=self.subcommands,
            prog="jupyter gpusched service",
        )
        loader.extra_classes = (GpuSchedApp,)
        loader.other_classes_ok = True
        return loader

    @property
    def hub_mode(self) -> bool:
        """Whether callers are identified by JupyterHub."""
        return self.auth == "hub" or (self.auth == "auto" and under_hub())

    @default("data_dir")
    def _data_dir_default(self) -> str:
        from jupyter_core.paths import jupyter_data_dir

        return os.path.join(jupyter_data_dir(), "gpusched-service")

    @default("identity_provider_class")
    def _identity_provider_class_default(self) -> type:
        return HubIdentityProvider if self.hub_mode else StoreTokenIdentityProvider

    @default("authorizer_class")
    def _authorizer_class_default(self) -> type:
        return ServiceAuthorizer

    @default("jpserver_extensions")
    def _jpserver_extensions_default(self) -> dict[str, bool]:
        return {"jupyter_gpusched": True}

    @default("open_browser")
    def _open_browser_default(self) -> bool:
        return False

    @default("ip")
    def _ip_default(self) -> str:
        hub_url = os.environ.get("JUPYTERHUB_SERVICE_URL")
        if self.hub_mode and hub_url:
            return urllib.parse.urlsplit(hub_url).hostname or "127.0.0.1"
        return "127.0.0.1"

    @default("port")
    def _port_default(self) -> int:
        hub_url = os.environ.get("JUPYTERHUB_SERVICE_URL")
        if self.hub_mode and hub_url:
            return urllib.parse.urlsplit(hub_url).port or DEFAULT_PORT
        return int(os.environ.get("JUPYTER_PORT", DEFAULT_PORT))

    @default("base_url")
    def _base_url_default(self) -> str:
        prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX")
        return prefix if self.hub_mode and prefix else "/"

    @default("default_url")
    def _default_url_default(self) -> str:
        return "/gpusched/api/openapi.yaml"

    def find_server_extensions(self) -> None:
        """Only the gpusched extension runs here, unless told otherwise."""
        if not self.quiet_extensions:
            super().find_server_extensions()

    def initialize(self, argv: Any = None, **kwargs: Any) -> None:
        """Jupyter's, then Python's GIL handed on every :data:`GIL_SWITCH_S`."""
        super().initialize(argv, **kwargs)
        sys.setswitchinterval(GIL_SWITCH_S)

    def init_httpserver(self) -> None:
        """Jupyter's server, made a :class:`.connections.GuardedHTTPServer` before it binds."""
        from .connections import ConnectionLimits, GuardedHTTPServer

        super().init_httpserver()  # finds the port; binds self.http_server later, on the loop
        limits = ConnectionLimits(
            header_timeout_s=self.header_timeout_s,
            body_timeout_s=self.body_timeout_s,
            body_min_rate_bytes_s=self.body_min_rate_bytes_s,
            max_connections_per_address=self.max_connections_per_address,
        )
        self._http_server = GuardedHTTPServer(
            self.web_app,
            limits=limits,
            ssl_options=self.ssl_options,
            xheaders=self.trust_xheaders,
            max_body_size=self.max_body_size,
            max_buffer_size=self.max_buffer_size,
        )

    def init_configurables(self) -> None:
        """Refuse to serve without knowing who calls."""
        super().init_configurables()
        if self.hub_mode and not under_hub():
            raise SystemExit(
                "jupyter gpusched service: --GpuSchedService.auth=hub needs to run as a "
                "JupyterHub-managed service (JUPYTERHUB_SERVICE_NAME and JUPYTERHUB_API_TOKEN "
                "are not set); add it to c.JupyterHub.services, or use auth=token"
            )
