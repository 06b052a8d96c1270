"""A job's files on the node: unpacked from a tar stream into its private job dir.

The scheduler sends the files a job stages as one tar stream on the agent's stdin
(``agent stage --job-dir D``), so they are written by the job's owner -- the agent runs as that
user -- whether the scheduler logged in as the owner or reached them through sudo. Standard
library only: it runs under the node's Python.

Privacy: the job dir (and any parent this creates) is 0700; a staged file keeps its owner's
permission bits (a script stays executable) and never gets group or other bits; only regular
files and directories are taken, at relative paths that stay inside the job dir.
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
