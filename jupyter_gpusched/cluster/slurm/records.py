"""Launch records: which Slurm job is an attempt's, or that the attempt was claimed.

One small file per attempt, ``<state_dir>/launches/<job name>``, holding the Slurm job id, or
``claimed`` for an attempt stopped before it started. It is created once, with its content,
by a hard link (atomic, and it fails if the file exists), so of a launch and a claim racing
for an attempt exactly one wins, and the batch script (which waits until the record names its
own Slurm job, see :mod:`.commands`) never runs the work of an attempt twice. The directory
must be on a filesystem the Slurm nodes see, readable by the jobs' users.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

CLAIMED = "claimed"


class LaunchRecords:
    """The launch records under ``state_dir``."""

    def __init__(self, state_dir: str) -> None:
        self.dir = os.path.join(os.path.abspath(os.path.expanduser(state_dir)), "launches")

    def ensure(self) -> None:
        """Create the directory, traversable by the jobs' users (it holds no secret)."""
        os.makedirs(self.dir, mode=0o755, exist_ok=True)

    def path(self, name: str) -> str:
        """Where the record of job name ``name`` lives."""
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"not a job name: {name!r}")
        return os.path.join(self.dir, name)

    def read(self, name: str) -> str | None:
        """The record's content (a Slurm job id or ``claimed``), None when there is none."""
        try:
            with open(self.path(name)) as f:
                return f.read().strip() or None
        except FileNotFoundError:
            return None

    def create(self, name: str, content: str) -> str:
        """Write the record unless one exists; return the record that holds afterwards."""
        self.ensure()
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".new-")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(content + "\n")
            os.chmod(tmp, 0o644)
            try:
                os.link(tmp, self.path(name))
            except FileExistsError:
                return self.read(name) or content
            return content
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
