"""How a node is reached over SSH, and what remote commands and forwards give back."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

#: Whose account a job's commands run as on its node: the scheduler's own (``service``, one
#: person's cluster), the owner's through a per-user SSH key (``ssh``), or the owner's through
#: ``sudo -n -u OWNER`` limited to the agent (``sudo``).
RunAs = Literal["service", "ssh", "sudo"]
RUN_AS_MODES: tuple[str, ...] = ("service", "ssh", "sudo")
#: A name that can be a Unix account (the portable set; no '#uid' or '%group' forms for sudo).
_ACCOUNT = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?")


def check_account(user: str) -> str | None:
    """Why ``user`` cannot be a job's account on a node, or None when it can."""
    if not _ACCOUNT.fullmatch(user):
        return (
            f"{user!r} is not a valid Unix account name (letters, digits, '_', '.', '-'; "
            "at most 32; not starting with a digit or '-')"
        )
    if user == "root":
        return "jobs never run as root"
    return None


@dataclass(frozen=True)
class NodeConfig:
    """How to reach one GPU node and run the agent there."""

    name: str  # the node's name in the scheduler (placements name it)
    host: str
    port: int = 22
    username: str | None = None  # None: the local user's name
    client_keys: tuple[str, ...] = ()  # private key files; empty: ~/.ssh defaults and the agent
    known_hosts: str | None = None  # None: ~/.ssh/known_hosts; checking is never switched off
    python: str = "python3"  # interpreter on the node that can import jupyter_gpusched
    agent_cmd: tuple[str, ...] | None = (
        None  # default: (python, "-m", "jupyter_gpusched.node.agent")
    )
    workdir: str = "~/.gpusched"  # per-job dirs live under <workdir>/jobs on the node
    staging: Literal["sftp", "shared"] = "sftp"  # shared: the node sees the same filesystem
    max_channels: int = 8  # concurrent SSH channels (OpenSSH's MaxSessions defaults to 10)
    env: Mapping[str, str] = field(default_factory=dict)  # set for every remote command
    run_as: RunAs = "service"  # whose account runs a job's commands (see RunAs)
    user_key_file: str | None = None  # ssh mode: each owner's private key, "{user}" in the path
    sudo: str = "sudo"  # sudo mode: the node's sudo

    def __post_init__(self) -> None:
        if self.run_as not in RUN_AS_MODES:
            raise ValueError(
                f"node {self.name}: run_as must be one of {list(RUN_AS_MODES)}, not {self.run_as!r}"
            )
        if self.run_as == "ssh" and "{user}" not in (self.user_key_file or ""):
            raise ValueError(
                f"node {self.name}: run_as 'ssh' needs user_key_file, a path with {{user}} in "
                "it (e.g. /etc/gpusched/keys/{user}) where each user's private key is"
            )
        if self.run_as == "sudo" and not os.path.isabs(self.agent_argv()[0]):
            raise ValueError(
                f"node {self.name}: run_as 'sudo' runs the agent by absolute path (the one the "
                "sudoers line names); set the node's agent, e.g. "
                "'/opt/gpusched/bin/gpusched-agent'"
            )
        if self.staging not in ("sftp", "shared"):
            raise ValueError(
                f"node {self.name}: staging must be 'sftp' or 'shared', not {self.staging!r}"
            )
        if self.max_channels < 1:
            raise ValueError(
                f"node {self.name}: max_channels must be >= 1, not {self.max_channels}"
            )

    def agent_argv(self) -> tuple[str, ...]:
        """The argv prefix that runs the agent on this node."""
        return self.agent_cmd or (self.python, "-m", "jupyter_gpusched.node.agent")

    def key_file_of(self, user: str) -> str:
        """The private key the scheduler logs in to this node with as ``user`` (ssh mode)."""
        assert self.user_key_file is not None
        return os.path.expanduser(self.user_key_file.replace("{user}", user))

    def known_hosts_path(self) -> str:
        """The known_hosts file host keys are checked against."""
        return os.path.expanduser(self.known_hosts or "~/.ssh/known_hosts")


class RemoteResult(NamedTuple):
    """A finished remote command, shaped like :class:`subprocess.CompletedProcess`."""

    exit_status: int  # negative when killed by a signal
    stdout: Any  # str, or bytes when run with encoding=None
    stderr: Any


class Forward:
    """A local TCP port forwarded over a node's SSH connection (for remote kernels).

    ``remote_host`` is the socket path and ``remote_port`` 0 for a forward to a UNIX socket.
    """

    def __init__(self, node: str, listener: Any, remote_host: str, remote_port: int) -> None:
        self.node = node
        self.remote_host = remote_host
        self.remote_port = remote_port
        self.local_port: int = listener.get_port()
        self._listener = listener

    def close(self) -> None:
        """Stop listening; open forwarded connections close with the SSH connection."""
        self._listener.close()

    async def wait_closed(self) -> None:
        """Wait until the listener is shut down."""
        await self._listener.wait_closed()
