"""SSH peers for the backend tests: an in-process asyncssh server and Debian's real sshd.

Both run commands as real local processes (the GPU is the only thing simulated: a JSON state
file read by ``jupyter_gpusched.cluster.sim.nvml`` or by ``tests/data/fake-nvidia-smi``). Every
process a test starts carries ``GPUSCHED_TEST_RUN=<token>`` in its environment, so teardown
kills exactly those by pid and nothing else."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncssh
from _fixtures_polling import scaled, wait_for, wait_for_async
from _fixtures_users import ensure_user

import jupyter_gpusched
from jupyter_gpusched.cluster.base import JobStatus
from jupyter_gpusched.cluster.ssh import NodeConfig, SshBackend
from jupyter_gpusched.core.clock import ManualClock
from jupyter_gpusched.core.models import Job, JobSpec, Placement

REPO_ROOT = Path(jupyter_gpusched.__file__).resolve().parent.parent
FAKE_NVIDIA_SMI = Path(__file__).resolve().parent / "data" / "fake-nvidia-smi"
SSHD = "/usr/sbin/sshd"
TEST_USER = "gpusched-test"

GPU_NAME = "NVIDIA A100-SXM4-80GB"


def gpu_state(gpus: int = 4, foreign: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A node's GPUs in nvml_sim's ``gpus.json`` layout; GPUs 0-1 and 2-3 joined by NVLink."""
    return {
        "version": 1,
        "node": "test",
        "cpus": 32,
        "mem_gb": 256,
        "gpus": [
            {
                "index": i,
                "uuid": f"GPU-0000000{i}-aaaa-bbbb-cccc-{i:012d}",
                "name": GPU_NAME,
                "mem_total_mb": 81920,
                "pci_bus_id": f"00000000:{0x07 + 8 * i:02X}:00.0",
                "nvlink_links": 12,
                "nvlink_peer": i ^ 1 if (i ^ 1) < gpus else None,
                "power_idle_mw": 55000,
                "power_max_mw": 400000,
            }
            for i in range(gpus)
        ],
        "foreign": foreign or [],
    }


def kill_marked(token: str) -> None:
    """SIGKILL every live process whose environment carries this test run's marker."""
    marker = f"GPUSCHED_TEST_RUN={token}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker not in f.read().split(b"\0"):
                    continue
            os.kill(int(entry), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue


def world_readable_dir(prefix: str) -> Path:
    """A temp dir another local user (the sshd test user) can read and traverse."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    return path


def fake_gpu_bin(directory: Path) -> Path:
    """A bin dir whose ``nvidia-smi`` is the fake one."""
    bindir = directory / "bin"
    bindir.mkdir(exist_ok=True)
    bindir.chmod(0o755)
    (bindir / "nvidia-smi").symlink_to(FAKE_NVIDIA_SMI)
    return bindir


def _known_hosts_line(port: int, key: asyncssh.SSHKey) -> str:
    return f"[127.0.0.1]:{port} {key.export_public_key('openssh').decode().strip()}\n"


class _Server(asyncssh.SSHServer):
    def __init__(self, owner: InProcessSshServer) -> None:
        self._owner = owner
        self._conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn
        self._owner.conns.add(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None:
            self._owner.conns.discard(self._conn)

    def connection_requested(
        self, dest_host: str, dest_port: int, orig_host: str, orig_port: int
    ) -> bool:
        return True  # allow forward_local_port (asyncssh refuses it by default)

    def unix_connection_requested(self, dest_path: str) -> bool:
        return True  # allow forward_local_port_to_path


class InProcessSshServer:
    """asyncssh on 127.0.0.1 that runs each command with ``/bin/sh -c`` in its own session.

    Closing a channel does not kill the command (as with OpenSSH) but closes its stdin.
    ``max_sessions_seen`` records the most channels that ever ran at once, ``commands`` every
    command line run.
    """

    def __init__(self, directory: Path, *, env: dict[str, str] | None = None) -> None:
        self.dir = directory
        self.home = directory / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.token = uuid.uuid4().hex
        base = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCHED_")}
        self.env = {**base, "HOME": str(self.home), "GPUSCHED_TEST_RUN": self.token, **(env or {})}
        self.host_key = asyncssh.generate_private_key("ssh-ed25519")
        client_key = asyncssh.generate_private_key("ssh-ed25519")
        self.client_key_path = directory / "client_key"
        client_key.write_private_key(self.client_key_path)
        self.client_key_path.chmod(0o600)
        self._authorized = asyncssh.import_authorized_keys(
            client_key.export_public_key("openssh").decode()
        )
        self.known_hosts = directory / "known_hosts"
        self.port = 0
        self.conns: set[asyncssh.SSHServerConnection] = set()
        self._listener: asyncssh.SSHAcceptor | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._sessions = 0
        self.max_sessions_seen = 0
        self.commands: list[str] = []  # every command line run, in order

    async def start(self) -> None:
        """Listen (on the previous port after a :meth:`stop`, so clients can reconnect)."""
        self._listener = await asyncssh.listen(
            "127.0.0.1",
            self.port,
            server_factory=lambda: _Server(self),
            server_host_keys=[self.host_key],
            authorized_client_keys=self._authorized,
            process_factory=self._handle,
            sftp_factory=True,
            encoding=None,
            line_editor=False,
        )
        self.port = self._listener.get_port()
        self.known_hosts.write_text(_known_hosts_line(self.port, self.host_key))

    async def stop(self) -> None:
        """Stop listening and drop every connection (a node falling off the network)."""
        if self._listener is not None:
            self._listener.close()
            await self._listener.wait_closed()
            self._listener = None
        for conn in list(self.conns):
            conn.close()
        for conn in list(self.conns):
            await conn.wait_closed()
        if self._tasks:
            # a command whose channel closed ends at its stdin's EOF; past a while, each
            # task kills its command and waits for it (an unwaited child outliving this
            # event loop would warn in whichever test collects it)
            _, pending = await asyncio.wait(list(self._tasks), timeout=scaled(5))
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    def node_config(self, name: str = "n0", **overrides: Any) -> NodeConfig:
        """How the backend reaches this server; the agent runs under this venv's Python."""
        fields: dict[str, Any] = {
            "name": name,
            "host": "127.0.0.1",
            "port": self.port,
            "username": getpass.getuser(),
            "client_keys": (str(self.client_key_path),),
            "known_hosts": str(self.known_hosts),
            "python": sys.executable,
            "workdir": str(self.dir / "work"),
        }
        fields.update(overrides)
        return NodeConfig(**fields)

    async def _handle(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._sessions += 1
        self.max_sessions_seen = max(self.max_sessions_seen, self._sessions)
        try:
            await self._run(process)
        finally:
            self._sessions -= 1
            self._tasks.discard(task)

    async def _run(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        self.commands.append(process.command or "")
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            process.command or "exit 0",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            env=self.env,
            cwd=self.home,
        )
        try:
            await self._relay(process, proc)
        finally:
            if proc.returncode is None:  # cancelled by stop(): the command goes with it
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()

    async def _relay(
        self, process: asyncssh.SSHServerProcess[bytes], proc: asyncio.subprocess.Process
    ) -> None:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

        async def pump_in() -> None:
            assert proc.stdin is not None
            try:
                while data := await process.stdin.read(65536):
                    proc.stdin.write(data)
                    await proc.stdin.drain()
            except (asyncssh.Error, OSError):
                pass
            finally:
                proc.stdin.close()

        async def pump_out(source: asyncio.StreamReader, sink: Any) -> None:
            broken = False
            while data := await source.read(65536):
                if broken:
                    continue
                try:
                    sink.write(data)
                    await sink.drain()
                except (asyncssh.Error, OSError):
                    broken = True  # keep draining so the command never blocks on a full pipe

        feeder = asyncio.create_task(pump_in())
        try:
            await asyncio.gather(
                pump_out(proc.stdout, process.stdout), pump_out(proc.stderr, process.stderr)
            )
            code = await proc.wait()
        finally:
            feeder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feeder
        with contextlib.suppress(asyncssh.Error, OSError):
            if code < 0:
                process.exit_with_signal(signal.Signals(-code).name[3:])
            else:
                process.exit(code)


# ---------------------------------------------------------------------------- real sshd


def _readable_by_others(path: Path) -> bool:
    """Whether another local user can read ``path`` (every parent traversable)."""
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH or (parent == path and not mode & stat.S_IROTH):
            return False
    return True


def sshd_login() -> tuple[str, str]:
    """(user, python) for the sshd tests.

    As root: a dedicated non-root user (root's .bashrc makes every command ~80 ms slower, and
    OpenSSH refuses signal requests for root), running the system Python with the repo on
    PYTHONPATH — the venv's Python lives under /root, which other users cannot read. Falls back
    to root when the repo or a system Python is not usable by another user.
    """
    if os.geteuid() != 0:
        return getpass.getuser(), sys.executable
    system_python = "/usr/bin/python3"
    package = REPO_ROOT / "jupyter_gpusched"
    if not (os.access(system_python, os.X_OK) and _readable_by_others(package)):
        return "root", sys.executable
    # created once, its password "*" (useradd's "!" is a locked account that sshd refuses
    # even with a key), under the lock that concurrent test processes share
    ensure_user(TEST_USER)
    return TEST_USER, system_python


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Sshd:
    """Debian's OpenSSH server on a loopback port with its own keys and config."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory  # readable by the test user (authorized_keys, fake GPU state)
        self.user, self.python = sshd_login()
        self.token = uuid.uuid4().hex
        self.private = Path(tempfile.mkdtemp(prefix="gpusched-sshd-keys-"))
        self.host_key = asyncssh.generate_private_key("ssh-ed25519")
        self.host_key.write_private_key(self.private / "host_key")
        (self.private / "host_key").chmod(0o600)
        client_key = asyncssh.generate_private_key("ssh-ed25519")
        self.client_key_path = self.private / "client_key"
        client_key.write_private_key(self.client_key_path)
        self.client_key_path.chmod(0o600)
        authorized = self.dir / "authorized_keys"
        authorized.write_text(client_key.export_public_key("openssh").decode())
        authorized.chmod(0o644)
        self.bindir = fake_gpu_bin(self.dir)
        self.state_path = self.dir / "gpus.json"
        self.known_hosts = self.private / "known_hosts"
        self.workdir = f"~/.gpusched-tests/{self.token}"
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        # who may log in, and where sshd finds their keys (%u: the user's name)
        self.allow_users: list[str] = [self.user]
        self.authorized_keys_file = str(authorized)

    def start(self) -> None:
        """Start ``sshd -D`` and wait until it accepts connections."""
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd refuses to start without
        self.port = _free_port()
        config = self.private / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    "ListenAddress 127.0.0.1",
                    f"Port {self.port}",
                    f"HostKey {self.private / 'host_key'}",
                    f"PidFile {self.private / 'sshd.pid'}",
                    f"AuthorizedKeysFile {self.authorized_keys_file}",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "MaxSessions 64",
                    "PermitRootLogin prohibit-password",
                    f"AllowUsers {' '.join(self.allow_users)}",
                    "Subsystem sftp internal-sftp",
                    "",
                ]
            )
        )
        self.known_hosts.write_text(_known_hosts_line(self.port, self.host_key))
        self._log = open(self.private / "sshd.log", "wb")  # noqa: SIM115
        self._proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)], stdout=self._log, stderr=subprocess.STDOUT
        )
        proc = self._proc

        def listening() -> bool:
            if proc.poll() is not None:
                raise RuntimeError((self.private / "sshd.log").read_text())
            with socket.create_connection(("127.0.0.1", self.port)):
                return True

        wait_for(
            listening, timeout_s=10, interval_s=0.02, ignoring=(OSError,), what="sshd to listen"
        )

    def stop(self) -> None:
        """Stop sshd, kill what the tests left running, remove the test's job dirs."""
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)
            self._proc = None
            self._log.close()
        kill_marked(self.token)
        home = Path(pwd.getpwnam(self.user).pw_dir)
        shutil.rmtree(home / ".gpusched-tests" / self.token, ignore_errors=True)
        shutil.rmtree(self.private, ignore_errors=True)

    def node_config(self, name: str = "sshd0", **overrides: Any) -> NodeConfig:
        """How the backend reaches this sshd, with the fake nvidia-smi first on PATH."""
        fields: dict[str, Any] = {
            "name": name,
            "host": "127.0.0.1",
            "port": self.port,
            "username": self.user,
            "client_keys": (str(self.client_key_path),),
            "known_hosts": str(self.known_hosts),
            "python": self.python,
            "workdir": self.workdir,
            "env": {
                "PATH": f"{self.bindir}:/usr/local/bin:/usr/bin:/bin",
                "PYTHONPATH": str(REPO_ROOT),
                "PYTHONDONTWRITEBYTECODE": "1",
                "FAKE_NVIDIA_SMI_STATE": str(self.state_path),
                "GPUSCHED_TEST_RUN": self.token,
            },
        }
        fields.update(overrides)
        return NodeConfig(**fields)


@contextlib.contextmanager
def running_sshd() -> Iterator[Sshd]:
    """A started :class:`Sshd` in a fresh world-readable directory, stopped afterwards."""
    directory = world_readable_dir("gpusched-sshd-")
    sshd = Sshd(directory)
    try:
        sshd.start()
        yield sshd
    finally:
        sshd.stop()
        shutil.rmtree(directory, ignore_errors=True)


def script_job(job_id: int, command: list[str], clock: ManualClock, **spec: Any) -> Job:
    """A script job as the scheduler would hand it to the backend."""
    return Job(
        id=job_id, spec=JobSpec(kind="script", command=command, **spec), submitted_at=clock.now()
    )


async def ended(backend: SshBackend, job: Job) -> JobStatus:
    """Poll until the job ended (20 s at most); its final status."""
    return await wait_for_async(
        lambda: backend.poll(job),
        lambda status: not status.running,
        timeout_s=20,
        what=f"job {job.id} to end",
    )


async def launched(backend: SshBackend, job: Job, placement: Placement) -> Job:
    """Launch ``job`` at ``placement``; the job as the store would then hold it."""
    result = await backend.launch(job, placement)
    return job.model_copy(update={"handle": result.handle, "placement": placement})


async def check_a_fresh_backend_reattaches(
    backend: SshBackend, node: NodeConfig, clock: ManualClock, first_id: int,
    placements: tuple[Placement, Placement],
) -> None:  # fmt: skip
    """A running and a finished job, then a new backend (a restarted server) finds both."""
    running = await launched(backend, script_job(first_id, ["sleep", "60"], clock), placements[0])
    finished = await launched(
        backend, script_job(first_id + 1, ["sh", "-c", "exit 5"], clock), placements[1]
    )
    await ended(backend, finished)
    await backend.close()
    fresh = SshBackend([node], clock=clock)
    try:
        assert (await fresh.poll(running)).running
        assert (await fresh.poll(finished)).exit_code == 5
        await fresh.cancel(running, grace_s=1)
        assert (await fresh.poll(running)).exit_code == -15
    finally:
        await fresh.close()
