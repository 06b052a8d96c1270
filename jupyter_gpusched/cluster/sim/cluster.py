"""The embedded simulated cluster: one in-process SSH server on loopback per simulated node.

Only the GPUs are simulated. Every command a client sends runs as a real local process
(``/bin/sh -c``, its own session, like sshd), so scripts really run, logs really stream and
cancel really kills; the scheduler reaches these nodes through the same
:class:`~jupyter_gpusched.cluster.ssh.SshBackend` code path, host-key checks included, as real
ones. Each node's processes get ``GPUSCHED_NVML_MODULE=jupyter_gpusched.cluster.sim.nvml`` and
``GPUSCHED_SIM_STATE=<node>/gpus.json``, so the agent's NVML probe answers from the simulated
GPUs, and jobs that set ``CUDA_VISIBLE_DEVICES`` and ``GPUSCHED_GPU_MEM_MB`` show up as
processes using that memory (see :mod:`.nvml_sim`).

Layout of ``base_dir``::

    client_key, client_key.pub     the user's generated key (the only one the nodes accept)
    known_hosts                    ``[127.0.0.1]:PORT`` lines for every node's host key
    nodes/<name>/ssh_host_key      the node's host key
    nodes/<name>/gpus.json         simulated GPU state (static GPUs + foreign processes)
    nodes/<name>/home, work, tmp   $HOME, the agent's workdir and $TMPDIR of the node
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

import asyncssh

from jupyter_gpusched.cluster.ssh import NodeConfig
from jupyter_gpusched.core.errors import InvalidSpecError, NotFoundError
from jupyter_gpusched.node.stage import private_folder

from .nvml import STATE_ENV, node_pids
from .server import (
    _Node,
    _NodeServer,
    _NodeSftp,
    _pump_out,
    _pump_stdin,
    _relay_signals,
    _signal_group,
)
from .specs import DEFAULT_SIM_NODES, SimNodeSpec, gpu_state

__all__ = ["SimCluster"]

NVML_MODULE = "jupyter_gpusched.cluster.sim.nvml"
_KILL_GRACE_S = 2.0  # after the client hangs up: SIGTERM, then SIGKILL the command's group


def _port_outside_ephemeral_range() -> int:
    """A free loopback port below the kernel's ephemeral range.

    A port handed out by ``bind(0)`` comes from the ephemeral range, so once a stopped node
    frees it, any outgoing connection on the machine may take it as its source port and the
    node could not come back on it. Ports below the range are never handed out that way.
    """
    low = 32768
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return 0  # crowded machine: let the kernel choose


def _write_json(path: Path, data: dict[str, Any]) -> None:
    # Atomic: nvml_sim in another process may read the file at any moment.
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    os.replace(tmp, path)


def _write_secret(path: Path, data: bytes) -> None:
    # Created 0600 from the start: a private key is never readable by others, not even briefly.
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


class SimCluster:
    """Simulated GPU nodes behind real SSH servers on 127.0.0.1.

    Parameters
    ----------
    nodes
        The nodes to simulate.
    base_dir
        Where keys, GPU state and the nodes' home/work dirs live. Default: a temporary directory
        that :meth:`stop` removes (killing what still runs on the nodes). With a given directory,
        jobs outlive :meth:`stop` and a new SimCluster on it finds them again.
    """

    def __init__(
        self,
        nodes: tuple[SimNodeSpec, ...] | list[SimNodeSpec] = DEFAULT_SIM_NODES,
        *,
        base_dir: Path | None = None,
    ) -> None:
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise InvalidSpecError("nodes", f"node names must be unique, got {names}")
        self._specs = tuple(nodes)
        self._owns_dir = base_dir is None
        self._base_dir = Path(base_dir) if base_dir is not None else None
        self._nodes: dict[str, _Node] = {}
        self._authorized: asyncssh.SSHAuthorizedKeys | None = None
        self._user = getpass.getuser()
        self._next_foreign_pid = 4_100_000  # above any pid a default pid_max hands out

    # ---- paths -------------------------------------------------------------------------------

    @property
    def base_dir(self) -> Path:
        """The directory holding everything; set once :meth:`start` ran."""
        if self._base_dir is None:
            raise RuntimeError("SimCluster.start() has not run yet")
        return self._base_dir

    @property
    def known_hosts(self) -> Path:
        """The sim's own known_hosts file (``[127.0.0.1]:PORT`` entries)."""
        return self.base_dir / "known_hosts"

    @property
    def client_key(self) -> Path:
        """Private key the nodes accept (OpenSSH format, mode 0600)."""
        return self.base_dir / "client_key"

    @property
    def node_names(self) -> list[str]:
        """Names of the simulated nodes, in configuration order."""
        return [s.name for s in self._specs]

    def port(self, name: str) -> int:
        """Port the node listens on (kept across :meth:`stop_node` / :meth:`start_node`)."""
        return self._node(name).port

    def node_dir(self, name: str) -> Path:
        """The node's directory (home, work, tmp, gpus.json)."""
        return self._node(name).dir

    def state_path(self, name: str) -> Path:
        """The node's ``gpus.json``; equals ``GPUSCHED_SIM_STATE`` on that node."""
        return self._node(name).state_path

    def is_up(self, name: str) -> bool:
        """Whether the node accepts connections."""
        return self._node(name).listener is not None

    def _node(self, name: str) -> _Node:
        try:
            return self._nodes[name]
        except KeyError:
            raise NotFoundError(
                f"no simulated node {name!r}; nodes are {', '.join(self.node_names)}"
            ) from None

    # ---- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> list[NodeConfig]:
        """Generate keys, start one SSH server per node; return configs to reach them."""
        if self._nodes:
            return self.node_configs()
        if self._base_dir is None:
            self._base_dir = Path(tempfile.mkdtemp(prefix="gpusched-sim-"))
        base = self._base_dir
        private_folder(str(base / "nodes"))  # the simulated nodes' homes and keys: this user's

        client_key = asyncssh.generate_private_key("ssh-ed25519", comment="gpusched-sim-client")
        _write_secret(self.client_key, client_key.export_private_key())
        client_key.write_public_key(self.client_key.with_suffix(".pub"))
        self._authorized = asyncssh.import_authorized_keys(
            client_key.export_public_key("openssh").decode()
        )

        for spec in self._specs:
            node_dir = base / "nodes" / spec.name
            for sub in ("home", "work", "tmp"):
                (node_dir / sub).mkdir(parents=True, exist_ok=True)
            host_key = asyncssh.generate_private_key("ssh-ed25519", comment=f"sim {spec.name}")
            _write_secret(node_dir / "ssh_host_key", host_key.export_private_key())
            node = _Node(spec, node_dir, host_key)
            _write_json(node.state_path, gpu_state(spec))
            self._nodes[spec.name] = node
        try:
            for node in self._nodes.values():
                node.port = _port_outside_ephemeral_range()
                await self._listen(node)
        except BaseException:
            await self.stop()
            raise
        lines = [
            f"[127.0.0.1]:{n.port} {n.host_key.export_public_key('openssh').decode().strip()}\n"
            for n in self._nodes.values()
        ]
        self.known_hosts.write_text("".join(lines), encoding="utf-8")
        return self.node_configs()

    def node_configs(self) -> list[NodeConfig]:
        """How :class:`~jupyter_gpusched.cluster.ssh.SshBackend` reaches each node."""
        return [
            NodeConfig(
                name=n.spec.name,
                host="127.0.0.1",
                port=n.port,
                username=self._user,
                client_keys=(str(self.client_key),),
                known_hosts=str(self.known_hosts),
                python=sys.executable,
                workdir=str(n.dir / "work"),
                staging="sftp",
            )
            for n in self._nodes.values()
        ]

    async def stop(self, *, kill_jobs: bool | None = None) -> None:
        """Stop every node; with a temporary base dir, also kill its jobs and remove the dir.

        ``kill_jobs`` overrides whether the detached jobs still running on the nodes are killed.
        """
        kill = self._owns_dir if kill_jobs is None else kill_jobs
        for name in list(self._nodes):
            await self.stop_node(name, kill_jobs=kill)
        self._nodes.clear()
        if self._owns_dir and self._base_dir is not None:
            shutil.rmtree(self._base_dir, ignore_errors=True)
            self._base_dir = None

    async def stop_node(self, name: str, *, kill_jobs: bool = False) -> None:
        """Take a node off the network: stop listening and drop its connections.

        Commands of dropped channels are killed (as a hang-up would); detached jobs keep running
        unless ``kill_jobs`` — then the node behaves as if it crashed.
        """
        node = self._node(name)
        if node.listener is not None:
            node.listener.close()
            await node.listener.wait_closed()
            node.listener = None
        for conn in list(node.conns):
            conn.close()
        for conn in list(node.conns):
            await conn.wait_closed()
        if node.tasks:
            await asyncio.gather(*node.tasks, return_exceptions=True)
        if kill_jobs:
            await _kill_pids(node_pids(str(node.state_path)))

    async def start_node(self, name: str) -> None:
        """Bring a stopped node back on its old port with its old host key."""
        node = self._node(name)
        if node.listener is None:
            await self._listen(node)

    async def __aenter__(self) -> SimCluster:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _listen(self, node: _Node) -> None:
        def sftp_factory(chan: asyncssh.SSHServerChannel) -> _NodeSftp:
            return _NodeSftp(chan, root=node.dir, home=node.home)

        async def process_factory(process: asyncssh.SSHServerProcess[bytes]) -> None:
            task = asyncio.current_task()
            assert task is not None
            node.tasks.add(task)  # type: ignore[arg-type]
            try:
                await self._run_command(node, process)
            finally:
                node.tasks.discard(task)  # type: ignore[arg-type]

        node.listener = await asyncssh.listen(
            "127.0.0.1",
            node.port,
            server_factory=lambda: _NodeServer(node),
            server_host_keys=[node.host_key],
            authorized_client_keys=self._authorized,
            process_factory=process_factory,
            sftp_factory=sftp_factory,
            encoding=None,
            line_editor=False,
            allow_scp=False,
        )
        node.port = node.listener.get_port()

    # ---- commands ----------------------------------------------------------------------------

    def _env(self, node: _Node, process: asyncssh.SSHServerProcess[bytes]) -> dict[str, str]:
        """A login environment like sshd builds: fresh, not the Jupyter server's."""
        peer = process.get_extra_info("peername") or ("127.0.0.1", 0)
        py_bin = os.path.dirname(sys.executable)  # `python` on the node is this interpreter
        env = {
            "PATH": f"{py_bin}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(node.home),
            "USER": self._user,
            "LOGNAME": self._user,
            "SHELL": "/bin/sh",
            "TMPDIR": str(node.dir / "tmp"),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "SSH_CLIENT": f"{peer[0]} {peer[1]} {node.port}",
            "SSH_CONNECTION": f"{peer[0]} {peer[1]} 127.0.0.1 {node.port}",
        }
        for key in ("PYTHONPATH", "VIRTUAL_ENV", "TZ", "LC_ALL", "LC_CTYPE"):
            if key in os.environ:
                env[key] = os.environ[key]
        env.update({str(k): str(v) for k, v in process.env.items()})
        # Set last: a client must not detach a process from its node's GPU accounting.
        env.update(
            {
                "GPUSCHED_SIM_NODE": node.spec.name,
                STATE_ENV: str(node.state_path),
                "GPUSCHED_NVML_MODULE": NVML_MODULE,
                "GPUSCHED_SIM_CPUS": str(node.spec.cpus),
                "GPUSCHED_SIM_MEM_GB": str(node.spec.mem_gb),
            }
        )
        return env

    async def _run_command(self, node: _Node, process: asyncssh.SSHServerProcess[bytes]) -> None:
        """Run one exec/shell request as a real process, relaying I/O, signals and exit status."""
        if process.subsystem:  # sftp has its own factory; nothing else is offered
            process.stderr.write(f"sim: subsystem {process.subsystem!r} not available\n".encode())
            process.exit(1)
            return
        argv = ["/bin/sh", "-c", process.command] if process.command else ["/bin/sh"]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._env(node, process),
                cwd=node.home,
                start_new_session=True,  # own session + group: the group is what a hang-up kills
            )
        except OSError as exc:
            process.stderr.write(f"sim: cannot start command: {exc}\n".encode())
            process.exit(127)
            return
        assert proc.stdout is not None and proc.stderr is not None
        _relay_signals(process, proc.pid)
        stdin_task = asyncio.create_task(_pump_stdin(process, proc))
        finished = asyncio.ensure_future(
            asyncio.gather(
                proc.wait(),
                _pump_out(proc.stdout, process.stdout),
                _pump_out(proc.stderr, process.stderr),
            )
        )
        closed = asyncio.ensure_future(process.channel.wait_closed())
        either: list[asyncio.Future[Any]] = [finished, closed]
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if finished.done() and not process.is_closing():
                rc = proc.returncode
                assert rc is not None
                if rc < 0:
                    process.exit_with_signal(signal.Signals(-rc).name.removeprefix("SIG"))
                else:
                    process.exit(rc)
                return
            # The client hung up first. sshd leaves the command to SIGPIPE; we end its process
            # group so tests don't leak processes. Jobs the agent setsid-started are not in it.
            _signal_group(proc.pid, signal.SIGTERM)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(finished), _KILL_GRACE_S)
            _signal_group(proc.pid, signal.SIGKILL)
            await proc.wait()
        finally:
            stdin_task.cancel()
            closed.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(finished, _KILL_GRACE_S)
            with contextlib.suppress(asyncio.CancelledError):
                await stdin_task

    # ---- simulated outsiders -----------------------------------------------------------------

    def add_foreign_process(
        self,
        node: str,
        gpu_index: int,
        mem_mb: float,
        *,
        pid: int | None = None,
        name: str = "python",
    ) -> int:
        """Show a process the scheduler did not start (someone ssh'ed in) on one GPU.

        It is pure data in ``gpus.json``: it stays until :meth:`clear_foreign`. Returns its pid.
        """
        n = self._node(node)
        if not 0 <= gpu_index < n.spec.gpus:
            raise InvalidSpecError(
                "gpu_index", f"node {node} has GPUs 0..{n.spec.gpus - 1}, got {gpu_index}"
            )
        if pid is None:
            pid, self._next_foreign_pid = self._next_foreign_pid, self._next_foreign_pid + 1
        state = json.loads(n.state_path.read_text(encoding="utf-8"))
        state["foreign"].append(
            {"gpu_index": gpu_index, "pid": pid, "mem_mb": float(mem_mb), "name": name}
        )
        _write_json(n.state_path, state)
        return pid

    def clear_foreign(self, node: str) -> None:
        """Remove every foreign process from a node."""
        n = self._node(node)
        state = json.loads(n.state_path.read_text(encoding="utf-8"))
        state["foreign"] = []
        _write_json(n.state_path, state)


async def _kill_pids(pids: list[int]) -> None:
    """TERM then KILL processes (a crashed node takes its jobs with it)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        if sig == signal.SIGTERM and pids:
            await asyncio.sleep(0.2)
