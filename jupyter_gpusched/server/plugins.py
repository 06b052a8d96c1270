"""Features that add job kinds, hooks and routes, found through an entry-point group.

The extension loads the plugins named by ``GpuSchedApp.plugins`` from the
``jupyter_gpusched.plugins`` entry-point group, so another package can add a job kind with
its own routes by declaring an entry point; leases and notebook jobs are the two built in.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from traitlets import TraitError

from jupyter_gpusched.batch import notebooks
from jupyter_gpusched.leases import bridge

from .handlers import leases as lease_routes
from .handlers import notebooks as notebook_routes

#: The entry-point group plugins are declared in.
GROUP = "jupyter_gpusched.plugins"


@dataclass(frozen=True)
class Plugin:
    """One feature of the scheduler.

    ``install(scheduler, backend)`` runs before the loop starts (reattached jobs need their
    kind); ``handlers`` are (path under the server's base URL, handler class) routes;
    ``shutdown(scheduler)`` runs when the server stops.
    """

    install: Callable[[Any, Any], None]
    handlers: Sequence[tuple[str, type]] = ()
    shutdown: Callable[[Any], Awaitable[None]] | None = None


LEASES = Plugin(install=bridge.install, handlers=lease_routes.handlers)
NOTEBOOKS = Plugin(
    install=notebooks.install, handlers=notebook_routes.handlers, shutdown=notebooks.shutdown
)


def load(names: Iterable[str]) -> list[Plugin]:
    """The plugins registered under ``names`` in :data:`GROUP`, in that order."""
    found = {ep.name: ep for ep in entry_points(group=GROUP)}
    plugins = []
    for name in names:
        if name not in found:
            raise TraitError(
                f"GpuSchedApp.plugins: no plugin {name!r} in the {GROUP!r} entry-point group; "
                f"installed: {sorted(found)}"
            )
        plugin = found[name].load()
        if not isinstance(plugin, Plugin):
            raise TraitError(f"GpuSchedApp.plugins: {name!r} is not a jupyter_gpusched Plugin")
        plugins.append(plugin)
    return plugins
