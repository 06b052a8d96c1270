"""Run one notebook on a GPU node: ``python -m jupyter_gpusched.node.nbrun INPUT --output OUT ...``.

Started by the scheduler as a notebook job's command (see :mod:`jupyter_gpusched.batch.notebooks`).
Its parameters come as a JSON file (``--parameters-env GPUSCHED_PARAMETERS_FILE``: the file that
variable names, 0600 in the private job dir, which the node agent writes), never on the command
line, which every user of the node reads (``ps``); ``--parameters JSON`` is for running it by
hand. They are injected the
papermill way (:func:`papermill.parameterize.parameterize_notebook`:
a cell tagged ``injected-parameters`` after the one tagged ``parameters``, values written as
literals of the kernel's language, so types survive), then nbclient executes the notebook.

The executed notebook is written to ``--output`` after every cell and at the end, *also when
execution fails, times out or is stopped*: the failing cell keeps its traceback and a markdown
cell above it says what happened. Progress goes to stdout (the job's log) as lines::

    ##gpusched-progress {"cell": 3, "of": 7, "index": 5, "source": "model.fit(x, y)"}

which the server turns into ``progress`` events. Cell outputs are echoed to the log as well.

Exit status: 0 success, 1 a cell failed (or timed out), 2 bad input, 124 the job's time limit,
143 stopped by SIGTERM (cancel, preemption).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime
from typing import Any

from jupyter_gpusched.core.progress import PROGRESS_MARK
from jupyter_gpusched.core.units import format_duration_s

#: Longest cell source line reported in a progress line.
SOURCE_CHARS = 200
#: Exit statuses, as documented above.
EXIT_CELL_FAILED, EXIT_BAD_INPUT, EXIT_JOB_TIMEOUT, EXIT_TERMINATED = 1, 2, 124, 143


def first_line(source: str) -> str:
    """The first non-blank, non-comment line of a cell (the whole first line if all are)."""
    lines = [ln.strip() for ln in source.splitlines() if ln.strip()]
    code = [ln for ln in lines if not ln.startswith("#")]
    line = (code or lines or [""])[0]
    return line[: SOURCE_CHARS - 1] + "…" if len(line) > SOURCE_CHARS else line


def progress_line(**detail: Any) -> str:
    """One machine-readable progress line (without the newline)."""
    return PROGRESS_MARK + json.dumps(detail, ensure_ascii=False, separators=(", ", ": "))


class _Stop(Exception):
    """Execution was stopped from outside (time limit or SIGTERM)."""


class _Runner:
    """One execution: the notebook in memory, written out whenever something happened."""

    def __init__(
        self,
        nb: Any,
        output: str,
        *,
        kernel_name: str,
        cwd: str,
        cell_timeout_s: float | None,
        job_timeout_s: float | None,
    ) -> None:
        self.nb = nb
        self.output = output
        self.kernel_name = kernel_name
        self.cwd = cwd
        self.cell_timeout_s = cell_timeout_s
        self.job_timeout_s = job_timeout_s
        self.stop_reason: str | None = None
        self.exit_code: int | None = None
        self.current: int | None = None  # index of the cell executing now
        self.code_cells = [
            i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.strip()
        ]
        self._at_line_start = True
        self._task: asyncio.Task[Any] | None = None

    # -- log output -------------------------------------------------------------------------
    def echo(self, text: str) -> None:
        """Cell output into the log, keeping progress marks at the start of a line."""
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()
            self._at_line_start = text.endswith("\n")

    def progress(self, **detail: Any) -> None:
        """Write one progress line."""
        prefix = "" if self._at_line_start else "\n"
        sys.stdout.write(prefix + progress_line(**detail) + "\n")
        sys.stdout.flush()
        self._at_line_start = True

    # -- writing the notebook -------------------------------------------------------------
    def write(self) -> None:
        """Write the notebook as it is now, atomically (a reader never sees half a file)."""
        import nbformat

        tmp = f"{self.output}.tmp{os.getpid()}"
        # 0600 whatever the job's umask: it holds the parameters (metadata, injected cell)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            nbformat.write(self.nb, f)
        os.replace(tmp, self.output)

    # -- stopping --------------------------------------------------------------------------
    def stop(self, reason: str, code: int) -> None:
        """Stop from outside: save what ran so far at once, then cancel the execution."""
        if self.stop_reason is not None:
            return
        self.stop_reason, self.exit_code = reason, code
        self.progress(stopping=reason)
        self._mark_failure(self.current, "Stopped", reason, [])
        self.write()  # before the kernel shuts down: SIGKILL may follow soon
        if self._task is not None:
            self._task.cancel()

    def _mark_failure(
        self, index: int | None, ename: str, evalue: str, traceback: list[str]
    ) -> None:
        """Note the failure in the notebook: metadata, a banner cell, an error output."""
        import nbformat

        meta = self.nb.metadata.setdefault("gpusched", {})
        if meta.get("status") == "failed":
            return
        meta.update(status="failed", error={"ename": ename, "evalue": evalue})
        if index is None:
            return
        cell = self.nb.cells[index]
        if not any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
            cell.setdefault("outputs", []).append(
                nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=traceback)
            )
        number = self.code_cells.index(index) + 1 if index in self.code_cells else index + 1
        meta["failed_cell"] = number
        banner = nbformat.v4.new_markdown_cell(
            f'<span style="color:red; font-weight:bold">gpusched: execution stopped in the '
            f"cell below (code cell {number} of {len(self.code_cells)}): {ename}: {evalue}"
            "</span>"
        )
        banner.metadata["tags"] = ["gpusched-error"]
        self.nb.cells.insert(index, banner)
        self.current = None  # indices moved; nothing else refers to them after a failure

    # -- running ---------------------------------------------------------------------------
    async def run(self) -> int:
        """Execute every cell; the exit status."""
        from nbclient import NotebookClient
        from nbclient.exceptions import CellExecutionError, CellTimeoutError
        from traitlets.config import Config

        runner = self
        total = len(self.code_cells)

        class Client(NotebookClient):  # type: ignore[misc]
            def output(
                self, outs: Any, msg: dict[str, Any], display_id: Any, cell_index: int
            ) -> Any:
                content = msg.get("content", {})
                if msg.get("msg_type") == "stream":
                    runner.echo(content.get("text", ""))
                elif msg.get("msg_type") == "error":
                    runner.echo("\n".join(_plain(t) for t in content.get("traceback", [])) + "\n")
                return super().output(outs, msg, display_id, cell_index)

        async def on_start(notebook: Any) -> None:
            # nbclient installs its own SIGTERM handler (kernel cleanup); ours must win so the
            # notebook is saved first.
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(
                signal.SIGTERM,
                self.stop,
                "stopped by SIGTERM (cancelled or preempted)",
                EXIT_TERMINATED,
            )

        async def on_execute(cell: Any, cell_index: int) -> None:
            self.current = cell_index
            number = self.code_cells.index(cell_index) + 1 if cell_index in self.code_cells else 0
            self.progress(cell=number, of=total, index=cell_index, source=first_line(cell.source))

        async def on_executed(cell: Any, cell_index: int, execute_reply: Any) -> None:
            self.write()

        from jupyter_gpusched.node.stage import private_kernel_dirs

        private_kernel_dirs()  # ~/.ipython and Jupyter's runtime folder, when the kernel makes them
        # The kernel talks to us over Unix sockets in a private directory, not loopback TCP:
        # other users of a shared node cannot reach it (and ipykernel has nothing to warn of).
        # A Unix socket path must stay under ~100 bytes: a long TMPDIR falls back to /tmp.
        base = tempfile.gettempdir() if len(tempfile.gettempdir()) <= 60 else "/tmp"
        sockets = tempfile.TemporaryDirectory(prefix="gpusched-kernel-", dir=base)
        client = Client(
            self.nb,
            kernel_name=self.kernel_name,
            timeout=self.cell_timeout_s,
            resources={"metadata": {"path": self.cwd}},
            on_notebook_start=on_start,
            on_cell_execute=on_execute,
            on_cell_executed=on_executed,
            config=Config(
                {"KernelManager": {"transport": "ipc", "ip": os.path.join(sockets.name, "k")}}
            ),
        )
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.stop, "stopped by SIGTERM", EXIT_TERMINATED)
        if self.job_timeout_s is not None:
            loop.call_later(
                self.job_timeout_s,
                self.stop,
                f"job time limit of {format_duration_s(self.job_timeout_s)} reached",
                EXIT_JOB_TIMEOUT,
            )
        self._task = asyncio.ensure_future(client.async_execute())
        try:
            await self._task
        except CellTimeoutError as exc:
            self._fail(
                f"cell timed out after {format_duration_s(self.cell_timeout_s or 0)}",
                exc,
                "CellTimeoutError",
            )
            return EXIT_CELL_FAILED
        except CellExecutionError as exc:
            self._fail(str(exc.evalue or ""), exc, exc.ename or "CellExecutionError")
            return EXIT_CELL_FAILED
        except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001 - reported below
            if self.stop_reason is not None:
                self.write()
                return int(self.exit_code or EXIT_TERMINATED)
            self._fail(str(exc), exc, type(exc).__name__)
            return EXIT_CELL_FAILED
        finally:
            loop.remove_signal_handler(signal.SIGTERM)
            sockets.cleanup()
        if self.stop_reason is not None:  # the stop came just as the last cell ended
            return int(self.exit_code or EXIT_TERMINATED)
        self.nb.metadata.setdefault("gpusched", {})["status"] = "succeeded"
        self.write()
        return 0

    def _fail(self, evalue: str, exc: BaseException, ename: str) -> None:
        index = self.current
        self._mark_failure(index, ename, evalue, [])
        self.write()
        self.echo(f"gpusched: notebook failed: {ename}: {evalue}\n")


def _plain(text: str) -> str:
    """A traceback line without ANSI colours."""
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _language(nb: Any) -> str:
    meta = nb.metadata
    return str(
        meta.get("kernelspec", {}).get("language")
        or meta.get("language_info", {}).get("name")
        or "python"
    )


def run(
    input_path: str,
    output: str,
    *,
    parameters: dict[str, Any] | None = None,
    kernel_name: str | None = None,
    cwd: str | None = None,
    cell_timeout_s: float | None = None,
    job_timeout_s: float | None = None,
) -> int:
    """Parameterize and execute ``input_path`` into ``output``; the exit status."""
    import nbformat

    with open(input_path, encoding="utf-8") as f:
        nb = nbformat.read(f, as_version=4)
    kernel = kernel_name or nb.metadata.get("kernelspec", {}).get("name") or "python3"
    if parameters:
        from papermill.parameterize import parameterize_notebook

        # papermill's own engine adds these before parameterizing; its function expects them
        for cell in nb.cells:
            cell.metadata.setdefault("tags", [])
        nb.metadata.setdefault("papermill", {})
        nb = parameterize_notebook(nb, parameters, kernel_name=kernel, language=_language(nb))
    started = datetime.now(UTC)
    nb.metadata["gpusched"] = {
        "status": "running",
        "input": os.path.basename(input_path),
        "parameters": parameters or {},
        "kernel_name": kernel,
        "started_at": started.isoformat(),
        "job_id": os.environ.get("GPUSCHED_JOB_ID"),
        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    runner = _Runner(
        nb,
        output,
        kernel_name=kernel,
        cwd=cwd or os.getcwd(),
        cell_timeout_s=cell_timeout_s,
        job_timeout_s=job_timeout_s,
    )
    runner.write()
    t0 = time.monotonic()
    code = asyncio.run(runner.run())
    meta = nb.metadata["gpusched"]
    meta["ended_at"] = datetime.now(UTC).isoformat()
    meta["duration_s"] = round(time.monotonic() - t0, 3)
    meta["exit_code"] = code
    runner.write()
    runner.progress(done=True, status=meta.get("status"), exit_code=code)
    return code


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m jupyter_gpusched.node.nbrun",
        description="Execute a notebook with parameters (on a GPU node).",
    )
    p.add_argument("input", help="notebook to run")
    p.add_argument(
        "--fallback-input",
        help="path to use when INPUT does not exist here "
        "(the server's path, for nodes that share its filesystem)",
    )
    p.add_argument("--output", required=True, help="where the executed notebook goes")
    given = p.add_mutually_exclusive_group()
    given.add_argument(
        "--parameters",
        help="JSON object of parameters; every user of this machine sees it while this runs",
    )
    given.add_argument(
        "--parameters-env",
        metavar="VAR",
        help="read the parameters from the JSON file the environment variable VAR names "
        "(what the scheduler does: GPUSCHED_PARAMETERS_FILE)",
    )
    p.add_argument("--kernel", help="kernel name (default: the notebook's)")
    p.add_argument("--cwd", help="working directory of the kernel (default: here)")
    p.add_argument("--cell-timeout-s", type=float, help="stop a cell after this long")
    p.add_argument("--job-timeout-s", type=float, help="stop the whole run after this long")
    return p


def _parameters(given: str | None, env: str | None) -> dict[str, Any]:
    """The parameters: ``--parameters``, the file ``--parameters-env`` names, or none."""
    if given is not None:
        text, where = given, "--parameters"
    elif env is not None:
        path = os.environ.get(env)
        if not path:
            raise ValueError(
                f"${env} is not set: the node agent did not hand the parameters over "
                "(is its jupyter-gpusched older than the scheduler's?)"
            )
        with open(path, encoding="utf-8") as f:
            text, where = f.read(), path
    else:
        return {}
    try:
        parameters = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    if not isinstance(parameters, dict):
        raise ValueError(f"{where}: must be a JSON object")
    return parameters


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; see the module docstring."""
    args = _parser().parse_args(argv)
    try:
        parameters = _parameters(args.parameters, args.parameters_env)
    except (OSError, ValueError) as exc:
        print(f"gpusched nbrun: parameters: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    source = args.input
    if not os.path.exists(source) and args.fallback_input and os.path.exists(args.fallback_input):
        source = args.fallback_input
    if not os.path.exists(source):
        print(f"gpusched nbrun: notebook {args.input} not found in {os.getcwd()}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return run(
            source,
            args.output,
            parameters=parameters,
            kernel_name=args.kernel,
            cwd=args.cwd,
            cell_timeout_s=args.cell_timeout_s,
            job_timeout_s=args.job_timeout_s,
        )
    except Exception as exc:  # noqa: BLE001 - one clear line in the job's log
        print(f"gpusched nbrun: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
