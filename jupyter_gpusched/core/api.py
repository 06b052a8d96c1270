"""The REST and websocket API's bodies: the one definition of each contract.

The server builds these models and dumps them at the HTTP edge; the client
(:class:`jupyter_gpusched.client.api.GpuSchedClient`) reads its answers back into them; the
OpenAPI file is generated from them (``python -m jupyter_gpusched.server.openapi``) and the lab
panel's TypeScript types from that file. A model whose schema name differs from its Python
name says so in ``title`` (``JobView`` is the API's ``Job``).

Request bodies reuse :mod:`.models`: ``POST jobs`` takes a :class:`~.models.JobSubmission`,
notebook requests take the same :class:`~.models.JobRequirements` fields.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
    StrictBool,
    StrictStr,
    ValidationError,
    model_validator,
)

from .bounds import MAX_RUNTIME_S, PathText
from .errors import InvalidSpecError
from .limits import PolicyLimits
from .models import (
    Job,
    JobKind,
    JobRecord,
    JobRequirements,
    JobSpec,
    JobState,
    JobSubmission,
    PriorityClass,
    invalid_field,
)
from .privacy import Viewer, public_spec

if TYPE_CHECKING:
    from .estimates import StartEstimate

#: Most items one list request answers.
MAX_LIMIT = 1000
#: Most bytes one log request answers.
MAX_LOG_CHUNK = 1 << 20
#: Largest list or log offset (JSON's exact integers).
MAX_OFFSET = 2**53
#: Largest job or definition id (SQL BIGINT).
MAX_ID = 2**63 - 1
#: Most jobs one ``POST jobs`` with a list creates (each is written as a row of its own).
MAX_ARRAY = 10_000
#: Most tasks of one ``array: N``: the contract's bound (one record, expanded as tasks start;
#: the per-user ``array_size`` limit is what a lab sets below it).
MAX_ARRAY_TASKS = 10_000_000
#: Longest first pause before a failed notebook job is submitted again (doubling each retry).
MAX_RETRY_BACKOFF_S = 86400.0

#: GPU states every client shows, in the order of the legend.
GpuState = Literal["free", "interactive", "batch", "foreign", "down"]
CatchUp = Literal["skip", "once"]
#: What an expected start rests on, firmest first (:mod:`.estimates`).
Basis = Literal["free", "limits", "history", "guess", "unknown"]


class Body(BaseModel):
    """Base of the response bodies: every field is always sent (required in the schema)."""

    model_config = ConfigDict(json_schema_serialization_defaults_required=True)


# ------------------------------------------------------------------------------------ errors


class Error(Body):
    """Every error answer: which error, what to fix, and the field to blame if one is."""

    error: str = Field(description="exception class, e.g. InvalidSpecError")
    message: str = Field(min_length=1, description="what went wrong and what to fix")
    field: str | None = Field(None, description="the request field to fix, when one is to blame")


# ------------------------------------------------------------------------------------ jobs


class JobOutputs(Body):
    """What a notebook job left in its owner's area, set by the server (never by labels)."""

    notebook: str | None = Field(None, description="the executed notebook, root-relative")
    log: str | None = Field(None, description="its log, root-relative")


class StartEstimateView(Body):
    """A waiting job's expected start: a range, and what it rests on, in words."""

    model_config = ConfigDict(title="StartEstimate")

    at: datetime | None = Field(None, description="central expected start; null: unknown")
    earliest: datetime | None = Field(
        None, description="if the jobs it waits for end as early as they plausibly can"
    )
    latest: datetime | None = Field(
        None, description="if they run as long as they may; null: nothing bounds it"
    )
    basis: Basis = Field(
        description="what it rests on: free (nothing has to end first), limits (declared "
        "runtime limits), history (the owners' past runtimes), guess (a default for jobs with "
        "neither), unknown"
    )
    note: str = Field("", description="the basis in words; where a guess decides it, the nudge")

    @classmethod
    def of(cls, estimate: StartEstimate | None) -> StartEstimateView | None:
        """The API's view of the scheduler's estimate (None stays None)."""
        if estimate is None:
            return None
        return cls.model_construct(**asdict(estimate))

    @classmethod
    def at_not_before(cls, at: datetime | None) -> StartEstimateView | None:
        """A job waiting for a far not-before time, which passes do not weigh: at best then."""
        if at is None:
            return None
        return cls.model_construct(
            at=at, earliest=at, latest=None, basis="free", note="not before then"
        )


class JobView(JobRecord):
    """A job as the API shows it: its record plus owner, queue position and effective class.

    Built for a viewer: to anyone but its owner and admins it shows no env values (names
    only), no notebook parameters, no ``handle`` (pids, paths on the node) and no ``outputs``,
    and says so with ``redacted``.
    """

    model_config = ConfigDict(title="Job")

    user: str = Field(description="the owner")
    position: int | None = Field(None, ge=1, description="1-based queue position while queued")
    priority_class: PriorityClass = Field(description="explicit priority, else by kind")
    outputs: JobOutputs | None = Field(
        None, description="a notebook job's executed notebook and log, once back (owner only)"
    )
    redacted: bool = Field(
        False,
        description="shown to someone other than its owner or an admin: env values, "
        "parameters, handle and outputs left out",
    )
    estimated_start: datetime | None = Field(
        None,
        description="while queued: when it is expected to start, from the running jobs' "
        "declared or estimated ends and the jobs ahead of it (the backfill's estimate); null "
        "when it cannot be told (held, a quota, more than every running job ending frees)",
    )
    estimate: StartEstimateView | None = Field(
        None, description="while queued: the expected start's range and what it rests on"
    )

    @classmethod
    def of(
        cls,
        job: Job,
        position: int | None = None,
        viewer: Viewer | None = None,
        estimated_start: datetime | None = None,
        estimate: StartEstimateView | None = None,
    ) -> JobView:
        """The view of a stored job for ``viewer`` (None: everything, for the server itself).

        No validation: the job was checked when stored.
        """
        full = viewer is None or viewer.sees_all_of(job.user)
        outputs = job.handle.get("outputs") if full else None
        fields = dict(job)
        if not full:
            fields.update(spec=public_spec(job.spec), handle={})
        return cls.model_construct(
            **fields,
            user=job.user,
            position=position,
            priority_class=job.spec.priority_class,
            outputs=JobOutputs.model_construct(**outputs) if outputs else None,
            redacted=not full,
            estimated_start=estimated_start,
            estimate=estimate,
        )

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        """One line in IPython (a trailing ``%gpu submit`` shows this, not 40 lines)."""
        p.text(f"<Job {self.id} {self.state.value}: {self.spec.name or self.spec.kind.value}>")


class JobArray(Body):
    """Answer of a bulk ``POST jobs`` (a list, or ``array: N``): the array and its first jobs.

    The jobs carry the labels ``array_id`` (the first job's id) and ``array_index`` (0-based),
    and see both as ``$GPUSCHED_ARRAY_ID`` and ``$GPUSCHED_ARRAY_INDEX``. An ``array: N`` is
    one record until its tasks start (as Slurm keeps arrays): ``jobs`` holds the tasks made so
    far (task 0 at submit), ``pending`` counts the rest.
    """

    array_id: int = Field(description="id of the first job; `GET jobs?array=` lists them all")
    size: int = Field(0, ge=0, description="tasks in all")
    pending: int = Field(0, ge=0, description="tasks not yet made into jobs (waiting to start)")
    jobs: list[JobView] = Field(description="the tasks made into jobs so far, in index order")


class ArrayView(Body):
    """A job array kept as one record: its tasks become jobs as the scheduler places them."""

    id: int = Field(description="the array's id: its task 0's job id (`ID_7` is task 7)")
    user: str
    spec: JobSpec = Field(
        description="its tasks' spec, without their array labels (another user's without env "
        "values or parameters)"
    )
    submitted_at: datetime
    size: int = Field(ge=1, description="tasks in all")
    pending: int = Field(ge=0, description="tasks not yet made into jobs nor cancelled")
    pending_range: str = Field(
        description="the pending tasks' indices as Slurm shows them (`8-99999`, `3,9-20`)"
    )
    counts: dict[str, int] = Field(description="its tasks made into jobs, by state")
    cancelled: int = Field(ge=0, description="pending tasks cancelled before they started")
    reason: str | None = Field(description="why its pending tasks wait (its queued task's)")
    estimated_start: datetime | None = Field(
        description="when its next task is expected to start (its queued task's)"
    )


class ArrayCancelled(Body):
    """Answer of ``DELETE arrays/{id}``: the array after, and what was cancelled."""

    array: ArrayView
    pending: int = Field(ge=0, description="pending tasks cancelled (they never start)")
    jobs: list[int] = Field(description="ids of the tasks' jobs cancelled or stopped")


class ArrayTask(Body):
    """One task of an array: its job once it was made, or why there is none yet."""

    array_id: int
    index: int = Field(ge=0)
    state: str = Field(description="the job's state, or `pending` / `cancelled` before it")
    job: JobView | None = Field(description="its job, once the scheduler made it")
    detail: str = Field(description="one line saying where the task stands")


class JobList(Body):
    """One page of jobs and how many match in all."""

    jobs: list[JobView]
    total: int = Field(ge=0)
    limit: int
    offset: int
    arrays: list[ArrayView] = Field(
        [], description="arrays with pending tasks (not in `jobs` until they start)"
    )


class JobUpdate(BaseModel):
    """``PATCH jobs/{id}``: change the priority class and/or hold a queued job (null: keep)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})

    priority: PriorityClass | None = None
    held: StrictBool | None = None

    @model_validator(mode="after")
    def _some(self) -> JobUpdate:
        if not self.model_fields_set:
            raise ValueError("give priority and/or held")
        return self


class LeaseList(Body):
    """The caller's live leases."""

    leases: list[JobView]


class KernelConnection(Body):
    """A Jupyter connection file's fields, with the ports forwarded to the server's loopback."""

    model_config = ConfigDict(extra="allow")

    transport: str
    ip: str
    shell_port: int
    iopub_port: int
    stdin_port: int
    control_port: int
    hb_port: int
    key: str
    signature_scheme: str


class LeaseKernel(Body):
    """How the lease's owner reaches its remote kernel."""

    connection: KernelConnection
    lease: JobView
    generation: int = Field(ge=0, description="grows each time the ports were forwarded again")


# ------------------------------------------------------------------------------------ cluster


class GpuJob(Body):
    """One job holding (part of) a GPU."""

    id: int
    user: str
    kind: JobKind
    priority_class: PriorityClass
    share: float = Field(description="share of the GPU the job holds")


class Gpu(Body):
    """One GPU of the cluster map."""

    index: int
    uuid: str
    model: str
    mem_total_gb: float
    mem_used_gb: float = Field(description="measured, or reserved by jobs if more")
    util_pct: float
    power_w: float | None = Field(None, description="power draw, when the node reports it")
    state: GpuState
    share_used: float = Field(ge=0, le=1)
    nvlink_peers: list[int] = Field(description="indices of GPUs reachable over NVLink")
    jobs: list[GpuJob]


class Node(Body):
    """One node of the cluster map."""

    name: str
    up: bool = Field(description="whether the node answers now")
    error: str | None = Field(description="why the node does not answer")
    health: Literal["up", "suspect", "down"] = Field(
        "up",
        description="suspect: unreachable, within the grace (no new work, its jobs keep their "
        "GPUs); down: unreachable past the grace (its jobs were requeued per their retries)",
    )
    unreachable_since: datetime | None = Field(
        None, description="when the scheduler first found the node unreachable"
    )
    down_at: datetime | None = Field(
        None, description="when an unreachable node is declared down (node_down_after_s)"
    )
    cpus: float
    mem_gb: float
    gpus: list[Gpu]


class Metrics(Body):
    """Fragmentation and capacity figures (shares are of the GPUs on up nodes)."""

    allocated_share: float
    unallocated_share: float
    free_nodes_by_size: dict[str, int] = Field(
        description="GPUs per node -> nodes with every GPU wholly free"
    )
    largest_placeable_gpus: int = Field(description="most whole free GPUs on one up node")
    frag_ratio: float = Field(description="share of the free capacity the job mix cannot use")
    gpus_total: int
    gpus_free: int
    gpus_stranded: float = Field(
        0.0, description="free GPU capacity left in partly used GPUs (whole-GPU jobs cannot use)"
    )
    largest_placeable_node: str | None = Field(
        None, description="an up node with `largest_placeable_gpus` whole GPUs free"
    )


class Window(Body):
    """The policy window in force, its rules by name and in words."""

    name: str
    applies: str = Field(description="when it applies, e.g. 'Mon-Fri 08:00-20:00'")
    since: datetime | None
    until: datetime | None
    next_window: str | None = Field(description="the window that follows at `until`")
    interactive_reserved_share: float
    interactive_max_share: float
    batch_max_runtime_s: float | None
    lease_idle_timeout_s: float | None
    preempt_batch: bool
    migrate_batch: bool
    interactive_first: bool
    rules: list[str] = Field(description="the rules, one line each, in words")


class QueueCounts(Body):
    """How many jobs wait and run."""

    queued: int
    running: int


class Cluster(Body):
    """Nodes and GPUs with their state and holders, fragmentation figures, the window."""

    nodes: list[Node]
    metrics: Metrics
    window: Window
    queue: QueueCounts
    at: datetime


class PolicyView(Body):
    """Which rules hold at a time, and why."""

    model_config = ConfigDict(title="Policy")

    at: datetime
    timezone: str
    local_time: str
    window: Window
    limits: PolicyLimits
    explanation: str = Field(description="multi-line, for people")


class EventMessage(Body):
    """One websocket message: a stored event (with its job), or a ``cluster`` update."""

    model_config = ConfigDict(title="Event")

    id: int | None = Field(description="stored event id; null for cluster messages")
    at: datetime
    kind: str = Field(description="submitted, state, updated, node, cluster, ...")
    job_id: int | None
    from_state: JobState | None = None
    to_state: JobState | None = None
    detail: dict[str, Any] = Field(default_factory=dict)
    job: JobView | None = None
    cluster: Cluster | None = None


class JobEvents(Body):
    """``GET jobs/{id}/events``: the job's timeline, oldest first (state changes with reasons)."""

    events: list[EventMessage]


class GpuSeries(Body):
    """One GPU's samples over time, as columns (one entry per sample)."""

    node: str
    index: int
    model: str
    mem_total_gb: float
    at: list[datetime] = Field(description="when each sample was taken")
    util_pct: list[float]
    mem_used_gb: list[float]
    power_w: list[float | None]
    jobs: list[list[int]] = Field(description="the jobs holding the GPU at each sample")


class GpuHistory(Body):
    """``GET cluster/history``: utilization, memory and power of GPUs over time."""

    interval_s: float = Field(description="seconds between probes of the nodes")
    kept_samples: int = Field(description="samples kept per GPU (older ones are dropped)")
    since: datetime | None
    until: datetime | None
    series: list[GpuSeries]


# ------------------------------------------------------------------------------------ notebooks


class FileUpload(BaseModel):
    """A file sent with a job, for a server that cannot read the submitter's files itself."""

    model_config = ConfigDict(extra="forbid")

    name: PathText = Field(description="relative path the file is staged at, e.g. 'data/x.csv'")
    content_base64: str = Field(description="the file's bytes, base64-encoded")
    mode: int = Field(0o600, ge=0, le=0o7777, description="Unix mode bits (the owner's are kept)")


class JobPost(JobSubmission):
    """``POST jobs``: a job, and the files it stages sent as content.

    A user's Jupyter server in client mode reads the ``files`` its user names (inside their
    root only) and sends them as ``uploads``: the lab-wide service reads no paths.
    """

    uploads: list[FileUpload] | None = Field(
        None, description="files staged beside the job, instead of `files` paths"
    )
    array: int | None = Field(
        None,
        ge=1,
        le=MAX_ARRAY_TASKS,
        description="queue this many copies as one array (answered as `JobArray`); each "
        "sees its index in `$GPUSCHED_ARRAY_INDEX`",
    )
    at: str | None = Field(
        None,
        description="when to start, as `POST notebooks` reads it: now | tonight | a window "
        "name | ISO time (sets `not_before`; a cron schedule is for notebooks)",
    )
    timezone: str | None = Field(None, description="of a naive ISO time in `at`")


class JobPostList(RootModel[list[JobPost]]):
    """``POST jobs`` with a list: several jobs (without `array`) queued together, all or none."""

    root: list[JobPost] = Field(min_length=1, max_length=MAX_ARRAY)


class NotebookSubmission(JobRequirements):
    """``POST notebooks`` (and ``POST definitions``): a notebook to run, with when and how."""

    notebook: PathText = Field(description="path under the server root (or absolute inside it)")
    content: dict[str, Any] | None = Field(
        None,
        description="the notebook itself (nbformat JSON), kept by the lab-wide service under "
        "`notebook` in the caller's directory; users' servers send it",
    )
    at: str = Field("now", description="now | tonight | a window name | ISO time | cron")
    schedule: str | None = Field(None, description="cron expression (a recurring definition)")
    timezone: str | None = Field(None, description="of the cron / a naive ISO time")
    catch_up: CatchUp = Field("skip", description="after downtime: skip missed firings, or once")
    paused: bool = Field(False, description="store a definition paused")
    cell_timeout_s: float | None = Field(
        None, gt=0, le=MAX_RUNTIME_S, description="stop a cell after this long, in seconds"
    )
    retry_backoff_s: float = Field(
        60.0,
        ge=0,
        le=MAX_RETRY_BACKOFF_S,
        description="a failed run with retries is submitted again after this x 2^n seconds "
        "(each pause at most a week)",
    )
    cwd: PathText | None = Field(None, description="working directory of the kernel on the node")


class DefinitionRun(Body):
    """A firing: when it was due, when it fired, which job it made."""

    fire_at: datetime = Field(description="when it was due")
    fired_at: datetime
    job_id: int
    caught_up: bool = Field(False, description="a late run standing for missed firings")


class Definition(Body):
    """A recurring notebook job."""

    id: int
    name: str | None = None
    user: str
    schedule: str = Field(description="cron expression, e.g. '0 2 * * *', or @daily/@hourly")
    schedule_words: str = Field("", description="the schedule in words, e.g. 'weekdays at 22:00'")
    timezone: str = Field(description="IANA timezone the schedule is read in")
    catch_up: CatchUp = Field(description="after downtime: 'skip' missed firings or run 'once'")
    paused: bool = False
    spec: JobSpec
    next_fire_at: datetime | None = None
    last_fired_at: datetime | None = None
    last_job_id: int | None = None
    fire_count: int = Field(0, ge=0)
    created_at: datetime
    updated_at: datetime
    runs: list[DefinitionRun] = Field(default_factory=list, description="latest firings first")

    def seen_by(self, viewer: Viewer) -> Definition:
        """The definition as ``viewer`` may see it: others' without env values or parameters."""
        if viewer.sees_all_of(self.user):
            return self
        return self.model_copy(update={"spec": public_spec(self.spec)})


class DefinitionList(Body):
    """One page of definitions and how many match in all."""

    definitions: list[Definition]
    total: int = Field(ge=0)
    limit: int
    offset: int


class DefinitionUpdate(BaseModel):
    """``PATCH definitions/{id}``: pause, resume, reschedule or rename (null: keep)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})

    paused: StrictBool | None = None
    schedule: StrictStr | None = None
    timezone: StrictStr | None = None
    catch_up: CatchUp | None = None
    name: StrictStr | None = Field(None, max_length=200)

    @model_validator(mode="after")
    def _some(self) -> DefinitionUpdate:
        if not self.model_fields_set:
            raise ValueError(f"give at least one of {sorted(type(self).model_fields)}")
        return self


class NotebookSubmitted(Body):
    """Answer of ``POST notebooks``: the queued job, or the stored definition (cron)."""

    job: JobView | None
    definition: Definition | None

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        """One line in IPython (a trailing ``%gpu submit-notebook`` shows this)."""
        if self.definition is not None:
            p.text(f"<Definition {self.definition.id}: {self.definition.schedule_words}>")
        elif self.job is not None:
            self.job._repr_pretty_(p, cycle)


# ------------------------------------------------------------------------------------ parsing

M = TypeVar("M", bound=BaseModel)


def parse_body(model: type[M], data: Any, example: str) -> M:
    """A request body as ``model``, or :class:`InvalidSpecError` naming the field to fix."""
    if not isinstance(data, dict):
        raise InvalidSpecError("body", f"must be a JSON object like {example}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise invalid_field(exc, model) from None
