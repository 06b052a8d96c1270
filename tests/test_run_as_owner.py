"""Jobs run as their owners on a real node: Debian's OpenSSH, real users alice and bob.

Both ways of running as the owner: ``sudo`` (the scheduler's own login, ``sudo -n -u OWNER``
limited by one sudoers line to the agent) and ``ssh`` (a key per user). Each job's log shows
its owner's uid; its job dir is the owner's and private; bob's job can neither read alice's
job dir nor her lease kernel's connection file, nor talk to her kernel (the exploits of issue
#14, kept as regressions); an owner who cannot run on the node is refused with the reason.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import pwd
import stat
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
import pytest_asyncio
from _fixtures_notebooks import outputs_text, write_notebook
from _fixtures_owners import NODE, OwnersNode, owners_node
from _fixtures_polling import Deadline
from _fixtures_service import ServiceProcess
from _fixtures_ssh import ended, gpu_state
from _fixtures_users import unix_users, user_python
from jupyter_client.asynchronous import AsyncKernelClient

from jupyter_gpusched.cluster.ssh import SshBackend
from jupyter_gpusched.core.clock import ManualClock, SystemClock
from jupyter_gpusched.core.errors import AccountError
from jupyter_gpusched.core.models import Job, JobSpec, Placement
from jupyter_gpusched.leases.bridge import connection_file_name, lease_command
from jupyter_gpusched.node.kernel import PORT_KEYS
from jupyter_gpusched.store import tokens
from jupyter_gpusched.store.store import Store

__all__ = ["owners_node", "unix_users", "user_python"]

pytestmark = [pytest.mark.sshd, pytest.mark.slow]

UUIDS = [g["uuid"] for g in gpu_state(2)["gpus"]]
ON_GPU0 = Placement(node=NODE, gpu_indices=[0], gpu_uuids=[UUIDS[0]])

#: What bob's job tries against alice's (and, as a control, alice's own job does): read her
#: job's log and her kernel's connection file, list her job dir, and ask her kernel for
#: kernel_info -- with the keys from the connection file when it could read it.
PROBE = """\
import json, os, sys
import zmq
from jupyter_client.session import Session

job_dir, conn_file, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
print("uid", os.getuid())
info = {}
for name, path in (("log", os.path.join(job_dir, "output.log")), ("connection", conn_file)):
    try:
        with open(path) as f:
            text = f.read()
        print("read", name)
        if name == "connection":
            info = json.loads(text)
    except PermissionError:
        print("denied", name)
try:
    os.listdir(job_dir)
    print("listed job dir")
except PermissionError:
    print("denied job dir")
sock = zmq.Context.instance().socket(zmq.DEALER)
sock.linger = 0
sock.sndtimeo = 3000  # without a completed handshake there is no peer, and send would block
if info.get("curve_publickey"):
    sock.curve_serverkey = info["curve_publickey"].encode()
    sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
sock.connect(f"tcp://127.0.0.1:{port}")
try:
    Session(key=info.get("key", "guessed").encode()).send(sock, "kernel_info_request", {})
    replied = sock.poll(3000)
except zmq.Again:
    replied = False
sock.close(linger=0)  # an open socket would keep the context's teardown waiting at exit
print("kernel replied" if replied else "kernel did not reply", flush=True)
"""


@pytest.fixture(params=["sudo", "ssh"])
def run_as(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest_asyncio.fixture
async def backend(
    owners_node: OwnersNode, run_as: str, clock: ManualClock
) -> AsyncIterator[SshBackend]:
    b = SshBackend([owners_node.node_config(run_as)], clock=clock)
    yield b
    await b.close()


_ids = iter(range(1000, 1_000_000))


def job_of(user: str, clock: ManualClock, **spec: Any) -> Job:
    """A job of ``user`` as the scheduler would hand it to the backend (fresh id each)."""
    return Job(id=next(_ids), spec=JobSpec(user=user, **spec), submitted_at=clock.now())


async def run_to_end(backend: SshBackend, job: Job, argv: list[str] | None = None) -> bytes:
    """Launch ``job`` on GPU 0, wait until it ended with 0; its log."""
    result = await backend.launch(job, ON_GPU0, argv=argv)
    job = job.model_copy(update={"handle": result.handle, "placement": ON_GPU0})
    try:
        status = await ended(backend, job)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; its log: {await backend.read_log(job)!r}") from None
    log = await backend.read_log(job)
    assert status.exit_code == 0, log
    return log


@pytest.mark.asyncio
async def test_owners_taking_turns_for_one_serving_agent_each_run_as_themselves(
    owners_node: OwnersNode, run_as: str, clock: ManualClock
) -> None:
    # max_channels 5 leaves room for one serving agent: each owner's launch closes the other's
    backend = SshBackend([owners_node.node_config(run_as, max_channels=5)], clock=clock)
    try:
        for user in ("alice", "bob", "alice", "bob"):
            job = job_of(user, clock, kind="script", command=["id", "-un"])
            assert (await run_to_end(backend, job)).decode() == f"{user}\n"
            assert list(backend._nodes[NODE].agents) == [user]  # one, the last owner's
        assert backend._nodes[NODE].serving  # closing one to make room is not "cannot serve"
        # at once: the one serving agent answers one owner, the other gets a fresh agent
        jobs = [job_of(u, clock, kind="script", command=["id", "-un"]) for u in ("alice", "bob")]
        logs = await asyncio.gather(*(run_to_end(backend, job) for job in jobs))
        assert [log.decode() for log in logs] == ["alice\n", "bob\n"]
    finally:
        await backend.close()


def owner_and_mode(path: str | Path) -> tuple[str, int]:
    info = os.stat(path)
    return pwd.getpwuid(info.st_uid).pw_name, stat.S_IMODE(info.st_mode)


@pytest.mark.asyncio
async def test_each_job_runs_as_its_owner_in_a_private_job_dir(
    backend: SshBackend, owners_node: OwnersNode, clock: ManualClock, tmp_path: Path
) -> None:
    script = tmp_path / "job.sh"
    script.write_text('id -u; id -un; stat -c "%a %U %n" . job.sh data.txt\n')
    script.chmod(0o755)
    data = tmp_path / "data.txt"
    data.write_text("x\n")
    data.chmod(0o644)
    for user in ("alice", "bob"):
        job = job_of(
            user, clock, kind="script", command=["sh", "job.sh"], files=[str(script), str(data)]
        )
        log = (await run_to_end(backend, job)).decode().splitlines()
        uid = owners_node.users[user].uid
        # the staged script keeps its owner's bits (still executable), the data file too;
        # nobody else gets any
        assert log == [
            str(uid),
            user,
            f"700 {user} .",
            f"700 {user} job.sh",
            f"600 {user} data.txt",
        ]
        [job_dir] = owners_node.job_dirs(user).glob(f"{job.id}.*")
        assert owner_and_mode(job_dir) == (user, 0o700)
        assert owner_and_mode(job_dir / "output.log") == (user, 0o600)
        assert owner_and_mode(job_dir.parent) == (user, 0o700)


async def _kernel_client_uid(backend: SshBackend, info: dict[str, Any]) -> str:
    """Run ``os.getuid()`` in the kernel through forwarded ports, as its owner's client would."""
    targets = [("127.0.0.1", info[k], 0) for k in PORT_KEYS]
    forwards = await backend.forward_local_ports(NODE, targets)
    local = {
        **info,
        "ip": "127.0.0.1",
        **{k: f.local_port for k, f in zip(PORT_KEYS, forwards, strict=True)},
    }
    kc = AsyncKernelClient()
    kc.load_connection_info(local)
    kc.start_channels()
    out: list[str] = []
    try:
        await kc.wait_for_ready(timeout=30)
        await kc.execute_interactive(
            "import os; print(os.getuid())",
            output_hook=lambda m: out.append(m["content"].get("text", "")),
            timeout=30,
        )
    finally:
        kc.stop_channels()
        for f in forwards:
            f.close()
        await forwards[0].wait_closed()  # one forwarder carries them all
    return "".join(out).strip()


@pytest.mark.asyncio
async def test_bob_can_neither_read_alices_job_nor_use_her_kernel(
    backend: SshBackend, owners_node: OwnersNode, clock: ManualClock, tmp_path: Path
) -> None:
    python = str(owners_node.python.python)
    lease = job_of("alice", clock, kind="lease")
    result = await backend.launch(lease, ON_GPU0, argv=lease_command(lease, python))
    lease = lease.model_copy(update={"handle": result.handle, "placement": ON_GPU0})
    job_dir = lease.handle["job_dir"]
    conn_file = f"{job_dir}/{connection_file_name(lease)}"
    try:
        info = await backend.kernel_connection(lease, conn_file, timeout_s=30)
        assert owner_and_mode(conn_file) == ("alice", 0o600)
        assert info["curve_secretkey"]  # the kernel's sockets are CurveZMQ-encrypted
        # her kernel runs as her, and her own client reaches it through the server's forwards
        assert await _kernel_client_uid(backend, info) == str(owners_node.users["alice"].uid)

        probe = tmp_path / "probe.py"
        probe.write_text(PROBE)
        argv = [python, "probe.py", job_dir, conn_file, str(info["shell_port"])]
        logs = {}
        for user in ("bob", "alice"):  # alice's run is the control: the probe can succeed
            job = job_of(user, clock, kind="script", command=argv, files=[str(probe)])
            logs[user] = (await run_to_end(backend, job)).decode().splitlines()
    finally:
        await backend.cancel(lease, grace_s=2)
        await backend.remove_file(lease, conn_file)
    assert logs["bob"] == [
        f"uid {owners_node.users['bob'].uid}",
        "denied log",
        "denied connection",
        "denied job dir",
        "kernel did not reply",
    ]
    assert logs["alice"] == [
        f"uid {owners_node.users['alice'].uid}",
        "read log",
        "read connection",
        "listed job dir",
        "kernel replied",
    ]
    assert not os.path.exists(conn_file)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("user", "sudo_reason", "ssh_reason"),
    [
        ("nosuch", "sudo: unknown user nosuch", "no usable SSH key for nosuch"),
        # carol is an account of the node, but the sudoers line does not name her group,
        # and the admin gave her no key here
        ("carol", "sudo: a password is required", "SSH login as carol failed"),
        ("#0", "'#0' is not a valid Unix account name", "'#0' is not a valid Unix account name"),
        ("root", "jobs never run as root", "jobs never run as root"),
    ],
)
async def test_an_owner_who_cannot_run_on_the_node_is_refused_with_the_reason(
    backend: SshBackend,
    owners_node: OwnersNode,
    run_as: str,
    clock: ManualClock,
    user: str,
    sudo_reason: str,
    ssh_reason: str,
) -> None:
    carol_key = owners_node.keys / "carol"
    hidden = carol_key.with_suffix(".away")
    if run_as == "ssh" and user == "carol":
        # a key whose public half the node does not list for carol
        carol_key.rename(hidden)
        import asyncssh

        asyncssh.generate_private_key("ssh-ed25519").write_private_key(carol_key)
    try:
        job = job_of(user, clock, kind="script", command=["id", "-u"])
        with pytest.raises(AccountError) as info:
            await backend.launch(job, ON_GPU0)
    finally:
        if hidden.exists():
            hidden.replace(carol_key)
    assert (sudo_reason if run_as == "sudo" else ssh_reason) in info.value.message
    # never the scheduler's own account instead, and the node is not blamed
    scheduler_jobs = Path(pwd.getpwnam(owners_node.sshd.user).pw_dir) / ".gpusched-tests"
    assert not list(scheduler_jobs.glob(f"{owners_node.sshd.token}/jobs/{job.id}.*"))
    assert not backend.node_down(NODE) and backend.node_error(NODE) is None
    assert (await backend.run(NODE, ["true"])).exit_status == 0


# ---------------------------------------------------------------------------- the lab service


def _wait(service: ServiceProcess, job_id: int, token: str, *states: str) -> dict[str, Any]:
    deadline = Deadline(60)
    while True:
        job = service.api("GET", f"jobs/{job_id}", token=token)
        if job["state"] in states:
            return dict(job)
        assert not deadline.expired(), job
        time.sleep(0.1)


def _text(service: ServiceProcess, path: str, token: str) -> str:
    req = urllib.request.Request(
        f"{service.url}gpusched/api/{path}", headers={"Authorization": f"token {token}"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return str(resp.read().decode())


def _log(service: ServiceProcess, job_id: int, token: str) -> str:
    return _text(service, f"jobs/{job_id}/log", token)


def test_the_lab_service_runs_each_users_jobs_as_them_and_shows_others_no_secrets(
    owners_node: OwnersNode, tmp_path: Path
) -> None:
    service = ServiceProcess(
        tmp_path, nodes=[owners_node.node_entry()], run_as="sudo", admins=("carol",)
    )
    service.start()
    try:
        # minted in this process: a CLI start per token costs seconds on a busy machine
        store = Store(f"sqlite:///{tmp_path / 'gpusched.db'}", clock=SystemClock())
        alice, bob, dave = (tokens.mint(store, u) for u in ("alice", "bob", "dave"))
        store.close()
        carol = service.admin_token
        upload = {"name": "notes.txt", "content_base64": base64.b64encode(b"hers\n").decode()}
        job = service.api(
            "POST",
            "jobs",
            {
                "kind": "script",
                "command": ["sh", "-c", "id -un; cat notes.txt"],
                "env": {"WANDB_API_KEY": "s3cret"},
                "uploads": [upload],
            },
            token=alice,
        )
        _wait(service, job["id"], alice, "succeeded")
        assert _log(service, job["id"], alice) == "alice\nhers\n"
        seen = service.api("GET", f"jobs/{job['id']}", token=bob)
        assert (seen["spec"]["env"], seen["handle"], seen["redacted"]) == (
            {"WANDB_API_KEY": "<hidden>"},
            {},
            True,
        )
        job_dir = service.api("GET", f"jobs/{job['id']}", token=carol)["handle"]["job_dir"]
        snoop = service.api(
            "POST",
            "jobs",
            {"kind": "script", "command": ["sh", "-c", f"id -un; cat {job_dir}/notes.txt; true"]},
            token=bob,
        )
        _wait(service, snoop["id"], bob, "succeeded")
        said = _log(service, snoop["id"], bob).splitlines()
        assert said[0] == "bob" and "Permission denied" in said[1], said
        # a notebook runs as its owner too, and its outputs come back for her alone
        nb = write_notebook(
            tmp_path / "nb.ipynb",
            ["import getpass; print(getpass.getuser(), TOKEN)"],
            parameters="TOKEN = ''",
        )
        body = {"notebook": "nb.ipynb", "content": json.loads(nb.read_text())}
        posted = service.api(
            "POST", "notebooks", {**body, "parameters": {"TOKEN": "pw"}}, token=alice
        )
        nb_id = posted["job"]["id"]
        deadline = Deadline(90)
        while not service.api("GET", f"jobs/{nb_id}", token=alice)["outputs"]:
            assert not deadline.expired(), service.api("GET", f"jobs/{nb_id}", token=alice)
            time.sleep(0.2)
        executed = nbformat.reads(_text(service, f"jobs/{nb_id}/output", alice), as_version=4)
        assert outputs_text(executed.cells[-1]) == "alice pw\n"
        seen = service.api("GET", f"jobs/{nb_id}", token=bob)
        assert (seen["outputs"], seen["spec"]["parameters"]) == (None, {})
        with pytest.raises(urllib.error.HTTPError) as refused:
            _text(service, f"jobs/{nb_id}/output", bob)
        assert refused.value.code == 403
        refused.value.close()
        # an owner with no account on the node: failed at once, never run as the scheduler
        orphan = service.api("POST", "jobs", {"kind": "script", "command": ["id"]}, token=dave)
        failed = _wait(service, orphan["id"], dave, "failed", "succeeded")
        assert failed["state"] == "failed" and "sudo: unknown user dave" in failed["reason"]
    finally:
        service.stop()
