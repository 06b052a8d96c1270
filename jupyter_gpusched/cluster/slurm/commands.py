"""The Slurm command lines the backend runs, built from argument lists (never a shell line).

The job's own argv and environment travel in its *launch file*, written into its private job
dir (:func:`launch_file_text`), which one fixed batch script (:data:`BATCH_SCRIPT`) sources:
env values and arguments never stand on a command line (sbatch's, or the batch script's
while the job runs), which every user of the submit host and the node reads with ``ps``. Every
value in the launch file is quoted with :func:`shlex.quote`. The script gates the start on the
attempt's launch record (see :mod:`.records`): a Slurm job runs its command only when the
record names it, so however often a cut-short launch is repeated, one Slurm job per attempt
does the work.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from jupyter_gpusched.core.models import Job

#: Exit status of a batch job that found its attempt claimed or launched as another job.
NOT_RUN_EXIT = 75

#: The batch script. Its one argument: the job's launch file, which exports the job's
#: environment -- naming the launch record (``GPUSCHED_LAUNCH_RECORD``) and the job dir (exit
#: record, checkpoint file) -- and sets its argv (``set --``). A trapped TERM waits for the job:
#: scancel --full signals every process of the step, and the job gets its grace period to
#: checkpoint before the KILL.
BATCH_SCRIPT = f"""#!/bin/sh
# jupyter-gpusched batch script: runs the job its launch file ($1) describes, once the launch
# record names this Slurm job. The launch file sets the job's environment and argv.
. "$1" || exit 126
n=0
while :; do
  rec=
  {{ read -r rec < "$GPUSCHED_LAUNCH_RECORD"; }} 2>/dev/null
  [ "$rec" = "$SLURM_JOB_ID" ] && break
  if [ -n "$rec" ] || [ "$n" -ge "${{GPUSCHED_RECORD_WAIT_TENTHS:-3000}}" ]; then
    echo "gpusched: attempt ${{SLURM_JOB_NAME}} belongs to ${{rec:-no Slurm job}}," \\
      "not to Slurm job $SLURM_JOB_ID: not run" >&2
    exit {NOT_RUN_EXIT}
  fi
  n=$((n + 1))
  sleep 0.1
done
trap 'stopping=1' TERM HUP USR1 USR2
"$@"
code=$?
printf '%s\\n' "$code" > "$GPUSCHED_JOB_DIR/exit_code.tmp" &&
  mv -f "$GPUSCHED_JOB_DIR/exit_code.tmp" "$GPUSCHED_JOB_DIR/exit_code"
exit "$code"
"""


def launch_file_text(command: Sequence[str], env: Mapping[str, str]) -> str:
    """A job's launch file: shell lines exporting its ``env`` and setting its argv.

    Raises ValueError for a name the shell cannot export (job specs allow none).
    """
    lines = ["# jupyter-gpusched: this job's environment and command, sourced by its batch script"]
    for key, value in env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"{key!r} is not a valid environment variable name")
        lines.append(f"export {key}={shlex.quote(value)}")
    lines.append("set -- " + shlex.join(command))
    return "\n".join(lines) + "\n"


def job_name(job: Job, prefix: str = "gpusched") -> str:
    """The Slurm job name of one attempt; unique per job and attempt across a reset store."""
    stamp = job.submitted_at.strftime("%Y%m%dT%H%M%S")
    return f"{prefix}-{job.id}.{job.attempt}-{stamp}"


@dataclass(frozen=True)
class Submission:
    """What one sbatch call needs; :meth:`argv` builds the command line."""

    name: str
    node: str
    gpus: int
    gres_type: str  # "" for untyped GRES
    cpus: float
    mem_gb: float
    limit_s: float | None
    workdir: str
    log: str
    script: str
    launch_file: str  # the job's env and argv (launch_file_text), in its private job dir
    partition: str = ""
    extra: Sequence[str] = ()

    def argv(self, sbatch: str = "sbatch") -> list[str]:
        """``sbatch --parsable ...`` (our queue chose the node; Slurm enforces and accounts)."""
        args = [
            sbatch,
            "--parsable",
            f"--job-name={self.name}",
            f"--nodelist={self.node}",
            "--nodes=1",
            "--ntasks=1",
            f"--cpus-per-task={max(1, math.ceil(self.cpus))}",
            f"--mem={max(1, math.ceil(self.mem_gb * 1024))}M",
            "--no-requeue",  # our queue requeues, Slurm must not run an attempt twice
            f"--chdir={self.workdir}",
            f"--output={self.log}",
            "--open-mode=append",
            "--export=ALL",
        ]
        if self.gpus > 0:
            kind = f"{self.gres_type}:" if self.gres_type else ""
            args.append(f"--gres=gpu:{kind}{self.gpus}")
        if self.limit_s:
            args.append(f"--time={max(1, math.ceil(self.limit_s / 60))}")
        if self.partition:
            args.append(f"--partition={self.partition}")
        args.extend(self.extra)
        return [*args, self.script, self.launch_file]


def as_user(user: str | None, argv: Sequence[str]) -> list[str]:
    """``argv`` run as ``user`` through ``sudo -n`` (None: as the service's own user)."""
    if user is None:
        return list(argv)
    return ["sudo", "-n", "-u", user, "--", *argv]
