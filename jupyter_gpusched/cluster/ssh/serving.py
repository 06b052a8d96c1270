"""A serving node agent: one long-lived ``agent serve`` process fed requests over its channel.

Launching a job through a fresh agent costs a Python start-up on the node (~30 ms of the
~70 ms from submit to the job's first instruction); a serving agent pays it once per node and
account. Requests are JSON lines; answers come back in the order asked
(:func:`jupyter_gpusched.node.agent.serve`), so a FIFO of futures pairs them up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import asyncssh


class AgentEnded(Exception):
    """The serving agent's process ended (its channel closed) before answering."""


class ServingAgent:
    """Requests to one ``agent serve`` process; it closes itself when its channel ends."""

    def __init__(self, process: Any, conn: Any, on_close: Callable[[ServingAgent], None]) -> None:
        self._process = process
        self.conn = conn
        self.answered = 0  # answers read; none means it never served (an older agent)
        self.evicted = False  # closed to make room for another account's (not its own end)
        self._on_close = on_close
        self._waiting: deque[asyncio.Future[dict[str, Any]]] = deque()
        self._stderr = ""
        self.closed = False
        self._tasks = (asyncio.create_task(self._answers()), asyncio.create_task(self._errors()))

    @property
    def busy(self) -> bool:
        """Whether a call waits for its answer (such an agent is not closed to make room)."""
        return bool(self._waiting)

    @property
    def exit_status(self) -> int | None:
        """The process's exit status once it ended (None while running or when unknown)."""
        return self._process.exit_status

    @property
    def stderr(self) -> str:
        """The end of what the process wrote on stderr (why sudo or the agent refused)."""
        return self._stderr

    async def call(
        self, args: Sequence[str], input: str | None, timeout_s: float
    ) -> dict[str, Any]:
        """The agent's ``{"exit": ..., "answer": ...}`` for one subcommand.

        Raises :class:`AgentEnded` when the process ends first and :class:`TimeoutError`
        after ``timeout_s`` (the agent is closed then: it may be stuck).
        """
        if self.closed:
            raise AgentEnded
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting.append(answer)
        try:
            self._process.stdin.write(json.dumps({"args": list(args), "input": input}) + "\n")
        except (asyncssh.Error, OSError, BrokenPipeError):
            self.close()
            raise AgentEnded from None
        try:
            async with asyncio.timeout(timeout_s):
                return await answer  # cancelled with the caller; its answer is skipped
        except TimeoutError:
            self.close()
            raise

    async def _answers(self) -> None:
        try:
            while line := await self._process.stdout.readline():
                self.answered += 1
                answer = self._waiting.popleft() if self._waiting else None
                if answer is not None and not answer.done():
                    answer.set_result(json.loads(line))
        except (asyncssh.Error, OSError, ValueError):
            pass  # a garbled or cut answer: the agent is no use any more
        finally:
            with contextlib.suppress(asyncssh.Error, OSError):
                await self._process.wait_closed()
            self.close()

    async def _errors(self) -> None:
        with contextlib.suppress(asyncssh.Error, OSError):
            while chunk := await self._process.stderr.read(4096):
                self._stderr = (self._stderr + chunk)[-2000:]

    def close(self) -> None:
        """End the process; pending calls raise :class:`AgentEnded`. Idempotent."""
        if self.closed:
            return
        self.closed = True
        while self._waiting:
            answer = self._waiting.popleft()
            if not answer.done():
                answer.set_exception(AgentEnded())
        self._process.close()
        self._on_close(self)
