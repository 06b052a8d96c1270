"""Serving node agents: one long-lived ``agent serve`` per node and account, fed requests.

Launching a job through a fresh agent costs a Python start-up on the node (~30 ms of the
~70 ms from submit to the job's first instruction); a serving agent pays it once per node and
account. Requests are JSON lines; answers come back in the order asked
(:func:`jupyter_gpusched.node.agent.serve`), so a FIFO of futures pairs them up.

In sudo mode sudo decided once, when an owner's serving agent started; that agent keeps
running as the owner however the node's sudoers or groups change. So it watches them
(``serve --watch-accounts``, :mod:`jupyter_gpusched.node.accounts`): when what decides sudo's
answer changed since sudo was last asked -- and before its first launch -- it answers a launch
with ``recheck``, and the scheduler asks sudo itself (``sudo -n -l``, as its own account)
before sending the launch again. A user taken out of the sudoers group gets their next job
failed at once with sudo's reason; launches in between cost a few ``stat`` calls on the node.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import asyncssh

from jupyter_gpusched.core.errors import BackendError, NodeRefusedError
from jupyter_gpusched.core.units import format_duration_s

from .config import NodeConfig, RemoteResult
from .owners import command_line, sudo_check_argv, sudo_check_failed, sudo_refused
from .pool import NodePool, _Node, open_process

_log = logging.getLogger(__name__)


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


class ServingPool(NodePool):
    """A node pool whose nodes keep serving agents: :meth:`ask` sends a request to one."""

    @staticmethod
    def kept_agents(cfg: NodeConfig) -> int:
        """Serving agents a node keeps at once (each holds one of its ``max_channels``)."""
        return max(0, (cfg.max_channels - 2) // 3)

    async def ask(
        self,
        node: str,
        args: Sequence[str],
        *,
        user: str | None = None,
        timeout_s: float = 60.0,
        input: str | None = None,
    ) -> RemoteResult:
        """One agent subcommand (``launch``, ``status``, ``remove``) through a serving agent.

        The node's serving agent for ``user`` starts on first use and stays; the answer is
        the one a fresh agent (:meth:`run`) would print. A fresh agent is used instead when the
        node has no channel to spare for another serving one, or its agent does not serve.
        The subcommands served are idempotent, so one whose agent ended before answering is
        asked once more of a new one.
        """
        st = self._node(node)
        for retry in (False, True):
            agent = await self._serving(st, user)
            if agent is None:
                argv = [*st.cfg.agent_argv(), *args]
                return await self.run(node, argv, user=user, timeout_s=timeout_s, input=input)
            try:
                reply = await self._launch_checked(st, user, agent, args, input, timeout_s)
            except TimeoutError:
                raise BackendError(
                    f"node {node}: {args[0]} did not finish within {format_duration_s(timeout_s)}"
                ) from None
            except AgentEnded:
                if agent.conn.is_closed():
                    self._lost(st, agent.conn, "connection lost")
                    raise BackendError(f"node {node}: connection lost during {args[0]}") from None
                sudo_refused(st.cfg, user, agent.exit_status, agent.stderr)
                if not agent.answered and not agent.evicted:
                    _log.warning(
                        "node %s: its agent does not serve requests (%s); each command starts "
                        "one (update jupyter-gpusched there)",
                        node,
                        agent.stderr.strip()[-300:],
                    )
                    st.serving = False
                elif retry:
                    raise BackendError(
                        f"node {node}: the node agent ended during {args[0]}: "
                        f"{agent.stderr.strip()[-500:] or f'exit {agent.exit_status}'}"
                    ) from None
                continue
            return RemoteResult(int(reply["exit"]), json.dumps(reply["answer"]), "")
        raise AssertionError("unreachable: the second try returns or raises")

    async def _launch_checked(
        self,
        st: _Node,
        user: str | None,
        agent: ServingAgent,
        args: Sequence[str],
        input: str | None,
        timeout_s: float,
    ) -> dict[str, Any]:
        """``agent.call``; a launch its agent holds back (``recheck``) goes once sudo agrees.

        Raises :class:`AccountError` when sudo no longer lets the scheduler run the agent as
        ``user`` (the serving agent stays: it still answers for the jobs already running).
        """
        asked = list(args)
        for _ in range(3):
            reply = await agent.call(asked, input, timeout_s)
            answer = reply.get("answer")
            if reply.get("exit") != 1 or not isinstance(answer, dict) or "recheck" not in answer:
                return reply
            assert user is not None  # only an owner's agent, started by sudo, holds back
            check = sudo_check_argv(st.cfg, self._serve_argv(st.cfg, user), user)
            said = await self.run(st.cfg.name, check, timeout_s=30.0)
            if said.exit_status != 0:
                raise sudo_check_failed(st.cfg, user, said.stderr)
            # sudo agreed after the fingerprint the agent sent was taken: launch under it
            asked = [args[0], "--accounts-checked", str(answer["recheck"]), *args[1:]]
        raise NodeRefusedError(
            f"node {st.cfg.name}: its accounts or sudoers changed during each of 3 launches "
            "of this job; it is launched again later"
        )

    @staticmethod
    def _serve_argv(cfg: NodeConfig, user: str | None) -> list[str]:
        """The serving agent's argv; one sudo starts watches what sudo's answer rests on."""
        watch = ["--watch-accounts"] if user is not None and cfg.run_as == "sudo" else []
        return [*cfg.agent_argv(), "serve", *watch]

    async def _serving(self, st: _Node, user: str | None) -> ServingAgent | None:
        """The node's serving agent for ``user``, started when missing; None: use a fresh one."""
        agent = st.agents.get(user)
        if agent is not None and not agent.closed:
            st.agents.move_to_end(user)
            return agent
        async with st.agents_lock:
            agent = st.agents.get(user)
            if agent is not None and not agent.closed:
                return agent
            cap = self.kept_agents(st.cfg) if st.serving else 0
            idle = [a for a in st.agents.values() if not a.busy]  # least recently used first
            while idle and len(st.agents) >= cap:
                oldest = idle.pop(0)
                oldest.evicted = True
                oldest.close()
            if len(st.agents) >= cap:
                return None  # every serving agent is answering someone: a fresh agent
            line = command_line(st.cfg, self._serve_argv(st.cfg, user), user)
            conn = await self._connect(st, user)
            with self._translated(st, conn, "starting the node agent"):
                process = await open_process(conn, line, encoding="utf-8")

            def closed(agent: ServingAgent) -> None:
                if st.agents.get(user) is agent:
                    del st.agents[user]

            st.agents[user] = agent = ServingAgent(process, conn, closed)
            return agent
