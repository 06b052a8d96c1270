"""Slurm backend: our queue decides when and where, Slurm runs, enforces and accounts.

Each placement becomes one ``sbatch`` pinned to the node our packer chose (``--nodelist``),
asking for the GPUs (the GPU model as GRES type), CPUs, memory and time limit of the job, as
the job's owner (``run_as = "owner"``: ``sudo -n -u USER``) or as the service's user. The
job's argv and environment go into a launch file in its private job dir, which one fixed batch
script sources (:mod:`.commands`: never on a command line); a launch record per attempt
(:mod:`.records`) makes launches idempotent and claimable. State
comes from one batched ``squeue`` per poll (:mod:`.states`), the cluster map from ``scontrol
show node`` (GPUs held by Slurm jobs we did not submit count as foreign).

Files (job dirs, logs, executed notebooks, lease connection files) live on a filesystem the
service's host shares with the nodes, as on Slurm sites. Lease kernels are reached over SSH
when ``nodes`` names the Slurm node (the SSH backend's node settings), else at the node's
address, where the kernel then listens (CurveZMQ-encrypted).
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from socket import AF_INET
from typing import Any

from traitlets import Dict, Enum, Float, List, Unicode, default
from traitlets.config import LoggingConfigurable

from jupyter_gpusched.core.clock import Clock
from jupyter_gpusched.core.errors import BackendError, NodeRefusedError
from jupyter_gpusched.core.inventory import GpuInfo, GpuProcess, NodeInventory
from jupyter_gpusched.core.models import Job, JobKind, Placement
from jupyter_gpusched.node.jobs import PARAMETERS_ENV, PARAMETERS_FILE
from jupyter_gpusched.node.kernel import KERNEL_IP_ENV

from ..base import JobStatus, LaunchResult
from ..ssh.config import NodeConfig, RemoteResult
from . import commands
from .access import SharedFiles, run_local
from .nodes import NodeSide
from .parse import LOST_JOB_STATES, SlurmNode, exit_code, parse_nodes
from .records import CLAIMED, LaunchRecords
from .states import JobStates

#: What sbatch says when the controller did not answer: the job may or may not exist.
_UNSURE = ("Unable to contact", "Socket timed out", "Zero Bytes", "Connection refused",
           "Transport endpoint", "timed out")  # fmt: skip
#: Service environment variables that reach sbatch (and so the jobs) as the service's user.
_PASS_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "SLURM_CONF")


class SlurmBackend(NodeSide, LoggingConfigurable):
    """A :class:`~jupyter_gpusched.cluster.base.Backend` on an existing Slurm cluster.

    Selected with ``c.GpuSchedApp.backend_class = "jupyter_gpusched.cluster.slurm.
    SlurmBackend"``; configured as ``c.SlurmBackend.*``. ``nodes`` (the app's SSH nodes) are
    only needed to reach lease kernels on nodes whose address the service cannot reach.
    """

    #: The app starts no simulated cluster for it: Slurm knows the nodes.
    finds_its_nodes = True

    partition = Unicode("", help="Slurm partition to submit to and show ('' = all).").tag(
        config=True
    )
    run_as = Enum(
        ["service", "owner"],
        default_value="service",
        help="""Who submits: 'service' (the service's own user: a single-user setup) or
        'owner' (the job's owner, through `sudo -n -u USER`; the sudoers rule must let the
        service run sbatch, scancel, mkdir, cp, dd and test as the lab's users).""",
    ).tag(config=True)
    workdir = Unicode(
        "~/.gpusched/slurm",
        help="""Where job directories are made (logs, staged files, outputs), on a
        filesystem the service and the nodes share; '~' and '{user}' are the job owner's.""",
    ).tag(config=True)
    state_dir = Unicode(
        help="""Directory of the service's launch records and batch script, on a filesystem
        the nodes see and the jobs' users can read. Default: gpusched/slurm under the
        Jupyter data dir.""",
    ).tag(config=True)
    slurm_conf = Unicode("", help="SLURM_CONF for the Slurm commands ('' = Slurm's own).").tag(
        config=True
    )
    python = Unicode(
        "python3", help="Interpreter on the nodes that imports jupyter_gpusched (notebooks, %%gpu)."
    ).tag(config=True)
    sbatch_args = List(
        Unicode(), help="Extra sbatch arguments for every job, e.g. ['--account=lab']."
    ).tag(config=True)
    job_env = Dict(
        Unicode(), help="Environment variables set for every job (after the job's own)."
    ).tag(config=True)
    gpu_models = Dict(
        Unicode(), help="GPU model shown and matched for each GRES type, e.g. {'a100': 'A100'}."
    ).tag(config=True)
    gpu_mem_gb = Dict(
        Float(), help="GPU memory in GB of each GRES type, e.g. {'a100': 80} (Slurm has none)."
    ).tag(config=True)
    default_gpu_mem_gb = Float(16.0, help="GPU memory in GB of GRES types not in gpu_mem_gb.").tag(
        config=True
    )
    time_margin_s = Float(
        120.0,
        help="""Seconds added to a job's runtime limit for Slurm's --time: our scheduler stops
        it (with its grace period) first, Slurm's limit is the backstop.""",
    ).tag(config=True)
    name_prefix = Unicode(
        "gpusched", help="Prefix of the Slurm job names (gpusched-<job>.<attempt>-<time>)."
    ).tag(config=True)

    @default("state_dir")
    def _default_state_dir(self) -> str:
        from jupyter_core.paths import jupyter_data_dir

        return os.path.join(jupyter_data_dir(), "gpusched", "slurm")

    def __init__(
        self,
        nodes: Sequence[NodeConfig] = (),
        *,
        clock: Clock,
        inventory_interval_s: float = 30.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._clock = clock
        self.inventory_interval_s = inventory_interval_s
        self._ssh: Any = None
        if nodes:
            from ..ssh.pool import NodePool

            self._ssh = NodePool(nodes, clock=clock, inventory_interval_s=inventory_interval_s)
        self._nodes: dict[str, SlurmNode] = {}
        self._inventory: list[NodeInventory] = []
        self.records = LaunchRecords(self.state_dir)
        self.states = JobStates(self._run_slurm, self._is_ours)
        self._script = os.path.join(os.path.dirname(self.records.dir), "gpusched-batch.sh")

    # ------------------------------------------------------------------ plumbing
    def _env(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in _PASS_ENV if k in os.environ}
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        return env

    def _as(self, user: str | None, argv: Sequence[str]) -> list[str]:
        """``argv`` as ``user`` (sudo strips SLURM_CONF, so it goes through ``env``)."""
        if user is not None and self.slurm_conf:
            argv = ["env", f"SLURM_CONF={self.slurm_conf}", *argv]
        return commands.as_user(user, argv)

    async def _run_slurm(self, argv: Sequence[str], user: str | None = None) -> RemoteResult:
        return await run_local(self._as(user, argv), env=self._env(), timeout_s=60.0)

    def _user(self, job: Job) -> str | None:
        return job.user if self.run_as == "owner" else None

    def _job_dir(self, job: Job, name: str) -> str:
        root = self.workdir.replace("{user}", job.user)
        if root == "~" or root.startswith("~/"):
            home = os.path.expanduser("~")
            if self.run_as == "owner":
                try:
                    home = pwd.getpwnam(job.user).pw_dir
                except KeyError:
                    raise NodeRefusedError(
                        f"no local user {job.user!r} to run job {job.id} as"
                    ) from None
            root = home + root[1:]
        return f"{root.rstrip('/')}/jobs/{name}"

    def _is_ours(self, slurm_id: int, name: str) -> int | None:
        """Our job id of a Slurm job whose launch record names it; None for others' jobs."""
        head = f"{self.name_prefix}-"
        job_id, dot, _ = name[len(head) :].partition(".")
        if not name.startswith(head) or not dot or not job_id.isdigit():
            return None
        try:
            return int(job_id) if self.records.read(name) == str(slurm_id) else None
        except ValueError:
            return None

    def _handle(self, job: Job, node: str, slurm_id: int) -> dict[str, Any]:
        name = commands.job_name(job, self.name_prefix)
        job_dir = self._job_dir(job, name)
        user = self._user(job)
        # pid/pgid: the scheduler reads a pid as "its launch returned"; here the Slurm job id
        return {"node": node, "slurm_job_id": slurm_id, "pid": slurm_id, "pgid": slurm_id,
                "name": name, "job_dir": job_dir, "log": f"{job_dir}/output.log",
                "user": user}  # fmt: skip

    def _of(self, job: Job) -> tuple[int, str | None, dict[str, Any]]:
        h = job.handle or {}
        if h.get("slurm_job_id") is None:
            raise BackendError(f"job {job.id} has no Slurm job id to find it by")
        return int(h["slurm_job_id"]), h.get("user"), h

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Write the batch script; connect to the SSH nodes (if any). Idempotent."""
        self.records.ensure()
        tmp = f"{self._script}.tmp"
        with open(tmp, "w") as f:
            f.write(commands.BATCH_SCRIPT)
        os.chmod(tmp, 0o755)
        os.replace(tmp, self._script)
        if self._ssh is not None:
            await self._ssh.start()

    async def close(self) -> None:
        """Close SSH connections; Slurm keeps running the jobs."""
        if self._ssh is not None:
            await self._ssh.close()

    # ------------------------------------------------------------------ inventory
    async def inventory(self, *, refresh: bool = False) -> list[NodeInventory]:
        """Nodes and GPUs from ``scontrol show node``; others' Slurm jobs hold foreign GPUs."""
        try:
            result = await self._run_slurm(["scontrol", "-d", "-o", "show", "node"])
            if result.exit_status != 0:
                raise BackendError(f"scontrol failed: {str(result.stderr).strip()[-300:]}")
            nodes = parse_nodes(result.stdout)
            if self.partition:
                nodes = [n for n in nodes if self.partition in n.partitions]
            used = {(n.name, i) for n in nodes for i in n.gpus_used}
            if used - {(n.name, i) for n in nodes for i in self.states.ours_on(n.name)}:
                await self.states.learn_gpus()  # ours that just started, or others'
        except BackendError as exc:
            # The controller is away: keep the last picture (jobs keep running meanwhile).
            return [_with_error(n, exc.message) for n in self._inventory]
        self._nodes = {n.name: n for n in nodes}
        self._inventory = [self._node_inventory(n) for n in nodes]
        return self._inventory

    def _node_inventory(self, node: SlurmNode) -> NodeInventory:
        ours = self.states.ours_on(node.name)
        gpus = []
        for index, kind in enumerate(node.gpu_types):
            mem_mb = 1024.0 * self.gpu_mem_gb.get(kind, self.default_gpu_mem_gb)
            busy = index in node.gpus_used
            processes: tuple[GpuProcess, ...] = ()
            if busy:  # Slurm shows no processes: the allocation stands for them
                job_id = ours.get(index)
                name = f"gpusched job {job_id}" if job_id is not None else "another Slurm job"
                processes = (GpuProcess(pid=0, used_mem_mb=mem_mb, name=name, job_id=job_id),)
            gpus.append(
                GpuInfo(
                    index=index,
                    uuid=f"slurm-{node.name}-gpu{index}",
                    model=self._model(kind, node.features),
                    mem_total_mb=mem_mb,
                    mem_used_mb=mem_mb if busy else 0.0,
                    processes=processes,
                )
            )
        error = None
        if not node.schedulable:
            error = f"Slurm state {node.state}" + (f": {node.reason}" if node.reason else "")
        return NodeInventory(
            name=node.name,
            gpus=tuple(gpus),
            cpus=node.cpus,
            mem_gb=round(node.mem_mb / 1024, 3),
            up=node.schedulable,
            error=error,
            probed_at=self._clock.now(),
        )

    def _model(self, kind: str, features: Sequence[str]) -> str:
        if kind:
            return self.gpu_models.get(kind, kind)
        for feature in features:  # untyped GRES: a node feature may name the model
            if feature in self.gpu_models:
                return self.gpu_models[feature]
        return "gpu"

    #: Slurm declares a node down itself, after its own SlurmdTimeout: no second grace.
    declares_nodes_down = True

    def node_down(self, name: str) -> bool:
        """True while Slurm reports the node down, failed or not responding."""
        node = self._nodes.get(name)
        return node is not None and node.gone

    # ------------------------------------------------------------------ launching
    async def launch(
        self, job: Job, placement: Placement, *, argv: Sequence[str] | None = None
    ) -> LaunchResult:
        """Submit the job attempt pinned to the placed node.

        The same attempt again returns the first submission (its launch record); a claimed
        attempt is refused.
        """
        command = list(argv or job.spec.command or [])
        if not command:
            raise BackendError(f"job {job.id} has no command to run on {placement.node}")
        name = commands.job_name(job, self.name_prefix)
        held = self.records.read(name)
        if held == CLAIMED:
            raise NodeRefusedError(f"attempt {name} was stopped before it started")
        if held is not None:
            return LaunchResult(handle=self._handle(job, placement.node, int(held)))
        user = self._user(job)
        job_dir = self._job_dir(job, name)
        files = SharedFiles(self._env())
        await files.makedirs(user, job_dir)
        if job.spec.files:
            await files.copy_in(user, job.spec.files, job_dir)
        # the job's env values, argv and parameters go into files of its private job dir,
        # never on sbatch's or the batch script's command line (anyone's ps shows those)
        env = await self._job_env(job, name, job_dir, placement.node)
        if job.spec.parameters:
            env[PARAMETERS_ENV] = f"{job_dir}/{PARAMETERS_FILE}"
            await files.write(user, env[PARAMETERS_ENV], json.dumps(job.spec.parameters))
        try:
            launch_text = commands.launch_file_text(command, env)
        except ValueError as exc:
            raise NodeRefusedError(f"job {job.id}: {exc} (SlurmBackend.job_env?)") from None
        await files.write(user, f"{job_dir}/launch.sh", launch_text)
        submission = commands.Submission(
            name=name,
            node=placement.node,
            gpus=len(placement.gpu_indices),
            gres_type=self._gres_type(placement),
            cpus=job.spec.cpus,
            mem_gb=job.spec.mem_gb,
            limit_s=_limit_s(job, self.time_margin_s),
            workdir=job.spec.workdir or job_dir,
            log=f"{job_dir}/output.log",
            script=os.path.abspath(self._script),
            launch_file=f"{job_dir}/launch.sh",
            partition=self.partition,
            extra=self.sbatch_args,
        )
        result = await self._run_slurm(submission.argv(), user)
        if result.exit_status != 0:
            why = str(result.stderr).strip()[-800:] or f"exit {result.exit_status}"
            unsure = any(word in why for word in _UNSURE)
            error = BackendError if unsure else NodeRefusedError
            raise error(f"sbatch for job {job.id} on {placement.node}: {why}")
        slurm_id = int(str(result.stdout).strip().split(";")[0])
        held = self.records.create(name, str(slurm_id))
        if held != str(slurm_id):  # a claim or another launch of this attempt won the race
            await self._run_slurm(["scancel", str(slurm_id)], user)
            if held == CLAIMED:
                raise NodeRefusedError(f"attempt {name} was stopped before it started")
            slurm_id = int(held)
        return LaunchResult(handle=self._handle(job, placement.node, slurm_id))

    def _gres_type(self, placement: Placement) -> str:
        node = self._nodes.get(placement.node)
        if node is None or not placement.gpu_indices:
            return ""
        first = placement.gpu_indices[0]
        return node.gpu_types[first] if first < len(node.gpu_types) else ""

    async def _job_env(self, job: Job, name: str, job_dir: str, node: str) -> dict[str, str]:
        env = {**job.spec.env, **self.job_env}
        if job.spec.kind is JobKind.LEASE and not self._over_ssh(node):
            env[KERNEL_IP_ENV] = await self._ip(node)
        env.update(
            GPUSCHED_JOB_ID=str(job.id),
            GPUSCHED_JOB_DIR=job_dir,
            GPUSCHED_CHECKPOINT_FILE=f"{job_dir}/checkpoint",
            GPUSCHED_LAUNCH_RECORD=self.records.path(name),
        )
        return env

    async def _ip(self, node: str) -> str:
        """The node's address as an IP (its kernel binds it; zmq takes no host names)."""
        addr = self._address(node)
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(addr, None, family=AF_INET)
        except OSError:
            raise NodeRefusedError(f"cannot resolve the address {addr!r} of node {node}") from None
        return str(infos[0][4][0])

    async def claim_launch(self, job: Job, placement: Placement) -> LaunchResult | None:
        """The attempt's Slurm job if it was launched; else claim it so that none ever runs."""
        name = commands.job_name(job, self.name_prefix)
        held = self.records.read(name) or self.records.create(name, CLAIMED)
        if held != CLAIMED:
            return LaunchResult(handle=self._handle(job, placement.node, int(held)))
        # A launch cut short may have submitted a job: its script will not run the work, and
        # it need not wait for resources either.
        await self._run_slurm(["scancel", f"--name={name}"], self._user(job))
        return None

    # ------------------------------------------------------------------ following
    async def poll(self, job: Job) -> JobStatus:
        """What Slurm says of the job, from a ``squeue`` round shared with concurrent polls."""
        try:
            slurm_id, user, h = self._of(job)
            row = await self.states.row(slurm_id)
        except BackendError as exc:
            return JobStatus(running=False, lost=True, detail=exc.message)
        if row is None:  # the controller forgot it, and accounting is off: our exit record
            # None when it left none (killed by a signal): it ended all the same, long ago.
            return JobStatus(running=False, exit_code=await self._recorded_exit(user, h))
        if row.state in LOST_JOB_STATES:
            return JobStatus(running=False, lost=True, detail=f"Slurm job {slurm_id}: {row.state}")
        if row.active:
            known = self.states.gpus.get(slurm_id)
            return JobStatus(
                running=True,
                detail=None if row.started else f"pending in Slurm ({row.reason})",
                checkpoint_at=_checkpoint(h),
                gpu_indices=known[1] if known and row.started else None,
            )
        return JobStatus(running=False, exit_code=exit_code(row.exit_status), ended_at=row.ended_at)

    async def _recorded_exit(self, user: str | None, h: dict[str, Any]) -> int | None:
        raw = await SharedFiles(self._env()).read(user, f"{h.get('job_dir')}/exit_code")
        text = raw.decode(errors="replace").strip()
        return int(text) if text.lstrip("-").isdigit() else None

    async def cancel(self, job: Job, *, grace_s: float = 10.0) -> None:
        """TERM every process of the job (scancel --signal), KILL after ``grace_s``."""
        slurm_id, user, _ = self._of(job)
        rows = await self.states.squeue([slurm_id])
        row = rows.get(slurm_id)
        if row is None or not row.active:
            return
        sid = str(slurm_id)
        if not row.started:
            await self._run_slurm(["scancel", sid], user)
            return
        await self._run_slurm(["scancel", "--signal=TERM", "--full", sid], user)
        loop = asyncio.get_running_loop()  # real time: the job's own grace, not the queue's
        deadline = loop.time() + grace_s
        while loop.time() < deadline:
            await asyncio.sleep(min(0.2, max(0.0, deadline - loop.time())))
            row = (await self.states.squeue([slurm_id])).get(slurm_id)
            if row is None or not row.active or row.state == "COMPLETING":
                return
        await self._run_slurm(["scancel", "--signal=KILL", "--full", sid], user)
        await self._run_slurm(["scancel", sid], user)


def _limit_s(job: Job, margin_s: float) -> float | None:
    limit = job.handle.get("limit_s") or job.spec.max_runtime_s
    return float(limit) + margin_s if limit else None


def _checkpoint(h: dict[str, Any]) -> datetime | None:
    """The job's last reported checkpoint, where the service may read it.

    An owner's private job dir hides it; then no checkpoint is known.
    """
    try:
        with open(f"{h.get('job_dir')}/checkpoint") as f:
            return datetime.fromtimestamp(float(f.read().strip()), tz=UTC)
    except (OSError, ValueError, OverflowError):
        return None


def _with_error(node: NodeInventory, message: str) -> NodeInventory:
    return replace(node, error=f"Slurm controller: {message}")
