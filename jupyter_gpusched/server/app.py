"""The server extension: the composition root that wires store, backend and scheduler.

Every option is a trait read from the usual Jupyter config files
(``c.GpuSchedApp.nodes = [...]``, ``c.GpuSchedPolicy.windows = [...]``). With no config at all
the extension starts the embedded simulated cluster, so a fresh install has something to show.

It runs in one of three modes:

* **embedded** (the default): this server runs the scheduler for its own user;
* **service**: inside ``jupyter gpusched service`` (:mod:`.service`), the lab's one queue;
* **client**: ``service_url`` is set (or the Hub has a ``gpusched`` service): no scheduler
  here; the API is forwarded to the service with this server's user's identity
  (:mod:`.client_mode`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any

from jupyter_server.extension.application import ExtensionApp
from traitlets import Bool, Dict, Enum, Float, Int, List, Set, Type, Unicode, default, validate
from traitlets import TraitError as _TraitError

from jupyter_gpusched.core.errors import UnavailableError
from jupyter_gpusched.packing.packer import POLICIES

from .building import build_scheduler
from .config import GpuSchedPolicy
from .logs import match_level_to_handlers
from .userlimits import LimitGate

#: The built-in features (entry points of the ``jupyter_gpusched.plugins`` group).
PLUGINS: tuple[str, ...] = ("leases", "notebooks")

#: The package's logger: every module logs under it (``logging.getLogger(__name__)``).
PACKAGE_LOG = "jupyter_gpusched"
#: Environment variables through which kernels started by this server find it again.
URL_ENV, TOKEN_ENV = "GPUSCHED_URL", "GPUSCHED_TOKEN"
_NODE_KEYS = frozenset(
    {
        "name",
        "host",
        "port",
        "username",
        "key_file",
        "key_files",
        "python",
        "workdir",
        "staging",
        "known_hosts",
        "env",
        "max_channels",
        "agent",
        "sudo",
    }
)


class GpuSchedApp(ExtensionApp):
    """One GPU queue for the lab's cluster, served under ``{base_url}gpusched/api/``."""

    name = "jupyter_gpusched"
    load_other_extensions = True
    classes = [*ExtensionApp.classes, GpuSchedPolicy]

    nodes = List(
        Dict(),
        help="""GPU nodes reached over SSH, one dict each: name, host, port (default 22),
        username, key_file or key_files, python (interpreter on the node), workdir and staging
        (directories on the node), agent (absolute path of the node's gpusched-agent; needed
        with run_as 'sudo'), sudo (the node's sudo). Empty (the default) runs the embedded
        simulated cluster.""",
    ).tag(config=True)
    run_as = Enum(
        ["service", "ssh", "sudo"],
        default_value="service",
        help="""Whose Unix account runs each job, lease kernel and notebook on its node.
        'service' (the default): the account this scheduler logs in as (one person's own
        cluster). 'ssh': the job's owner, logged in with the per-user key at user_key_file.
        'sudo': the owner, through 'sudo -n -u OWNER' on the scheduler's own login, limited by
        a sudoers line to the node's agent (each node's 'agent' names it). A job whose owner
        has no account (or key, or sudo permission) on its node fails; it never runs as the
        scheduler's account. Applies to `nodes`: the embedded simulated cluster runs
        everything as this server's user. See the README's 'Jobs run as their owners'.""",
    ).tag(config=True)
    user_key_file = Unicode(
        "/etc/gpusched/keys/{user}",
        help="""With run_as 'ssh': the private key the scheduler logs in to the nodes with as
        each job's owner; '{user}' is replaced by the owner's name.""",
    ).tag(config=True)
    known_hosts = Unicode(
        None,
        allow_none=True,
        help="known_hosts file checked against the nodes' host keys; None = ~/.ssh/known_hosts.",
    ).tag(config=True)
    store_url = Unicode(
        help="SQLAlchemy URL of the job store; default: SQLite under the Jupyter data dir. "
        "Use postgresql+psycopg://... to share one queue between servers."
    ).tag(config=True)
    packer_policy = Enum(
        list(POLICIES), default_value="fragmentation", help="How jobs are placed on GPUs."
    ).tag(config=True)
    admin_users = Set(Unicode(), help="User names that may cancel or change anyone's jobs.").tag(
        config=True
    )
    service_url = Unicode(
        "",
        help="""URL of the lab-wide gpusched service (jupyter gpusched service), e.g.
        http://gpu-head:10101/. When set, this server runs no scheduler and forwards the
        gpusched API there with its user's identity. Under JupyterHub it defaults to the Hub's
        'gpusched' service when one is registered.""",
    ).tag(config=True)
    service_token = Unicode(
        "",
        help="""This server's user's token for the service (minted with 'jupyter gpusched
        service token USER'); under JupyterHub the server's own Hub token is used.""",
    ).tag(config=True)
    hub_service_name = Unicode(
        "gpusched",
        help="""Name of the JupyterHub service to forward to when service_url is not set;
        '' = under a Hub too, run this server's own scheduler.""",
    ).tag(config=True)
    kernel_forward_ip = Unicode(
        "127.0.0.1",
        help="""Address where %%gpu lease kernels' forwarded ports listen, and that kernels'
        clients connect to. Loopback suits one host; when users' servers run on other hosts
        than the lab-wide service, set an address of the service's host they reach (the
        traffic is CurveZMQ-encrypted and signed with a per-lease key).""",
    ).tag(config=True)
    leader_ttl_s = Float(
        6.0,
        min=1.0,
        help="""Seconds the scheduler's leader lease holds without renewal: a standby
        scheduler on the same store takes over this long after the leader died.""",
    ).tag(config=True)
    store_writer_process = Bool(
        True,
        help="""Commit submissions in a child process of the server (about 60 MB), so their
        transactions do not compete with requests for the server's GIL: with many clients
        submitting at once, about a third more submits a second. The child starts with the
        first submit and exits with the server. False: commit them in a thread of the server
        (what an in-memory store always does).""",
    ).tag(config=True)
    anonymous_user = Unicode(
        help="Owner recorded for requests Jupyter's stock identity providers leave anonymous "
        "(a single-user server with one shared token); default: the OS user of the server."
    ).tag(config=True)
    tick_interval_s = Float(
        1.0, min=0.01, help="Seconds between scheduling passes over the queue."
    ).tag(config=True)
    poll_interval_s = Float(
        2.0, min=0.01, help="Seconds between checks of whether running jobs have ended."
    ).tag(config=True)
    inventory_interval_s = Float(
        30.0,
        min=0.1,
        help="Seconds between probes of the nodes' GPUs (memory, processes, utilization): "
        "also the spacing of the GPU history's samples.",
    ).tag(config=True)
    node_down_after_s = Float(
        300.0,
        min=0.0,
        help="""Seconds a node may stay unreachable before it is declared down and its jobs are
        requeued per their retries (Slurm's SlurmdTimeout, 300 s by default, is the
        precedent). Until then the node is suspect: it takes no new work and its jobs keep
        their GPUs, so a network blip kills nothing; a node back within it has its jobs go
        on, and one back later has attempts that still ran there re-adopted while their
        retry has not started. 0: down as soon as unreachable. Backends whose cluster engine
        declares nodes down itself (Slurm) add no grace of their own.""",
    ).tag(config=True)
    gpu_history_samples = Int(
        2880,
        min=2,
        help="Samples of each GPU's utilization, memory and power kept in memory for the "
        "charts (2880: a day at a 30 s inventory_interval_s); lost on restart.",
    ).tag(config=True)
    max_request_bytes = Int(
        96 << 20,
        min=1024,
        help="""Largest request body the API reads, in bytes; larger ones are refused with 413.
        The default leaves room for a job's uploaded files (64 MB, base64-encoded).""",
    ).tag(config=True)
    event_commentary_keep_days = Float(
        30.0,
        min=0.0,
        help="""Days after a job ended that its running commentary is kept in the event log:
        the waiting reasons each pass gave it and a notebook's cell progress. Its submit,
        state changes and kills stay for good. The leader drops older commentary hourly;
        0 keeps everything.""",
    ).tag(config=True)
    idempotency_keep_s = Float(
        86400.0,
        min=1.0,
        help="""Seconds a create's Idempotency-Key is kept (a day): a repeat of the request
        within it gets the first one's answer, never a second job. The leader purges older
        keys.""",
    ).tag(config=True)
    max_follows_per_user = Int(
        4,
        min=1,
        help="""Log follows (GET jobs/{id}/log?follow=1) one user may hold open at once; more
        are refused with 429. Each holds an SSH channel on the job's node (so this holds in
        every mode), and counts against the user's streams (GpuSchedPolicy.limits) too.""",
    ).tag(config=True)
    gc_freeze = Bool(
        True,
        help="""Freeze what survives each of Python's full garbage collections (and sweep
        everything hourly): with thousands of jobs cached, each full collection otherwise
        stops the server for 150-200 ms. See jupyter_gpusched.server.gc_pauses.""",
    ).tag(config=True)
    store_retry_max_s = Float(
        10.0,
        min=1.0,
        help="""Longest pause, in seconds, between tries to open the store when it was away at
        start (PostgreSQL down, the file locked or unreadable); the pause starts at 1 s and
        doubles.""",
    ).tag(config=True)
    sim_nodes = List(
        Dict(),
        allow_none=True,
        default_value=None,
        help="""Shape of the embedded simulated cluster when `nodes` is empty, one dict per
        node with the fields of jupyter_gpusched.cluster.sim.cluster.SimNodeSpec (name,
        gpu_model, gpu_mem_gb, gpus, cpus, mem_gb, nvlink_pairs); None = the simulator's
        default lab.""",
    ).tag(config=True)
    sim_dir = Unicode(
        help="Directory of the simulated nodes (keys, GPU state, job dirs); jobs running there "
        "survive a server restart. Default: gpusched/sim under the Jupyter data dir; '' = a "
        "temporary directory removed (and its jobs killed) when the server stops."
    ).tag(config=True)
    plugins = List(
        Unicode(),
        default_value=list(PLUGINS),
        help="""Features that extend the scheduler: names of entry points in the
        'jupyter_gpusched.plugins' group, each a jupyter_gpusched.server.plugins.Plugin (job
        kinds, hooks, routes). Built in: 'leases' (%%gpu kernels), 'notebooks' (notebook jobs
        and recurring definitions).""",
    ).tag(config=True)
    scheduler_class = Type(
        default_value="jupyter_gpusched.scheduling.scheduler.Scheduler",
        klass=object,
        help="The scheduler class (dotted path); swap it to serve a different core.",
    ).tag(config=True)
    backend_class = Type(
        default_value="jupyter_gpusched.cluster.ssh.SshBackend",
        klass=object,
        help="""How jobs reach the nodes (dotted path of a class implementing
        jupyter_gpusched.cluster.base.Backend). It is called as
        backend_class(node_configs, clock=clock, inventory_interval_s=...), with one
        jupyter_gpusched.cluster.ssh.NodeConfig per entry of `nodes` -- or, when `nodes` is
        empty, per node of the embedded simulated cluster, whose nodes are loopback SSH
        servers: the default SshBackend serves both. A configurable backend also gets
        parent=this app (its traits are read from the same config); one whose class sets
        finds_its_nodes (jupyter_gpusched.cluster.slurm.SlurmBackend) never gets the
        simulated cluster.""",
    ).tag(config=True)

    @default("store_url")
    def _default_store_url(self) -> str:
        from jupyter_gpusched.store.store import Store

        return Store.default_url()

    @default("anonymous_user")
    def _default_anonymous_user(self) -> str:
        import getpass

        return getpass.getuser()

    @default("sim_dir")
    def _default_sim_dir(self) -> str:
        from jupyter_core.paths import jupyter_data_dir

        return os.path.join(jupyter_data_dir(), "gpusched", "sim")

    @validate("nodes")
    def _check_nodes(self, proposal: dict[str, Any]) -> list[dict[str, Any]]:
        for node in proposal["value"]:
            unknown = set(node) - _NODE_KEYS
            if "name" not in node or "host" not in node or unknown:
                raise _TraitError(
                    f"GpuSchedApp.nodes entry {node!r} needs 'name' and 'host'"
                    + (f" and has unknown keys {sorted(unknown)}" if unknown else "")
                    + f"; allowed keys: {sorted(_NODE_KEYS)}"
                )
        return proposal["value"]

    @validate("sim_nodes")
    def _check_sim_nodes(self, proposal: dict[str, Any]) -> list[dict[str, Any]] | None:
        from jupyter_gpusched.cluster.sim.specs import SimNodeSpec

        for node in proposal["value"] or ():
            try:
                SimNodeSpec(**node)
            except TypeError as exc:
                raise _TraitError(
                    f"GpuSchedApp.sim_nodes entry {node!r}: {exc}; give name, gpu_model, "
                    "gpu_mem_gb, gpus, cpus, mem_gb (and optionally nvlink_pairs)"
                ) from None
        return proposal["value"]

    def initialize_settings(self) -> None:
        """Nothing runs yet: the scheduler needs the running loop (see start)."""
        self._adopt_package_log()
        self._ready = None  # asyncio.Event, created on the server's loop
        self._starting: asyncio.Future[None] | None = None  # retrying a start (store away)
        self._waiting: Any = None  # the scheduler that waits for its store
        self.start_error: UnavailableError | None = None  # why the scheduler waits
        self._sim: Any = None
        self._sync: Any = None
        self._gc: Any = None  # the GcFreezer while the scheduler runs here
        self.link = self._service_link()
        self.mode = "client" if self.link else "service" if self._in_service() else "embedded"
        self.settings["gpusched_mode"] = self.mode
        self.settings["gpusched_link"] = self.link
        self.settings["gpusched_data_dir"] = self._data_dir()
        self.settings["gpusched_admins"] = frozenset(self.admin_users)
        self.settings["gpusched_anonymous_user"] = self.anonymous_user
        self.settings["gpusched_max_request_bytes"] = self.max_request_bytes
        self.settings["gpusched_idempotency_keep_s"] = self.idempotency_keep_s
        self.settings["gpusched_gate"] = LimitGate.of(self)
        self.settings["gpusched_app"] = self

    def initialize_handlers(self) -> None:
        """Mount the REST and websocket routes, the plugins' routes before the catch-all 404."""
        from .handlers import arrays, cluster, events, jobs
        from .handlers.base import NO_ROUTE

        if self.mode == "client":
            from . import client_mode

            self.handlers.extend(client_mode.handlers)
            return
        routes = [*jobs.handlers, *arrays.handlers, *cluster.handlers, *events.handlers]
        for plugin in self.plugin_modules():
            routes.extend(plugin.handlers)
        self.handlers.extend([*routes, NO_ROUTE])

    def plugin_modules(self) -> list[Any]:
        """The features named by ``plugins``, loaded (their routes, install and shutdown)."""
        from .plugins import load

        return load(self.plugins)

    def _in_service(self) -> bool:
        from .service import GpuSchedService

        return isinstance(self.serverapp, GpuSchedService)

    def _service_link(self) -> Any:
        """Where the lab-wide service is, when this server should forward to one."""
        from .client_mode import ServiceLink, check_link, hub_service_link

        if self._in_service():
            return None
        if self.service_url:
            token = self.service_token or os.environ.get("JUPYTERHUB_API_TOKEN", "")
            url = self.service_url if self.service_url.endswith("/") else self.service_url + "/"
            link = ServiceLink(url, token)
            check_link(link)
            return link
        return hub_service_link(self.hub_service_name)

    def _data_dir(self) -> str:
        """Where this server keeps users' uploaded files and notebooks (service: per user)."""
        if self._in_service():
            return str(self.serverapp.data_dir)
        from jupyter_core.paths import jupyter_data_dir

        return os.path.join(jupyter_data_dir(), "gpusched", "files")

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        """Start the cluster and the scheduler loop once the server's loop runs."""
        ready = self._ready_event()
        if self.mode == "client":
            from .outputs import OutputSync

            self._sync = OutputSync(self.link, self._root_dir(serverapp))
            self._sync.start()
            self._export_env(serverapp)
            ready.set()
            self.log.info("gpusched | forwarding to the lab's service at %s", self.link.url)
            return
        if self.gc_freeze:
            from .gc_pauses import GcFreezer

            self._gc = GcFreezer()
            self._gc.start()
        if self.mode == "service":
            self._serve_tokens(serverapp)
        try:
            scheduler, self._sim = await build_scheduler(self)
            await scheduler.start()
        except UnavailableError as exc:
            # The store is away (PostgreSQL down, the file locked, read-only or corrupt): the
            # API answers 503 saying so, and the scheduler starts once the store is back.
            self._store_away(exc)
            self._waiting = scheduler
            self._starting = asyncio.ensure_future(self._start_when_back(serverapp, scheduler))
            return
        except BaseException:
            await self._stop_sim()
            if self._gc is not None:
                self._gc.stop()
                self._gc = None
            ready.set()  # waiting handlers answer 503 now instead of timing out
            raise
        self._started(serverapp, scheduler)

    def _started(self, serverapp: Any, scheduler: Any) -> None:
        self._waiting = None
        serverapp.web_app.settings["gpusched"] = scheduler
        if self.mode != "service":
            self._export_env(serverapp)
        self.start_error = None
        self._ready_event().set()
        self.log.info("gpusched | scheduler started (%s)", self.store_url)

    def _store_away(self, exc: UnavailableError) -> None:
        if self.start_error is None or self.start_error.message != exc.message:
            self.log.error(
                "gpusched | the scheduler waits for its store (%s): %s; it tries again by "
                "itself, the API answers 503 until then",
                self.store_url,
                exc.message,
            )
        self.start_error = exc

    async def _start_when_back(self, serverapp: Any, scheduler: Any) -> None:
        """Try to start the scheduler again, less and less often, until its store answers."""
        pause_s = 1.0
        while True:
            await asyncio.sleep(pause_s)
            try:
                await scheduler.start()
            except UnavailableError as exc:
                self._store_away(exc)
                pause_s = min(self.store_retry_max_s, pause_s * 2)
                continue
            self._started(serverapp, scheduler)
            return

    async def wait_ready(self, timeout_s: float) -> Any | None:
        """The scheduler once started, or None if it did not start within ``timeout_s``."""
        try:
            await asyncio.wait_for(self._ready_event().wait(), timeout_s)
        except TimeoutError:
            return None
        return self.serverapp.web_app.settings.get("gpusched")

    def _serve_tokens(self, serverapp: Any) -> None:
        """Tokens are looked up in the scheduler's store: a 503 saying why until it is open."""
        from jupyter_gpusched.store import tokens

        from .auth import STARTING, StoreTokenIdentityProvider

        def lookup(token: str) -> str | None:
            scheduler = serverapp.web_app.settings.get("gpusched")
            if scheduler is None:  # starting, stopping, or waiting for its store
                raise self.start_error or UnavailableError(STARTING, retry_after_s=1.0)
            return tokens.user_for(scheduler.store, token)

        if isinstance(serverapp.identity_provider, StoreTokenIdentityProvider):
            serverapp.identity_provider.lookup = lookup

    @staticmethod
    def _root_dir(serverapp: Any) -> str:
        root = getattr(serverapp.contents_manager, "root_dir", None) or serverapp.root_dir
        return os.path.expanduser(str(root))

    async def stop_extension(self) -> None:
        """Stop the loop; jobs keep running on their nodes and are reattached on restart."""
        if self._sync is not None:
            await self._sync.stop()
            self._sync = None
        await self.settings["gpusched_gate"].close()
        if self._starting is not None:
            self._starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._starting
            self._starting = None
        if self._waiting is not None:  # never started: its store stayed away
            await self._waiting.stop()
            self._waiting = None
        scheduler = self.serverapp.web_app.settings.pop("gpusched", None)
        if scheduler is not None:
            for plugin in self.plugin_modules():
                if plugin.shutdown is not None:
                    await plugin.shutdown(scheduler)
            await scheduler.stop()
        await self._stop_sim()
        if self._gc is not None:
            self._gc.stop()
            self._gc = None
        logging.getLogger(PACKAGE_LOG).parent = logging.getLogger()  # this server is gone
        for name, old in getattr(self, "_saved_env", {}).items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old

    def _adopt_package_log(self) -> None:
        """Make the package's logger a child of the server's.

        Its records (a "scheduler tick failed" traceback) then go through the server's
        handlers -- its format, its ``--log-level``, its log file -- not around them.
        """
        package = logging.getLogger(PACKAGE_LOG)
        package.parent = self.serverapp.log
        package.propagate = True
        package.setLevel(logging.NOTSET)  # the server's level decides
        match_level_to_handlers(self.serverapp.log)  # its debug records: built, never shown

    def _ready_event(self) -> asyncio.Event:
        if self._ready is None:
            self._ready = asyncio.Event()
        return self._ready

    async def _stop_sim(self) -> None:
        sim, self._sim = self._sim, None
        if sim is not None:
            await sim.stop()

    def _export_env(self, serverapp: Any) -> None:
        """Kernels inherit the server's environment: tell them where their server is."""
        values = {URL_ENV: serverapp.connection_url, TOKEN_ENV: serverapp.identity_provider.token}
        self._saved_env = {name: os.environ.get(name) for name in values}
        os.environ.update({k: v or "" for k, v in values.items()})
