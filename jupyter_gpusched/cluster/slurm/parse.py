"""Reading what Slurm's commands print: nodes, GRES strings, job rows, states, exit codes.

Pure functions over text, so every format quirk is pinned by a test without a cluster.
Formats are those of Slurm 22.05 (Debian 12), unchanged in later releases:

* ``scontrol -d -o show node``: one node per line, ``Key=Value`` fields separated by spaces;
  a few values (``OS=``, ``Reason=``) hold spaces themselves;
* ``Gres=gpu:a100:4(S:0-1)``, ``GresUsed=gpu:a100:2(IDX:0,2)``: several entries joined by
  commas outside parentheses, type optional (``gpu:4``);
* ``squeue -h -O`` with ``|`` after each field (see :data:`SQUEUE_FIELDS`);
* ``squeue --json``: every job of the cluster (22.05 ignores filters with ``--json``), each
  with ``gres_detail`` such as ``["gpu:fake:1(IDX:0)"]``;
* exit codes as wait statuses (``768`` = exit 3, ``15`` = killed by SIGTERM).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

#: The fields of our ``squeue -O`` call, in order; each is printed with a ``|`` after it.
SQUEUE_FIELDS = ("JobID", "Name", "State", "Reason", "exit_code", "NodeList", "EndTime")
#: Job states in which the job holds (or waits for) its allocation.
ACTIVE_JOB_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
        "RESV_DEL_HOLD",
    }
)
#: Ended job states that say the node failed rather than the job: the job is lost.
LOST_JOB_STATES = frozenset({"NODE_FAIL", "BOOT_FAIL"})
#: Base node states in which a node runs jobs (flags such as DRAIN are checked apart).
_UP_BASES = frozenset({"IDLE", "MIXED", "ALLOCATED", "ALLOCATED+", "COMPLETING"})
#: Node state flags after which no new job should go there.
_NO_NEW_WORK = frozenset(
    {"DRAIN", "DRAINING", "DRAINED", "FAIL", "FAILING", "NOT_RESPONDING", "MAINTENANCE",
     "MAINT", "POWER_DOWN", "POWERED_DOWN", "POWERING_DOWN", "POWERING_UP", "REBOOT_ISSUED",
     "REBOOT_REQUESTED", "INVALID_REG", "FUTURE", "RESERVED", "PLANNED"}
)  # fmt: skip
#: Node states in which its running jobs cannot be reached either.
_GONE = frozenset({"DOWN", "FAIL", "NOT_RESPONDING", "POWERED_DOWN", "UNKNOWN", "FUTURE"})

_KEY = re.compile(r"^([A-Za-z][A-Za-z0-9_/:.]*)=(.*)$", re.S)


def key_values(line: str) -> dict[str, str]:
    """The ``Key=Value`` fields of one ``scontrol -o`` line (the first of a repeated key wins).

    A word without ``=`` continues the previous value (``OS=Linux 6.1.0 #1 SMP``).
    """
    fields: dict[str, str] = {}
    last: str | None = None
    for word in line.split(" "):
        match = _KEY.match(word)
        if match and match.group(1) not in fields:
            last = match.group(1)
            fields[last] = match.group(2)
        elif match:
            last = None  # a repeated key: ignore it and what follows it
        elif last is not None and word:
            fields[last] += " " + word
    return fields


def index_list(text: str) -> tuple[int, ...]:
    """``"0-1,3"`` -> ``(0, 1, 3)``; ``N/A`` or empty -> ``()``."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part or not part[0].isdigit():
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(out)


def _split_outside_parens(text: str) -> Iterator[str]:
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            yield text[start:i]
            start = i + 1
    yield text[start:]


@dataclass(frozen=True)
class Gres:
    """One ``name[:type]:count[(...)]`` entry of a GRES string."""

    name: str
    type: str  # "" when untyped
    count: int
    indices: tuple[int, ...] = ()  # from "(IDX:...)", in use strings

    @classmethod
    def parse(cls, text: str) -> Gres | None:
        """One entry, None when it is no GRES (``(null)``, ``N/A``)."""
        head, _, extra = text.strip().partition("(")
        parts = head.split(":")
        if len(parts) < 2 or not parts[0] or parts[0] in ("(null)", "N/A"):
            return None
        count_text = parts[-1]
        if not count_text.isdigit():  # "gpu:a100" without a count means one
            parts.append("1")
            count_text = "1"
        kind = ":".join(parts[1:-1])
        idx = re.search(r"IDX:([^)]*)", extra)
        return cls(parts[0], kind, int(count_text), index_list(idx.group(1)) if idx else ())


def gres_list(text: str) -> list[Gres]:
    """Every entry of a GRES string (``gpu:a100:2,gpu:v100:2``)."""
    entries = (Gres.parse(part) for part in _split_outside_parens(text or ""))
    return [g for g in entries if g is not None]


@dataclass(frozen=True)
class SlurmNode:
    """One node as ``scontrol -d -o show node`` describes it."""

    name: str
    addr: str
    state: str  # e.g. "IDLE", "MIXED+DRAIN", "DOWN*"
    cpus: float
    mem_mb: float
    gpu_types: tuple[str, ...]  # one entry per GPU, in GRES index order ("" when untyped)
    gpus_used: tuple[int, ...]  # GRES indices allocated to any job
    features: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()
    reason: str = ""

    @property
    def state_words(self) -> set[str]:
        """Base state and flags, without the ``*`` (not responding) and ``~`` markers."""
        words = set(self.state.rstrip("*~#!%$@^-").split("+"))
        if self.state.endswith("*"):
            words.add("NOT_RESPONDING")
        return words

    @property
    def schedulable(self) -> bool:
        """Whether new jobs may go there (up, not drained, not failing)."""
        words = self.state_words
        return bool(words & _UP_BASES) and not words & _NO_NEW_WORK

    @property
    def gone(self) -> bool:
        """Whether its running jobs cannot be reached (down, failed, not responding)."""
        return bool(self.state_words & _GONE)


def parse_nodes(text: str) -> list[SlurmNode]:
    """Every node of ``scontrol -d -o show node`` output."""
    nodes = []
    for line in text.splitlines():
        f = key_values(line.strip())
        if "NodeName" not in f:
            continue
        types: list[str] = []
        for g in gres_list(f.get("Gres", "")):
            if g.name == "gpu":
                types.extend([g.type] * g.count)
        used = sorted(
            {i for g in gres_list(f.get("GresUsed", "")) if g.name == "gpu" for i in g.indices}
        )
        features = f.get("ActiveFeatures") or f.get("AvailableFeatures") or ""
        nodes.append(
            SlurmNode(
                name=f["NodeName"],
                addr=f.get("NodeAddr") or f["NodeName"],
                state=f.get("State", "UNKNOWN"),
                cpus=_number(f.get("CPUEfctv") or f.get("CPUTot")),
                mem_mb=_number(f.get("RealMemory")),
                gpu_types=tuple(types),
                gpus_used=tuple(used),
                features=tuple(x for x in features.split(",") if x and x != "(null)"),
                partitions=tuple(x for x in f.get("Partitions", "").split(",") if x),
                reason=f.get("Reason", ""),
            )
        )
    return nodes


def _number(text: str | None) -> float:
    try:
        return float(text or 0)
    except ValueError:
        return 0.0


@dataclass(frozen=True)
class JobRow:
    """One job as ``squeue`` reports it."""

    job_id: int
    name: str
    state: str  # RUNNING, PENDING, COMPLETED, ...
    reason: str = ""
    exit_status: int | None = None  # the raw wait status; see :func:`exit_code`
    node: str = ""
    ended_at: datetime | None = None
    gpus: tuple[int, ...] | None = field(default=None)  # GRES indices, when known

    @property
    def active(self) -> bool:
        """Whether it holds or waits for its allocation."""
        return self.state in ACTIVE_JOB_STATES

    @property
    def started(self) -> bool:
        """Whether its batch script has been started on the node (not pending)."""
        return self.state not in ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD")


def squeue_format() -> str:
    """The ``-O`` argument matching :func:`parse_squeue`."""
    return ",".join(f"{name}:|" for name in SQUEUE_FIELDS)


def parse_squeue(text: str) -> dict[int, JobRow]:
    """Rows of ``squeue -h -O <squeue_format()>``, by job id."""
    rows: dict[int, JobRow] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < len(SQUEUE_FIELDS) or not parts[0].strip().isdigit():
            continue
        job_id, name, state, reason, code, node, end = (p.strip() for p in parts[:7])
        rows[int(job_id)] = JobRow(
            job_id=int(job_id),
            name=name,
            state=state.split()[0] if state else "UNKNOWN",
            reason=reason,
            exit_status=int(code) if code.lstrip("-").isdigit() else None,
            node=node,
            ended_at=slurm_time(end),
        )
    return rows


def parse_squeue_json(text: str) -> dict[int, JobRow]:
    """Every job of ``squeue --json``, by id, with the GPU indices it holds."""
    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    rows: dict[int, JobRow] = {}
    for job in doc.get("jobs", []) if isinstance(doc, dict) else []:
        try:
            job_id = int(job["job_id"])
        except (KeyError, TypeError, ValueError):
            continue
        gpus = sorted(
            {
                i
                for detail in job.get("gres_detail") or []
                for g in gres_list(str(detail))
                if g.name == "gpu"
                for i in g.indices
            }
        )
        end = job.get("end_time")
        rows[job_id] = JobRow(
            job_id=job_id,
            name=str(job.get("name", "")),
            state=str(job.get("job_state", "UNKNOWN")),
            reason=str(job.get("state_reason", "")),
            exit_status=job.get("exit_code") if isinstance(job.get("exit_code"), int) else None,
            node=str(job.get("nodes", "")),
            ended_at=datetime.fromtimestamp(end, tz=UTC) if isinstance(end, int) and end else None,
            gpus=tuple(gpus),
        )
    return rows


def parse_sacct(text: str) -> dict[int, JobRow]:
    """Rows of ``sacct -n -P -X -o JobIDRaw,JobName,State,ExitCode,End``."""
    rows: dict[int, JobRow] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 5 or not parts[0].isdigit():
            continue
        code, _, sig = parts[3].partition(":")
        status = (int(code) << 8 if code.isdigit() else 0) | (int(sig) if sig.isdigit() else 0)
        rows[int(parts[0])] = JobRow(
            job_id=int(parts[0]),
            name=parts[1],
            state=parts[2].split()[0] if parts[2] else "UNKNOWN",
            exit_status=status,
            ended_at=slurm_time(parts[4]),
        )
    return rows


def exit_code(wait_status: int | None) -> int | None:
    """A wait status as the scheduler records exit codes: ``3`` for exit 3, ``-15`` for TERM."""
    if wait_status is None:
        return None
    signal = wait_status & 0x7F
    return -signal if signal else (wait_status >> 8) & 0xFF


def slurm_time(text: str) -> datetime | None:
    """A Slurm timestamp (``2026-11-23T08:36:02``, the controller's local time) in UTC."""
    if not text or text in ("N/A", "NONE", "Unknown", "None"):
        return None
    try:
        return datetime.fromisoformat(text).astimezone(UTC)
    except ValueError:
        return None


def job_ids_arg(ids: Iterable[int]) -> str:
    """Job ids as one comma-separated argument (``-j 4,7,9``)."""
    return ",".join(str(int(i)) for i in sorted(set(ids)))
