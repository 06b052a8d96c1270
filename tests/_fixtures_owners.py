"""A node where jobs run as their owners: Debian's sshd, real users alice/bob/carol, sudo.

``owners_node`` (module scope) is one sshd on loopback. The scheduler's account
(``gpusched-test``, as in ``test_sshd``) and alice, bob and carol may log in, each with a key
of their own: the per-user keys of ``run_as="ssh"`` are ``<private>/keys/{user}``. A sudoers
drop-in holds the README's one line: the scheduler's account may run the agent's entry point
(a root-owned script here) as members of ``gpusched-users`` -- alice and bob, not carol.

Needs root (users, sudoers), Debian's sudo and sshd; skips otherwise and says why.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncssh
import pytest
from _fixtures_ssh import SSHD, Sshd, gpu_state, world_readable_dir
from _fixtures_users import UnixUser, UserPython

from jupyter_gpusched.cluster.ssh import NodeConfig

SUDO = "/usr/bin/sudo"
SUDO_GROUP = "gpusched-users"
#: Who the sudoers line lets the scheduler run the agent as (carol is left out on purpose).
SUDO_MEMBERS = ("alice", "bob")
NODE = "owners0"


def sudoers_line(scheduler: str, agent: str, group: str = SUDO_GROUP) -> str:
    """The README's line: the scheduler's account runs the agent, and only it, as a member."""
    return f"{scheduler} ALL=(%{group}) NOPASSWD: {agent}\n"


class OwnersNode:
    """The sshd, the users' keys, the agent's entry point and the sudoers drop-in."""

    def __init__(
        self,
        sshd: Sshd,
        python: UserPython,
        users: dict[str, UnixUser],
        *,
        group: str = SUDO_GROUP,
    ) -> None:
        self.sshd = sshd
        self.python = python
        self.users = users
        self.group = group  # the sudoers line's group: alice and bob are in it
        self.keys = sshd.private / "keys"
        self.agent = sshd.dir / "agent" / "gpusched-agent"
        self.sudoers = Path(f"/etc/sudoers.d/gpusched_test_{sshd.token}")

    def setup(self) -> None:
        """Keys for every login, the agent script, the group and the sudoers line."""
        authorized = self.sshd.dir / "authorized"
        authorized.mkdir(mode=0o755)
        shutil.copy(self.sshd.dir / "authorized_keys", authorized / self.sshd.user)
        self.keys.mkdir(mode=0o700)
        for name in self.users:
            key = asyncssh.generate_private_key("ssh-ed25519")
            key.write_private_key(self.keys / name)
            (self.keys / name).chmod(0o600)
            # as the README says: the owner's key only runs commands (no forwarding, no pty)
            (authorized / name).write_bytes(b"restrict " + key.export_public_key("openssh"))
        for path in authorized.iterdir():
            path.chmod(0o644)
        self.sshd.authorized_keys_file = f"{authorized}/%u"
        self.sshd.allow_users = [self.sshd.user, *self.users]
        self.sshd.state_path.write_text(json.dumps(gpu_state(2)))
        self.sshd.state_path.chmod(0o644)
        # the entry point a lab installs (the gpusched-agent console script), root's, 0755
        self.agent.parent.mkdir(mode=0o755)
        self.agent.write_text(
            f"#!{self.python.python}\nimport sys\n\n"
            "from jupyter_gpusched.node.agent import main\n\nsys.exit(main())\n"
        )
        self.agent.chmod(0o755)
        subprocess.run(["groupadd", "-f", self.group], check=True)
        members = grp.getgrnam(self.group).gr_mem
        for name in SUDO_MEMBERS:
            if name not in members:
                self.set_member(name, True)
        if "carol" in members:
            self.set_member("carol", False)
        draft = self.sshd.private / "sudoers"
        draft.write_text(sudoers_line(self.sshd.user, str(self.agent), self.group))
        subprocess.run(["visudo", "-cqf", str(draft)], check=True)
        draft.chmod(0o440)
        shutil.move(draft, self.sudoers)  # sudo reads drop-ins whose names have no '.'

    def set_member(self, name: str, member: bool) -> None:
        """Put ``name`` in the sudoers line's group, or take them out (as an admin would)."""
        flag = "-a" if member else "-d"
        subprocess.run(["gpasswd", flag, name, self.group], check=True, capture_output=True)

    def stop(self) -> None:
        """Remove the sudoers line and the users' job dirs (sshd.stop kills the jobs)."""
        self.sudoers.unlink(missing_ok=True)
        for user in self.users.values():
            shutil.rmtree(user.home / ".gpusched-tests" / self.sshd.token, ignore_errors=True)

    def node_config(self, run_as: str, **overrides: Any) -> NodeConfig:
        """The node as the scheduler sees it, jobs run as their owners by ``run_as``."""
        fields: dict[str, Any] = {
            "python": str(self.python.python),
            "agent_cmd": (str(self.agent),),
            "run_as": run_as,
            "user_key_file": str(self.keys / "{user}"),
            "sudo": SUDO,
        }
        return self.sshd.node_config(NODE, **{**fields, **overrides})

    def node_entry(self) -> dict[str, Any]:
        """The node as a ``GpuSchedApp.nodes`` entry (run_as and keys are app traits)."""
        cfg = self.node_config("service")
        return {
            "name": cfg.name,
            "host": cfg.host,
            "port": cfg.port,
            "username": cfg.username,
            "key_file": cfg.client_keys[0],
            "known_hosts": cfg.known_hosts,
            "python": cfg.python,
            "agent": str(self.agent),
            "workdir": cfg.workdir,
            "env": dict(cfg.env),
        }

    def job_dirs(self, user: str) -> Path:
        """Where ``user``'s job dirs are on the node."""
        return self.users[user].home / ".gpusched-tests" / self.sshd.token / "jobs"


def skip_reason() -> str | None:
    """Why these tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root: real users, a sudoers drop-in"
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} missing: install openssh-server (scripts/system-deps.sh)"
    if not os.access(SUDO, os.X_OK) or not shutil.which("visudo"):
        return f"{SUDO} missing: install Debian's sudo (scripts/system-deps.sh)"
    return None


@contextlib.contextmanager
def running_owners_node(
    python: UserPython, users: dict[str, UnixUser], *, group: str = SUDO_GROUP
) -> Iterator[OwnersNode]:
    """A started :class:`OwnersNode`, torn down afterwards (its sudoers line names ``group``)."""
    directory = world_readable_dir("gpusched-owners-")
    sshd = Sshd(directory)
    node = OwnersNode(sshd, python, users, group=group)
    try:
        node.setup()
        sshd.start()
        yield node
    finally:
        node.stop()
        sshd.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def owners_node(unix_users: dict[str, UnixUser], user_python: UserPython) -> Iterator[OwnersNode]:
    """One node per test module where alice's and bob's jobs run as alice and bob."""
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    with running_owners_node(user_python, unix_users) as node:
        yield node
