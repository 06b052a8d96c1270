"""Job model: what a user asks for (``JobSpec``), what the scheduler knows (``Job``).

Pydantic models apart from database rows; the store maps rows to these.
"""

from __future__ import annotations

import difflib
import json
import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .bounds import (
    MAX_EXEC_BYTES,
    MAX_FILES,
    MAX_LABEL_KEY,
    MAX_LABEL_VALUE,
    MAX_LABELS,
    MAX_PARAMETERS_BYTES,
    MAX_RUNTIME_S,
    STORED,
    PathText,
    SpecBounds,
    Text,
    check_not_before,
    check_runtime,
    check_strings,
    stored,
)
from .errors import IllegalTransitionError, InvalidSpecError
from .units import format_size_bytes


class JobKind(StrEnum):
    """What runs: an interactive lease (remote kernel), a script, or a whole notebook."""

    LEASE = "lease"
    SCRIPT = "script"
    NOTEBOOK = "notebook"


class PriorityClass(StrEnum):
    """Interactive work is served first by day; batch fills the cluster by night."""

    INTERACTIVE = "interactive"
    BATCH = "batch"


class JobState(StrEnum):
    """Life of a job; see ``TRANSITIONS`` for the allowed moves."""

    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    LOST = "lost"


#: The state machine. ``preempted`` and ``lost`` lead back to ``queued`` (requeue); ``lost``
#: may also be reconciled when its node comes back and the job turns out alive or finished.
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.STARTING, JobState.CANCELLED}),
    JobState.STARTING: frozenset(
        {JobState.RUNNING, JobState.FAILED, JobState.CANCELLED, JobState.LOST, JobState.QUEUED}
    ),
    JobState.RUNNING: frozenset(
        {
            JobState.SUCCEEDED,
            JobState.FAILED,
            JobState.CANCELLED,
            JobState.PREEMPTED,
            JobState.LOST,
        }
    ),
    JobState.PREEMPTED: frozenset({JobState.QUEUED, JobState.CANCELLED}),
    JobState.LOST: frozenset(
        {JobState.QUEUED, JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}

ACTIVE_STATES = frozenset({JobState.STARTING, JobState.RUNNING})
"""States in which a job holds GPUs."""

TERMINAL_STATES = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)


def check_transition(from_state: JobState, to_state: JobState, job_id: int | None = None) -> None:
    """Raise :class:`IllegalTransitionError` unless ``from_state -> to_state`` is allowed."""
    if to_state not in TRANSITIONS[from_state]:
        raise IllegalTransitionError(job_id, from_state.value, to_state.value)


class JobRequirements(BaseModel):
    """What any job asks for: resources, priority, limits, labels.

    Shared by :class:`JobSubmission` and the notebook requests of
    :mod:`jupyter_gpusched.core.api`, so a field is defined (and documented) once.
    """

    model_config = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)

    name: Text | None = Field(None, max_length=200, description="free-form display name")
    parameters: dict[str, Any] = Field(
        default_factory=dict, description="papermill-style parameters of a notebook job"
    )
    kernel_name: Text | None = Field(None, max_length=200, description="kernel of a notebook job")
    gpus: int = Field(1, ge=0, le=64, description="number of GPUs, all on one node")
    gpu_mem_gb: float | None = Field(
        None, gt=0, le=1024, description="GPU memory needed on each GPU, in GB"
    )
    gpu_share: float | None = Field(
        None, gt=0, le=1, description="share of one GPU (0-1]; below 1 the GPU may be shared"
    )
    cpus: float = Field(1.0, gt=0, le=1024, description="CPU cores")
    mem_gb: float = Field(4.0, gt=0, le=16384, description="host memory in GB")
    gpu_models: list[Annotated[Text, StringConstraints(max_length=64)]] = Field(
        default_factory=list,
        max_length=16,
        description="allowed GPU models, e.g. ['A100']; empty = any",
    )
    priority: PriorityClass | None = Field(
        None, description="interactive or batch; default: interactive for leases, else batch"
    )
    max_runtime_s: float | None = Field(
        None,
        gt=0,
        description=f"kill the job after this long, in seconds; at most the server's "
        f"GpuSchedPolicy.max_runtime_s (never more than {MAX_RUNTIME_S:.0f}, a year)",
        json_schema_extra={"maximum": MAX_RUNTIME_S},
    )
    labels: dict[
        Annotated[Text, StringConstraints(max_length=MAX_LABEL_KEY)],
        Annotated[Text, StringConstraints(max_length=MAX_LABEL_VALUE)],
    ] = Field(default_factory=dict, max_length=MAX_LABELS, description="free-form tags")
    env: dict[str, str] = Field(
        default_factory=dict,
        description="extra environment variables (with the command: at most 1 MB, "
        "128 KB a variable)",
    )
    retries: int = Field(0, ge=0, le=100, description="requeue this many times if lost")

    @field_validator("max_runtime_s")
    @classmethod
    def _runtime_bound(cls, v: float | None, info: ValidationInfo) -> float | None:
        return check_runtime(v, info)

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        for key in v:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
        check_strings((f"{k}={x}" for k, x in v.items()), "variable", stored(info))
        return v

    @field_validator("parameters")
    @classmethod
    def _parameters_size(cls, v: dict[str, Any]) -> dict[str, Any]:
        if not v:
            return v  # most jobs have none: skip the encoding
        size = len(json.dumps(v, default=str).encode())
        if size > MAX_PARAMETERS_BYTES:
            raise ValueError(
                f"{format_size_bytes(size)} as JSON; at most "
                f"{format_size_bytes(MAX_PARAMETERS_BYTES)}: pass a path to a data file instead"
            )
        return v


class JobSubmission(JobRequirements):
    """A job as a client submits it (``POST jobs``); the server adds ``user``."""

    model_config = ConfigDict(frozen=True)

    kind: JobKind = Field(description="lease (interactive cells), script or notebook")
    command: list[str] | None = Field(
        None,
        description="argv of a script job, e.g. ['python', 'train.py', '--lr', '0.1'] "
        "(with env: at most 1 MB, 128 KB an argument)",
    )
    notebook: PathText | None = Field(None, description="path of the notebook of a notebook job")
    not_before: datetime | None = Field(None, description="do not start before this time")
    workdir: PathText | None = Field(None, description="working directory on the node")
    files: list[PathText] = Field(
        default_factory=list, max_length=MAX_FILES, description="files to stage onto the node"
    )
    lease_name: Text | None = Field(None, max_length=200, description="name of a lease")

    @field_validator("command")
    @classmethod
    def _command_nonempty(cls, v: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if v is not None and (not v or not all(isinstance(a, str) for a in v) or not v[0]):
            raise ValueError("must be a non-empty list of strings, e.g. ['python', 'train.py']")
        if v is not None:
            check_strings(v, "argument", stored(info))
        return v

    @field_validator("not_before")
    @classmethod
    def _aware(cls, v: datetime | None, info: ValidationInfo) -> datetime | None:
        return check_not_before(v, info)

    @model_validator(mode="after")
    def _consistent(self) -> JobSubmission:
        if self.kind is JobKind.SCRIPT and not self.command:
            raise _FieldError("command", "a script job needs a command, e.g. ['python', 'x.py']")
        if self.kind is JobKind.NOTEBOOK and not self.notebook:
            raise _FieldError("notebook", "a notebook job needs the notebook's path")
        if self.gpu_mem_gb is not None and self.gpu_share is not None:
            raise _FieldError("gpu_share", "give gpu_mem_gb or gpu_share, not both")
        if self.gpu_share is not None and self.gpu_share < 1 and self.gpus != 1:
            raise _FieldError("gpus", "a fractional gpu_share needs gpus = 1")
        if self.gpus == 0 and (self.gpu_share is not None or self.gpu_mem_gb is not None):
            raise _FieldError("gpus", "gpu_share and gpu_mem_gb need gpus >= 1")
        strings = [*(self.command or ()), *(f"{k}={v}" for k, v in self.env.items())]
        size = sum(len(a.encode()) + 1 for a in strings)
        if size > MAX_EXEC_BYTES:
            raise _FieldError(
                "command",
                f"command and env come to {format_size_bytes(size)}; at most "
                f"{format_size_bytes(MAX_EXEC_BYTES)} together (what the node's exec takes): "
                "pass big data in a file",
            )
        return self

    @property
    def priority_class(self) -> PriorityClass:
        """The effective class: explicit, else interactive for leases and batch otherwise."""
        if self.priority is not None:
            return self.priority
        return PriorityClass.INTERACTIVE if self.kind is JobKind.LEASE else PriorityClass.BATCH

    @property
    def share_per_gpu(self) -> float | None:
        """Requested share of each GPU, when given as a share (memory requests are per node)."""
        if self.gpu_share is not None:
            return self.gpu_share
        return None if self.gpu_mem_gb is not None else 1.0


class JobSpec(JobSubmission):
    """A submitted job with its owner: what the store keeps. See :func:`parse_spec`."""

    user: str = Field(
        "anonymous",
        min_length=1,
        max_length=200,
        description="the owner, from the server's identity provider",
    )


#: Labels and environment variables that tie the tasks of one array (bulk submit) together.
ARRAY_ID_LABEL, ARRAY_INDEX_LABEL = "array_id", "array_index"
ARRAY_ID_ENV, ARRAY_INDEX_ENV = "GPUSCHED_ARRAY_ID", "GPUSCHED_ARRAY_INDEX"
#: The reason of the tasks of a big array while the rest of it is still being written: they
#: are held until the last is in, so that none starts unless all were queued.
ARRAY_BEING_QUEUED = "waiting: the rest of its array is being queued"


def array_task(spec: JobSpec, array_id: int, index: int) -> JobSpec:
    """``spec`` as task ``index`` of array ``array_id``: labelled, and told in its environment.

    Not validated again: only two short labels and variables are added to a checked spec.
    """
    labels = {**spec.labels, ARRAY_ID_LABEL: str(array_id), ARRAY_INDEX_LABEL: str(index)}
    env = {**spec.env, ARRAY_ID_ENV: str(array_id), ARRAY_INDEX_ENV: str(index)}
    return replaced(spec, labels=labels, env=env)


M = TypeVar("M", bound=BaseModel)


def replaced(model: M, **fields: Any) -> M:
    """A shallow copy of ``model`` with ``fields`` replaced, not validated (nor frozen-checked).

    What ``model_copy(update=...)`` makes, at a tenth of its cost: an array of 10,000 tasks
    makes 10,000 of them. The attributes set are pydantic's own (those it copies).
    """
    new = object.__new__(type(model))
    values = model.__dict__.copy()
    values.update(fields)
    object.__setattr__(new, "__dict__", values)
    object.__setattr__(new, "__pydantic_fields_set__", model.__pydantic_fields_set__ | set(fields))
    object.__setattr__(new, "__pydantic_extra__", model.__pydantic_extra__)
    object.__setattr__(new, "__pydantic_private__", model.__pydantic_private__)
    return new


def array_of(spec: JobSpec) -> tuple[int, int] | None:
    """``(array id, index)`` of an array task, None for a job submitted alone."""
    aid, index = spec.labels.get(ARRAY_ID_LABEL), spec.labels.get(ARRAY_INDEX_LABEL)
    if aid is None or index is None or not aid.isdigit() or not index.isdigit():
        return None
    return int(aid), int(index)


class _FieldError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def parse_spec(
    data: dict[str, Any], *, bounds: SpecBounds | None = None, **overrides: Any
) -> JobSpec:
    """Build a :class:`JobSpec` from JSON-like data, raising :class:`InvalidSpecError`.

    The error names the first bad field and says what to fix, e.g. ``gpus: must be >= 0``.
    ``bounds``: the server's own bounds (default: the hard ceilings only).
    """
    if not isinstance(data, dict):
        raise InvalidSpecError("body", "must be a JSON object describing the job")
    try:
        return JobSpec.model_validate({**data, **overrides}, context={"bounds": bounds})
    except ValidationError as exc:
        raise invalid_field(exc, JobSpec) from None


def stored_spec(data: Any) -> JobSpec:
    """A spec as the store kept it: checked, but not against bounds that may have tightened."""
    return JobSpec.model_validate(data, context=STORED)


#: What each capped field counts, for "must be at most 64 (the per-job cap on GPUs)".
_CAPPED = {
    "gpus": "GPUs",
    "gpu_mem_gb": "GPU memory in GB, on each GPU",
    "cpus": "CPU cores",
    "mem_gb": "host memory in GB",
    "retries": "retries",
}


def invalid_field(exc: ValidationError, model: type[BaseModel] | None = None) -> InvalidSpecError:
    """The first error of a pydantic validation as our 422: the field and what to fix.

    With the ``model`` validated, an unknown field names the one meant (``gpu``: did you mean
    ``gpus``?), as the CLI and the magic do for a misspelt option.
    """
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "body"
    ctx_error = (err.get("ctx") or {}).get("error")
    if isinstance(ctx_error, _FieldError):
        return InvalidSpecError(ctx_error.field, ctx_error.message)
    msg = err["msg"]
    bounds = {
        "less_than_equal": ("at most", "le"),
        "less_than": ("less than", "lt"),
        "greater_than_equal": ("at least", "ge"),
        "greater_than": ("more than", "gt"),
    }
    if err["type"] in bounds:  # "must be at most 64, not 99", not pydantic's wording
        words, key = bounds[err["type"]]
        limit = err["ctx"][key]
        limit = f"{limit:g}" if isinstance(limit, float) else limit
        which = (
            f" (the per-job cap on {_CAPPED[loc]})"
            if key in ("le", "lt") and loc in _CAPPED
            else ""
        )
        return InvalidSpecError(loc, f"must be {words} {limit}{which}, not {err['input']!r}")
    if err["type"] == "extra_forbidden":
        msg = "unknown field; check the spelling against the API documentation"
        names = sorted(model.model_fields) if model is not None and len(err["loc"]) == 1 else []
        if close := difflib.get_close_matches(loc, names, n=1, cutoff=0.6):
            msg = f"unknown field; did you mean {close[0]!r}?"
    elif err["type"] == "missing":
        msg = "is required"
    elif msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    return InvalidSpecError(loc, msg[0].lower() + msg[1:] if msg else "is invalid")


class Placement(BaseModel):
    """Where a job runs: one node and some of its GPUs."""

    model_config = ConfigDict(frozen=True, json_schema_serialization_defaults_required=True)

    node: str
    gpu_indices: list[int] = Field(default_factory=list)
    gpu_uuids: list[str] = Field(default_factory=list)
    share_per_gpu: float = Field(1.0, description="share of each listed GPU the job holds")
    gpu_mem_gb: float | None = Field(None, description="GPU memory reserved on each GPU, GB")


class JobRecord(BaseModel):
    """A job's facts: the spec plus its life so far (the store's row, the API's body)."""

    model_config = ConfigDict(json_schema_serialization_defaults_required=True)

    id: int
    spec: JobSpec
    state: JobState = JobState.QUEUED
    held: bool = False
    submitted_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    last_activity_at: datetime | None = None
    placement: Placement | None = None
    exit_code: int | None = None
    reason: str | None = Field(None, description="why it waits, failed or was stopped")
    attempt: int = 0
    handle: dict[str, Any] = Field(
        default_factory=dict, description="backend facts to find the job again (pid, pgid, ...)"
    )


class Job(JobRecord):
    """A job as the scheduler knows it; :class:`jupyter_gpusched.core.api.JobView` shows it."""

    @property
    def user(self) -> str:
        """The job's owner."""
        return self.spec.user

    @property
    def gpu_seconds(self) -> float:
        """GPU-seconds used so far (share-weighted), 0 when never started."""
        if self.started_at is None or self.placement is None:
            return 0.0
        end = self.finished_at or self.last_activity_at or self.started_at
        n = len(self.placement.gpu_indices) * self.placement.share_per_gpu
        return max(0.0, (end - self.started_at).total_seconds()) * n


class Event(BaseModel):
    """One row of the audit log: every state change and notable action."""

    model_config = ConfigDict(json_schema_serialization_defaults_required=True)

    id: int
    at: datetime
    job_id: int | None
    kind: str = Field(description="submitted, state, updated, node, ...")
    from_state: JobState | None = None
    to_state: JobState | None = None
    detail: dict[str, Any] = Field(default_factory=dict)
