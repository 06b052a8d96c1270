"""``jupyter gpusched service token USER``: a user's API token for a service without a Hub.

Prints a new token once (only its digest is stored); ``--revoke`` revokes all of the user's
tokens, ``--list`` lists them (prefixes only). Reads the service's config file for the store.
"""

from __future__ import annotations

from typing import Any

from jupyter_core.application import JupyterApp
from traitlets import Bool, Unicode

from jupyter_gpusched.core.cmdline import StrictLoader


class TokenApp(JupyterApp):
    """Mint, list or revoke API tokens of the lab-wide service."""

    name = "jupyter-gpusched-service-token"
    description = __doc__.split("\n", 1)[0]
    config_file_name = "jupyter_gpusched_service_config"

    revoke = Bool(False, help="Revoke every token of the user.").tag(config=True)
    list_only = Bool(False, help="List the user's tokens (everyone's without USER).").tag(
        config=True
    )
    note = Unicode("", help="What the token is for, shown by --list.").tag(config=True)

    flags: dict[str, Any] = {
        **JupyterApp.flags,
        "revoke": ({"TokenApp": {"revoke": True}}, "Revoke every token of USER."),
        "list": ({"TokenApp": {"list_only": True}}, "List tokens (prefixes only)."),
    }
    aliases: dict[str, Any] = {**JupyterApp.aliases, "note": "TokenApp.note"}

    def _create_loader(  # type: ignore[override]
        self, argv: list[str] | None, aliases: Any, flags: Any, classes: Any
    ) -> StrictLoader:
        """Refuse a misspelt option (traitlets only warns and goes on without it)."""
        return StrictLoader(
            argv,
            aliases,
            flags,
            classes=classes,
            log=self.log,
            subcommands=self.subcommands,
            prog="jupyter gpusched service token",
        )

    def start(self) -> None:
        """Do what the flags say for the user named on the command line."""
        from jupyter_gpusched.core.clock import SystemClock
        from jupyter_gpusched.store import tokens
        from jupyter_gpusched.store.store import Store

        from .app import GpuSchedApp

        users = list(self.extra_args)
        if len(users) > 1 or (not users and not self.list_only):
            self.exit("usage: jupyter gpusched service token USER [--revoke | --list] [--note=...]")
        store = Store(GpuSchedApp(config=self.config).store_url, clock=SystemClock())
        try:
            store.migrate()
            user = users[0] if users else None
            if self.list_only:
                for t in tokens.list_tokens(store, user):
                    when = f"{t.created_at:%Y-%m-%d %H:%M}"
                    print(f"{t.username}\t{t.prefix}...\t{when}\t{t.note or ''}")
            elif self.revoke:
                assert user is not None
                n = tokens.revoke(store, user)
                print(f"revoked {n} token{'s' if n != 1 else ''} of {user}")
            else:
                assert user is not None
                print(tokens.mint(store, user, note=self.note or None))
        finally:
            store.close()
