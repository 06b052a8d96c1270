"""Commands for a job's owner: whose login carries them, and the line that runs them as the owner.

With ``run_as="ssh"`` an owner's commands go over a connection that logs in as the owner, with
the key the admin provided for them; with ``"sudo"`` they go over the scheduler's connection as
``sudo -n -H -u OWNER -- AGENT ...``, and only the agent may run that way. An owner who cannot
be run as (no account, no key, sudo says no) is an :class:`AccountError` of that owner's job,
never a fall back to the scheduler's account. Every line is built by :func:`shlex.join`.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

import asyncssh

from jupyter_gpusched.core.errors import AccountError, BackendError

from .config import NodeConfig, check_account


def login_of(cfg: NodeConfig, user: str | None) -> str | None:
    """Whose SSH login carries a command for ``user``: theirs in ssh mode, else None."""
    return user if user is not None and cfg.run_as == "ssh" else None


def check_user(cfg: NodeConfig, user: str | None) -> None:
    """:class:`AccountError` when the node is to run as ``user`` and no such account exists."""
    if user is not None and cfg.run_as != "service":
        why = check_account(user)
        if why is not None:
            raise AccountError(f"node {cfg.name}: cannot run as {user!r}: {why}")


def user_keys(cfg: NodeConfig, user: str) -> list[Any]:
    """The private key ``user`` logs in to the node with (ssh mode)."""
    path = cfg.key_file_of(user)
    try:
        return [asyncssh.read_private_key(path)]
    except (OSError, asyncssh.KeyImportError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise AccountError(
            f"node {cfg.name}: no usable SSH key for {user} at {path} ({why}); jobs run as "
            "their owners with a key per user the admin provides (user_key_file)"
        ) from None


def command_line(cfg: NodeConfig, argv: Sequence[str], user: str | None) -> str:
    """The command line that runs ``argv`` on the node as ``user`` (None: the scheduler).

    In sudo mode only the agent runs as an owner: ``sudo -n -H -u USER -- AGENT`` with the
    node's env passed as the agent's ``--setenv`` (sudo resets the environment).
    """
    check_user(cfg, user)
    if user is None or cfg.run_as != "sudo":
        return _with_env(cfg, argv)
    agent = list(cfg.agent_argv())
    if list(argv[: len(agent)]) != agent:
        raise BackendError(
            f"node {cfg.name}: in sudo mode only the agent runs as a job's owner, not {argv[0]!r}"
        )
    setenv = [f"--setenv={k}={v}" for k, v in cfg.env.items()]
    sudo = [cfg.sudo, "-n", "-H", "-u", user, "--", *agent, *setenv, *argv[len(agent) :]]
    return _with_env(cfg, sudo)


def sudo_refused(cfg: NodeConfig, user: str | None, code: int | None, stderr: Any) -> None:
    """Raise :class:`AccountError` when sudo itself (not the agent) refused to run as ``user``."""
    if user is None or cfg.run_as != "sudo" or not code:
        return
    said = _sudo_said(stderr)
    if said:
        raise _refused(cfg, user, said)


def sudo_check_argv(cfg: NodeConfig, argv: Sequence[str], user: str) -> list[str]:
    """``sudo -n -l`` asking whether the line :func:`command_line` builds may run as ``user``.

    Run as the scheduler's account; exit 0 when sudo would run it, 1 when not. It starts no
    Python on the node: the serving agents' re-check (see :mod:`.serving`).
    """
    agent = list(cfg.agent_argv())
    setenv = [f"--setenv={k}={v}" for k, v in cfg.env.items()]
    return [cfg.sudo, "-n", "-l", "-u", user, "--", *agent, *setenv, *argv[len(agent) :]]


def sudo_check_failed(cfg: NodeConfig, user: str, stderr: Any) -> AccountError:
    """The :class:`AccountError` of a ``sudo -n -l`` (:func:`sudo_check_argv`) that said no."""
    said = _sudo_said(stderr) or (
        f"sudo -n -l: the sudoers rules no longer let the scheduler's account run the agent "
        f"as {user}"
    )
    return _refused(cfg, user, said)


def _sudo_said(stderr: Any) -> str:
    """The first line of ``stderr`` where sudo itself complains ("" when there is none)."""
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr or ""
    said = [line for line in text.splitlines() if line.startswith("sudo:")]
    return said[0] if said else ""


def _refused(cfg: NodeConfig, user: str, said: str) -> AccountError:
    return AccountError(
        f"node {cfg.name}: cannot run as {user} through sudo ({said}); the node "
        f"needs an account {user} that the sudoers line for the agent lets the "
        "scheduler's account run as"
    )


def _with_env(cfg: NodeConfig, argv: Sequence[str]) -> str:
    env = [f"{k}={v}" for k, v in cfg.env.items()]
    return shlex.join(["env", *env, *argv] if env else list(argv))
