"""The scheduler a :class:`~.app.GpuSchedApp` runs, built from its traits.

With ``nodes`` (or a backend that finds its own, like Slurm's) the backend reaches those; with
neither, the embedded simulated cluster starts and the backend reaches its loopback nodes.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traitlets import TraitError
from traitlets.config import Configurable

from jupyter_gpusched.core.clock import SystemClock

from .config import GpuSchedPolicy

if TYPE_CHECKING:
    from jupyter_gpusched.cluster.sim.cluster import SimCluster

    from .app import GpuSchedApp


async def build_scheduler(app: GpuSchedApp) -> tuple[Any, SimCluster | None]:
    """The scheduler (not started), and the simulated cluster started for it if any.

    A failure after the simulated cluster started stops it again.
    """
    from jupyter_gpusched.cluster.ssh import NodeConfig

    # A backend that finds its nodes itself (Slurm) takes `nodes` as SSH access only.
    finds_nodes = bool(getattr(app.backend_class, "finds_its_nodes", False))
    if app.nodes or finds_nodes:
        try:
            node_configs = [NodeConfig(**node_kwargs(n, app)) for n in app.nodes]
        except ValueError as exc:
            raise TraitError(f"GpuSchedApp.nodes: {exc}") from None
        return _scheduler(app, node_configs), None
    from jupyter_gpusched.cluster.sim.cluster import SimCluster
    from jupyter_gpusched.cluster.sim.specs import DEFAULT_SIM_NODES, SimNodeSpec

    if app.run_as != "service":
        app.log.warning(
            "gpusched | run_as=%r applies to `nodes`; the simulated cluster runs every "
            "job as this server's user",
            app.run_as,
        )
    specs = DEFAULT_SIM_NODES
    if app.sim_nodes is not None:
        specs = tuple(SimNodeSpec(**n) for n in app.sim_nodes)
    sim = SimCluster(specs, base_dir=Path(app.sim_dir) if app.sim_dir else None)
    node_configs = await sim.start()
    try:
        return _scheduler(app, node_configs), sim
    except BaseException:
        await sim.stop()
        raise


def _scheduler(app: GpuSchedApp, node_configs: list[Any]) -> Any:
    from jupyter_gpusched.store.engine import exposure
    from jupyter_gpusched.store.eventlog import EventCompaction
    from jupyter_gpusched.store.idempotency import KeyPurge

    from .embedded import compose

    for warning in exposure(app.store_url):  # a store made before it was created private
        app.log.warning("gpusched | %s", warning)
    clock = SystemClock()
    extra: dict[str, Any] = {}
    if issubclass(app.backend_class, Configurable):
        extra["parent"] = app  # its own traits come from the same config files
    backend = app.backend_class(
        node_configs, clock=clock, inventory_interval_s=app.inventory_interval_s, **extra
    )
    scheduler = compose(
        store_url=app.store_url,
        backend=backend,
        clock=clock,
        policy=GpuSchedPolicy(parent=app).to_policy_config(service=app.mode == "service"),
        scheduler_class=app.scheduler_class,
        packer_policy=app.packer_policy,
        tick_interval_s=app.tick_interval_s,
        poll_interval_s=app.poll_interval_s,
        inventory_interval_s=app.inventory_interval_s,
        node_down_after_s=app.node_down_after_s,
        leader_ttl_s=app.leader_ttl_s,
        admins=frozenset(app.admin_users),
        gpu_history_samples=app.gpu_history_samples,
        store_writer_process=app.store_writer_process,
    )
    for plugin in app.plugin_modules():
        plugin.install(scheduler, backend)  # before start: reattached jobs need their kind
    app.settings["gpusched_gate"].watch(scheduler)  # uploads of ended jobs are removed
    scheduler.tick_hooks.append(KeyPurge(scheduler.store, app.idempotency_keep_s))
    if app.event_commentary_keep_days:
        keep = timedelta(days=app.event_commentary_keep_days)
        scheduler.tick_hooks.append(EventCompaction(scheduler.store, keep))
    if "leases" in app.plugins:
        from jupyter_gpusched.leases.bridge import bridge_for

        bridge_for(scheduler).listen_ip = app.kernel_forward_ip
    return scheduler


def node_kwargs(node: dict[str, Any], app: GpuSchedApp) -> dict[str, Any]:
    """A ``nodes`` entry as NodeConfig arguments (``key_file(s)`` -> ``client_keys``)."""
    kwargs = {k: v for k, v in node.items() if k not in ("key_file", "key_files", "agent")}
    keys = [node["key_file"]] if "key_file" in node else list(node.get("key_files", ()))
    if keys:
        kwargs["client_keys"] = tuple(os.path.expanduser(k) for k in keys)
    if "agent" in node:
        agent = node["agent"]
        kwargs["agent_cmd"] = (agent,) if isinstance(agent, str) else tuple(agent)
    if app.known_hosts is not None:
        kwargs.setdefault("known_hosts", app.known_hosts)
    kwargs["run_as"] = app.run_as
    kwargs["user_key_file"] = app.user_key_file
    return kwargs
