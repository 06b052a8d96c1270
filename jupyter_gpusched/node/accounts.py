"""Has anything changed that decides whom sudo lets the scheduler run as? A cheap fingerprint.

A serving agent started through sudo (``agent serve --watch-accounts``) runs as its user for
as long as its connection lasts: sudo decided once, when it started. So before each launch it
takes a :func:`fingerprint` of what sudo's decision rests on -- the account and group files,
the sudoers files, sudo's and NSS's own configuration -- and compares it with the one taken
when the scheduler last asked sudo itself (``sudo -n -l``, see
:mod:`jupyter_gpusched.cluster.ssh.serving`). When they differ, or no fingerprint can be taken
(accounts or groups from a directory service, a sudoers.d its user cannot list), it launches
nothing and asks for that check first. A user removed from the sudoers group therefore gets
their next launch refused with sudo's answer, while a launch costs a dozen ``stat`` calls
instead of a sudo run. Standard library only: it runs on the node.
"""

from __future__ import annotations

import hashlib
import os

#: Files whose change may change whom sudo lets the scheduler's account run the agent as.
FILES = ("/etc/passwd", "/etc/group", "/etc/sudoers", "/etc/sudo.conf", "/etc/nsswitch.conf")
#: Folders whose entries count too (sudoers drop-ins; systemd's user and group records).
FOLDERS = ("/etc/sudoers.d",)
SYSTEMD_FOLDERS = ("/etc/userdb", "/run/userdb")
#: NSS databases sudo's answer depends on, and the sources whose changes the files above show.
DATABASES = ("passwd", "group", "initgroups", "sudoers")
LOCAL_SOURCES = frozenset({"files", "compat", "systemd"})
NSSWITCH = "/etc/nsswitch.conf"


def _sources() -> set[str] | None:
    """The NSS sources of :data:`DATABASES`; None when one is not local (LDAP, SSSD...)."""
    try:
        with open(NSSWITCH) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return {"files"}  # glibc's default
    except OSError:
        return None
    used = {"files"}
    for line in lines:
        database, sep, rest = line.partition("#")[0].partition(":")
        if not sep or database.strip() not in DATABASES:
            continue
        sources = {word for word in rest.split() if not word.startswith("[")}
        if not sources <= LOCAL_SOURCES:
            return None
        used |= sources
    return used


def _signature(path: str) -> tuple[int, ...]:
    """What changes when ``path`` is written, replaced or removed."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return ()
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def fingerprint() -> str | None:
    """A digest of what decides sudo's answer, or None when it cannot be watched this way."""
    sources = _sources()
    if sources is None:
        return None
    folders = FOLDERS + (SYSTEMD_FOLDERS if "systemd" in sources else ())
    signatures: list[object] = [(path, _signature(path)) for path in FILES]
    for folder in folders:
        try:
            names = sorted(os.listdir(folder))
        except FileNotFoundError:
            signatures.append((folder, ()))
            continue
        except OSError:
            return None  # a drop-in it cannot see could change anything
        signatures.append((folder, _signature(folder)))
        signatures.extend((name, _signature(os.path.join(folder, name))) for name in names)
    return hashlib.sha256(repr(signatures).encode()).hexdigest()[:32]


class AccountWatch:
    """Whether a launch may go ahead without sudo being asked first."""

    def __init__(self) -> None:
        self.checked: str | None = None  # the fingerprint sudo's last answer was given under

    def may_launch(self, checked: str | None) -> str | None:
        """None when the launch may go ahead; else the fingerprint to have sudo check under.

        ``checked``: the fingerprint the scheduler had sudo check under just now (its
        ``--accounts-checked``), "" when there was none to give.
        """
        now = fingerprint()
        if checked is not None and checked == (now or ""):
            self.checked = now
            return None  # sudo said yes after this fingerprint was taken
        if now is not None and now == self.checked:
            return None
        return now or ""
