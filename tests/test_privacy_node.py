"""What other users of a node learn of a job, and whom sudo still runs: issue #30 on a real node.

Debian's sshd, real users alice, bob and carol, jobs run as their owners through sudo (one
sudoers line naming a group of this module's own, so taking bob out of it touches no other
test's node). While alice's notebook job with a secret parameter and her script job with a
secret env value run, bob's ``ps`` shows neither, nor may he read the job's environment; the
jobs get both. The executed notebook's kernel spoke over private Unix sockets (no "TCP
without encryption" warning) and made its folders 0700. A user taken out of the group has his
next job refused at once, with sudo's answer, by the serving agent that ran his jobs so far.
"""

from __future__ import annotations

import pwd
import stat
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
import pytest_asyncio
from _fixtures_notebooks import outputs_text, write_notebook
from _fixtures_owners import NODE, OwnersNode, running_owners_node, skip_reason
from _fixtures_polling import wait_for_async
from _fixtures_ssh import ended, gpu_state
from _fixtures_users import UnixUser, UserPython, shared_tempdir, unix_users, user_python

from jupyter_gpusched.batch.requests import notebook_command, remote_output_name
from jupyter_gpusched.cluster.ssh import SshBackend
from jupyter_gpusched.core.clock import ManualClock
from jupyter_gpusched.core.errors import AccountError
from jupyter_gpusched.core.models import Job, JobSpec, Placement

__all__ = ["unix_users", "user_python"]

pytestmark = [pytest.mark.sshd, pytest.mark.slow]

ON_GPU0 = Placement(node=NODE, gpu_indices=[0], gpu_uuids=[gpu_state(2)["gpus"][0]["uuid"]])
NB_SECRET, ENV_SECRET = "nb-param-0f3a9c", "env-value-7d21e4"


@pytest.fixture(scope="module")
def node(unix_users: dict[str, UnixUser], user_python: UserPython) -> Iterator[OwnersNode]:
    """A node whose sudoers line names a group of this module's (alice and bob in it)."""
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    group = f"gpusched-p{uuid.uuid4().hex[:8]}"
    try:
        with running_owners_node(user_python, unix_users, group=group) as node:
            yield node
    finally:
        subprocess.run(["groupdel", group], capture_output=True)


@pytest_asyncio.fixture
async def backend(node: OwnersNode, clock: ManualClock) -> AsyncIterator[SshBackend]:
    b = SshBackend([node.node_config("sudo")], clock=clock)
    yield b
    await b.close()


_ids = iter(range(5000, 1_000_000))


def job_of(user: str, clock: ManualClock, **spec: Any) -> Job:
    return Job(id=next(_ids), spec=JobSpec(user=user, **spec), submitted_at=clock.now())


async def launched(backend: SshBackend, job: Job, argv: list[str] | None = None) -> Job:
    result = await backend.launch(job, ON_GPU0, argv=argv)
    return job.model_copy(update={"handle": result.handle, "placement": ON_GPU0})


async def log_shows(backend: SshBackend, job: Job, text: str) -> str:
    """Wait until the job's log holds ``text``; the log."""
    return str(
        await wait_for_async(
            lambda: backend.read_log(job),
            lambda log: text.encode() in log,
            timeout_s=60,
            what=f"job {job.id}'s log to show {text!r}",
        )
    )


def owner_and_mode(path: Path) -> tuple[str, int]:
    info = path.stat()
    return pwd.getpwuid(info.st_uid).pw_name, stat.S_IMODE(info.st_mode)


@pytest.mark.asyncio
async def test_a_secret_parameter_and_env_value_reach_the_job_but_no_command_line(
    backend: SshBackend, node: OwnersNode, clock: ManualClock, tmp_path: Path
) -> None:
    release = shared_tempdir("gpusched-release-")
    go = release / "go"  # the jobs wait for it: ps looks while they run
    wait = f"while [ ! -e {go} ]; do sleep 0.05; done"
    kernel_home = node.job_dirs("alice").parent / f"kernel-home-{uuid.uuid4().hex[:8]}"
    nb = write_notebook(
        tmp_path / "secret.ipynb",
        [
            "print('key', API_KEY, flush=True)",
            f"import subprocess; subprocess.run(['sh', '-c', {wait!r}], timeout=120)",
            "from ipykernel.kernelapp import IPKernelApp as K\n"
            "print('transport', K.instance().transport)",
        ],
        parameters="API_KEY = ''",
    )
    notebook = job_of(
        "alice",
        clock,
        kind="notebook",
        notebook="secret.ipynb",
        files=[str(nb)],
        parameters={"API_KEY": NB_SECRET},
        # the folders a kernel makes in its home: fresh ones here, so that it makes them
        env={"IPYTHONDIR": f"{kernel_home}/ipython", "JUPYTER_RUNTIME_DIR": f"{kernel_home}/rt"},
    )
    command = ["sh", "-c", f'echo "env $WANDB_API_KEY"; {wait}']
    script = job_of(
        "alice", clock, kind="script", command=command, env={"WANDB_API_KEY": ENV_SECRET}
    )
    python = str(node.python.python)
    try:
        notebook = await launched(backend, notebook, notebook_command(notebook, python=python))
        script = await launched(backend, script)
        await log_shows(backend, notebook, f"key {NB_SECRET}")
        await log_shows(backend, script, f"env {ENV_SECRET}")

        # what bob sees of the node while they run: the jobs, not their secrets
        bob = node.users["bob"]
        seen = bob.run(["ps", "-eo", "user,args"]).stdout
        assert "jupyter_gpusched.node.nbrun" in seen and "WANDB_API_KEY" in seen, seen
        assert NB_SECRET not in seen and ENV_SECRET not in seen, seen
        job_pid = str(script.handle["pgid"])  # the job's own process: its env holds the value
        assert ENV_SECRET in node.users["alice"].run(["cat", f"/proc/{job_pid}/environ"]).stdout
        peek = bob.run(["cat", f"/proc/{job_pid}/environ"], check=False)
        assert peek.returncode != 0 and "Permission denied" in peek.stderr
        job_dir = Path(notebook.handle["job_dir"])
        assert owner_and_mode(job_dir / "parameters.json") == ("alice", 0o600)
    finally:
        go.touch()
    for job in (notebook, script):
        status = await ended(backend, job)
        assert status.exit_code == 0, await backend.read_log(job)

    executed = tmp_path / "executed.ipynb"
    remote = job_dir / remote_output_name(notebook.spec)
    await backend.fetch_file(notebook, str(remote), str(executed))
    assert owner_and_mode(remote) == ("alice", 0o600)
    text = executed.read_text()
    assert "without encryption" not in text and "TCP" not in text
    cells = nbformat.reads(text, as_version=4).cells
    assert outputs_text(cells[-1]) == "transport ipc\n"
    assert f"key {NB_SECRET}" in outputs_text(cells[-3])
    # the folders its kernel made in its home (here fresh ones, under IPYTHONDIR and
    # JUPYTER_RUNTIME_DIR) are hers alone, whatever the job's umask
    for made in (kernel_home, kernel_home / "ipython", kernel_home / "rt"):
        assert owner_and_mode(made) == ("alice", 0o700), made


@pytest.mark.asyncio
async def test_a_user_taken_out_of_the_sudo_group_has_his_next_job_refused_at_once(
    backend: SshBackend, node: OwnersNode, clock: ManualClock
) -> None:
    async def run(user: str) -> str:
        job = await launched(backend, job_of(user, clock, kind="script", command=["id", "-un"]))
        assert (await ended(backend, job)).exit_code == 0
        return (await backend.read_log(job)).decode()

    assert await run("bob") == "bob\n"
    agent = backend._nodes[NODE].agents["bob"]  # his serving agent, kept for his next jobs
    node.set_member("bob", False)
    try:
        refused = job_of("bob", clock, kind="script", command=["id", "-un"])
        started = time.monotonic()
        with pytest.raises(AccountError) as info:
            await backend.launch(refused, ON_GPU0)
        took_s = time.monotonic() - started
    finally:
        node.set_member("bob", True)
    assert took_s < 5.0  # at once: no retry, no timeout
    assert info.value.message.startswith(f"node {NODE}: cannot run as bob through sudo (")
    assert "no longer let the scheduler's account run the agent as bob" in info.value.message
    assert not list(node.job_dirs("bob").glob(f"{refused.id}.*"))  # nothing was launched
    assert backend._nodes[NODE].agents["bob"] is agent  # still answering for his running jobs
    # back in the group, he runs again; alice, never out, ran all along
    assert await run("bob") == "bob\n"
    assert await run("alice") == "alice\n"


@pytest.mark.asyncio
async def test_launches_on_a_node_whose_accounts_keep_still_ask_sudo_only_once(
    backend: SshBackend, node: OwnersNode, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[list[str]] = []
    run = backend.run

    async def counting(name: str, argv: Any, **kw: Any) -> Any:
        if "-l" in argv:
            asked.append(list(argv))
        return await run(name, argv, **kw)

    monkeypatch.setattr(backend, "run", counting)
    for _ in range(5):
        await launched(backend, job_of("alice", clock, kind="script", command=["true"]))
    # once, before the first launch of the serving agent sudo started; then a stat per launch
    assert len(asked) == 1, asked
    assert asked[0][:6] == [node.node_config("sudo").sudo, "-n", "-l", "-u", "alice", "--"]
