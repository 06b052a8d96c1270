"""Real Unix users for multi-user tests (JupyterHub spawns, jobs run as their owner).

As root, ``unix_users`` makes sure the accounts ``alice``, ``bob`` and ``carol`` exist (created
once with ``useradd --create-home``, password locked with ``usermod -p '*'``, kept afterwards:
other sessions on the machine may be using them). Without root the fixtures skip and say why.

The project's venv Python is usually a symlink into root's pyenv (``/root`` is 0700), which
other users cannot execute. ``user_python`` therefore gives the users an *overlay* venv: Debian's
Python of the same minor version (same ABI, so the venv's compiled wheels load) that adds the
project venv's site-packages through a ``.pth`` line, and whose ``etc``/``share`` link to the
project venv's (so Jupyter finds the extension's server config, labextension and kernelspecs).
When the venv's own Python is usable by others it is used directly.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _fixtures_polling import scaled

import jupyter_gpusched

REPO_ROOT = Path(jupyter_gpusched.__file__).resolve().parent.parent
USER_NAMES = ("alice", "bob", "carol")
USER_PATH = "/usr/local/bin:/usr/bin:/bin"


def root_only_reason() -> str | None:
    """Why multi-user tests cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root: creates Unix users alice/bob/carol and runs processes as them"
    if not shutil.which("useradd") or not shutil.which("usermod"):
        return "needs useradd/usermod (Debian's passwd package)"
    return None


@dataclass(frozen=True)
class UnixUser:
    """One local account, and how to run a process as it."""

    name: str
    uid: int
    gid: int
    home: Path
    shell: str

    def env(self, path: str = USER_PATH, **extra: str) -> dict[str, str]:
        """A login-like environment: nothing of root's (no pyenv, no root HOME) leaks in."""
        base = {"HOME": str(self.home), "USER": self.name, "LOGNAME": self.name}
        base |= {"SHELL": self.shell, "PATH": path, "LANG": "C.UTF-8"}
        return base | extra

    def popen_kwargs(self, env: Mapping[str, str] | None = None) -> dict[str, Any]:
        """``subprocess`` arguments that run the child as this user (uid, gid, groups, cwd)."""
        return {
            "user": self.uid,
            "group": self.gid,
            "extra_groups": os.getgrouplist(self.name, self.gid),
            "cwd": str(self.home),
            "env": dict(env) if env is not None else self.env(),
        }

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = 60,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` (no shell) as this user; output captured as text. ``timeout``: a quiet
        machine's seconds (stretched by the load, see ``_fixtures_polling``)."""
        return subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=scaled(timeout),
            check=check,
            **self.popen_kwargs(env),
        )


def ensure_user(name: str) -> UnixUser:
    """The account ``name``, created with a home dir and a locked password if missing.

    Idempotent and safe against concurrent callers: pytest-xdist workers and other sessions on
    the machine take one file lock around ``useradd``/``usermod`` (which refuse to run while
    another holds /etc/passwd's lock), and a refusal by an outsider is retried.
    """
    with _accounts_lock():
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            made = _retrying(
                ["useradd", "--create-home", "--shell", "/bin/sh", "--user-group", name]
            )
            try:
                entry = pwd.getpwnam(name)
            except KeyError:
                raise RuntimeError(f"useradd {name} failed: {made.stderr.strip()}") from None
        # "!" (useradd's default) locks the account for sshd even with a key; "*" only disables
        # password logins.
        if _shadow_hash(name) != "*":
            changed = _retrying(["usermod", "-p", "*", name])
            if changed.returncode != 0:
                raise RuntimeError(f"usermod -p '*' {name} failed: {changed.stderr.strip()}")
    home = Path(entry.pw_dir)
    if not home.is_dir():
        home.mkdir(mode=0o755, parents=True)
        os.chown(home, entry.pw_uid, entry.pw_gid)
    return UnixUser(name, entry.pw_uid, entry.pw_gid, home, entry.pw_shell or "/bin/sh")


#: One lock for every test process on the machine that adds or changes accounts.
_ACCOUNTS_LOCK = Path(tempfile.gettempdir()) / "gpusched-tests-accounts.lock"


@contextlib.contextmanager
def _accounts_lock() -> Iterator[None]:
    fd = os.open(_ACCOUNTS_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _retrying(argv: list[str], tries: int = 50) -> subprocess.CompletedProcess[str]:
    """``argv`` (useradd, usermod), again while another program holds /etc/passwd's lock."""
    for _ in range(tries - 1):
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode == 0 or "lock" not in done.stderr:
            return done
        time.sleep(0.2)  # a lock held by an outsider: poll for it, as useradd itself would
    return subprocess.run(argv, capture_output=True, text=True)


def _shadow_hash(name: str) -> str | None:
    try:
        lines = Path("/etc/shadow").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(":")
        if fields[0] == name and len(fields) > 1:
            return fields[1]
    return None


def not_traversable_by_others(path: Path) -> Path | None:
    """The first directory on ``path``'s chain that other users cannot enter (None if none).

    Symlinks are resolved (the venv's ``python`` is a link into root's pyenv).
    """
    resolved = path.resolve()
    for parent in [*reversed(resolved.parents), resolved]:
        try:
            mode = parent.stat().st_mode
        except OSError:
            return parent
        if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
            return parent
        if not stat.S_ISDIR(mode) and not mode & stat.S_IROTH:
            return parent
    return None


@dataclass(frozen=True)
class UserPython:
    """A Python that every test user can run, importing the project venv's packages."""

    python: Path
    bindir: Path
    prefix: Path
    overlay: bool

    def argv(self, *args: str) -> list[str]:
        return [str(self.python), *args]

    @property
    def path(self) -> str:
        """PATH for a user's process: this Python's bin dir first, then the system's."""
        return f"{self.bindir}:{USER_PATH}"


def _venv_site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def make_user_python(directory: Path) -> UserPython:
    """The venv's own Python when others can run it, else an overlay venv under ``directory``.

    ``directory`` must be traversable by the users (its chain 0755). Raises RuntimeError with
    what to change when neither works.
    """
    venv = Path(sys.prefix)
    site = _venv_site_packages()
    for needed in (site, REPO_ROOT / "jupyter_gpusched"):
        blocked = not_traversable_by_others(needed)
        if blocked is not None:
            raise RuntimeError(
                f"{needed} is not readable by other users ({blocked} is closed): make its "
                "directory chain world-traversable (chmod o+rx) to run tests as alice/bob"
            )
    if not_traversable_by_others(Path(sys.executable)) is None:
        return UserPython(Path(sys.executable), venv / "bin", venv, overlay=False)
    minor = f"{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(f"python{minor}", path="/usr/local/bin:/usr/bin:/bin")
    if system is None or not_traversable_by_others(Path(system)) is not None:
        raise RuntimeError(
            f"the venv's Python ({Path(sys.executable).resolve()}) is not executable by other "
            f"users and no system python{minor} is: install Debian's python{minor} "
            "(apt-get install python3) or build the venv from a Python all users can run"
        )
    overlay = directory / "user-venv"
    subprocess.run([system, "-m", "venv", "--without-pip", str(overlay)], check=True)
    overlay_site = overlay / "lib" / f"python{minor}" / "site-packages"
    # ``import`` lines in a .pth run at startup: addsitedir also processes the venv's own .pth
    # files (the editable install of jupyter_gpusched is one).
    (overlay_site / "gpusched_project_venv.pth").write_text(
        f"import site; site.addsitedir({str(site)!r})\n"
    )
    for shared in ("etc", "share"):
        if (venv / shared).is_dir():
            (overlay / shared).symlink_to(venv / shared)
    for dirpath, dirnames, filenames in os.walk(overlay):
        for name in dirnames + filenames:
            target = Path(dirpath) / name
            if not target.is_symlink():
                target.chmod(target.stat().st_mode | 0o055)
    return UserPython(overlay / "bin" / "python", overlay / "bin", overlay, overlay=True)


def shared_tempdir(prefix: str) -> Path:
    """A fresh dir under the system temp dir that other users can read and traverse.

    pytest's own ``tmp_path`` lives under ``/tmp/pytest-of-root`` (0700), closed to them.
    """
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    return path


@pytest.fixture(scope="session")
def unix_users() -> dict[str, UnixUser]:
    """alice, bob and carol as real accounts (skips unless root)."""
    reason = root_only_reason()
    if reason is not None:
        pytest.skip(reason)
    return {name: ensure_user(name) for name in USER_NAMES}


@pytest.fixture(scope="session")
def user_python(unix_users: dict[str, UnixUser]) -> Iterator[UserPython]:
    """A Python the test users can run with the project's packages (checked as alice)."""
    directory = shared_tempdir("gpusched-userpy-")
    try:
        try:
            python = make_user_python(directory)
        except RuntimeError as e:
            pytest.skip(str(e))
        probe = unix_users["alice"].run(
            python.argv("-c", "import jupyter_gpusched, jupyterhub, jupyter_server"),
            env=unix_users["alice"].env(python.path),
            check=False,
        )
        if probe.returncode != 0:
            pytest.fail(f"alice cannot import the project with {python.python}: {probe.stderr}")
        yield python
    finally:
        shutil.rmtree(directory, ignore_errors=True)
