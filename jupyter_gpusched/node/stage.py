"""A job's files on the node: unpacked from a tar stream into its private job dir.

The scheduler sends the files a job stages as one tar stream on the agent's stdin
(``agent stage --job-dir D``), so they are written by the job's owner -- the agent runs as that
user -- whether the scheduler logged in as the owner or reached them through sudo. Standard
library only: it runs under the node's Python.

Privacy: the job dir (and any parent this creates) is 0700, and so are the folders a job's
kernel keeps in its user's home when it makes them (:func:`private_kernel_dirs`); a staged file
keeps its owner's permission bits (a script stays executable) and never gets group or other
bits; only regular files and directories are taken, at relative paths that stay inside the job
dir.
"""

from __future__ import annotations

import os
import posixpath
from typing import IO, Any

from .probe import AgentError


def private_dir(path: str) -> str:
    """``path`` (``~`` expanded, made absolute) as an existing directory only its user can enter.

    Missing parents are created 0700 too; an existing directory is narrowed to 0700.
    """
    full = os.path.abspath(os.path.expanduser(path))
    os.makedirs(full, mode=0o700, exist_ok=True)
    os.chmod(full, 0o700)
    return full


def private_folder(path: str) -> None:
    """Create ``path`` and its missing parents 0700; existing folders are left as they are."""
    missing = []
    while path and not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            continue  # made meanwhile (another kernel starting): its maker chose its mode
        os.chmod(folder, 0o700)  # whatever the umask of the job that starts the kernel


def private_kernel_dirs() -> None:
    """Make the folders a kernel keeps in its user's home 0700 when they do not exist yet.

    IPython's (``~/.ipython``: profiles, startup files, logs) and Jupyter's runtime folder
    (connection files) with its parents would otherwise be made with the job's umask, which
    opens them to every user of the node. Folders the user made are theirs to keep as they are.
    """
    home = os.path.expanduser("~")
    private_folder(os.environ.get("IPYTHONDIR") or os.path.join(home, ".ipython"))
    if runtime := os.environ.get("JUPYTER_RUNTIME_DIR"):
        private_folder(runtime)
        return
    data = os.environ.get("JUPYTER_DATA_DIR") or os.path.join(
        os.environ.get("XDG_DATA_HOME") or os.path.join(home, ".local", "share"), "jupyter"
    )
    private_folder(os.path.join(data, "runtime"))


def _member_path(name: str) -> str:
    """A tar member's name as a relative path that cannot leave the job dir."""
    norm = posixpath.normpath(name)
    if not name or norm.startswith(("/", "../")) or norm in ("..", ".") or "\0" in name:
        raise AgentError(f"refusing to stage {name!r}: not a relative path inside the job dir")
    return norm


def stage(job_dir: str, stream: IO[bytes]) -> dict[str, Any]:
    """Unpack the tar on ``stream`` into ``job_dir``; the absolute job dir and the files."""
    import shutil  # here, not at the top: every status poll starts the agent
    import tarfile

    root = private_dir(job_dir)
    written: list[str] = []
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            rel = _member_path(member.name)
            dest = os.path.join(root, rel)
            if member.isdir():
                os.makedirs(dest, mode=0o700, exist_ok=True)
                continue
            if not member.isfile():
                raise AgentError(
                    f"refusing to stage {member.name!r}: only files and directories are staged"
                )
            os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None  # a regular file always has content
            # Written aside and renamed: a repeated launch stages again over a read-only copy,
            # and a rename never follows a link that might sit at the destination.
            tmp = f"{dest}.gpusched-{os.getpid()}"
            mode = (member.mode & 0o700) | 0o400
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                with os.fdopen(fd, "wb") as out:
                    shutil.copyfileobj(source, out)
                    os.fchmod(out.fileno(), mode)
                os.replace(tmp, dest)
            except BaseException:
                if os.path.lexists(tmp):
                    os.unlink(tmp)
                raise
            written.append(rel)
    return {"job_dir": root, "files": written}
