"""One exception root for the project; the server maps each subclass to one HTTP status."""

from __future__ import annotations


class GpuSchedError(Exception):
    """Root of every error jupyter-gpusched raises on purpose.

    ``message`` says what went wrong *and what to do about it*; clients show it as is.
    """

    status = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidSpecError(GpuSchedError):
    """A job spec, a query or a config value is malformed; names the field to fix."""

    status = 422

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class BadRequestError(GpuSchedError):
    """The request could not be read at all (not JSON, wrong content type)."""

    status = 400


class NotFoundError(GpuSchedError):
    """A job, lease, node or definition with that id does not exist."""

    status = 404


class ForbiddenError(GpuSchedError):
    """The user may not act on someone else's job."""

    status = 403


class ConflictError(GpuSchedError):
    """The request is valid but the object's current state forbids it."""

    status = 409


class InFlightError(ConflictError):
    """A request with this ``Idempotency-Key`` is still being answered; ask again shortly.

    ``retry_after_s``: when (the ``Retry-After`` header).
    """

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class KeyTakenError(ConflictError):
    """An ``Idempotency-Key`` was written meanwhile by another request (another server).

    Raised by the store in place of the create's commit, which it rolls back; the server then
    answers that other request's result.
    """


class IllegalTransitionError(ConflictError):
    """A job state change the state machine does not allow."""

    def __init__(self, job_id: int | None, from_state: str, to_state: str) -> None:
        who = f"job {job_id}" if job_id is not None else "job"
        super().__init__(
            f"{who} cannot go from {from_state!r} to {to_state!r}; "
            "only queued or running jobs can change state"
        )
        self.job_id = job_id
        self.from_state = from_state
        self.to_state = to_state


class TooManyError(GpuSchedError):
    """The user holds (or sends) as much of something as one user may: a limit of the policy.

    The message names the limit and the user's count; ``retry_after_s`` is when trying again
    may help (the ``Retry-After`` header).
    """

    status = 429

    def __init__(self, message: str, *, retry_after_s: float = 5.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class InfeasibleError(GpuSchedError):
    """The request can never fit this cluster; the message says what would."""

    status = 422


class BackendError(GpuSchedError):
    """A node could not be reached or a remote command failed."""

    status = 502


class UnavailableError(GpuSchedError):
    """The store cannot be used now (down, locked, unreadable); try again after a while."""

    status = 503

    def __init__(self, message: str, *, retry_after_s: float = 5.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class NodeRefusedError(BackendError):
    """The node answered, and said no: its command ran and failed (nothing was left running).

    Unlike other backend errors (unreachable, connection lost, timed out), this one is
    definite: the node did what it was asked and reported the failure.
    """


class AccountError(NodeRefusedError):
    """The job's owner cannot run on the node: no such account, no SSH key, sudo says no.

    Definite and no fault of the node: trying again does not help, so the job fails at once
    with this message. Jobs never fall back to the scheduler's own account.
    """


class HostKeyError(BackendError):
    """A node's SSH host key is unknown or does not match known_hosts."""
