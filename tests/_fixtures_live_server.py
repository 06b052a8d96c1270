"""One live ``jupyter server`` subprocess (embedded cluster) and real kernels that talk to it.

Use it as a plugin (``pytest_plugins = ["_fixtures_live_server"]``): ``live_server`` is then one
server for the whole session, shared by the modules that ask for it (each test leaves the
cluster as it found it). Kernels get ``GPUSCHED_URL``/``GPUSCHED_TOKEN`` as kernels started by
that server would.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from _fixtures_server import ServerProcess
from nbclient import NotebookClient


@pytest.fixture(scope="session")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A started server subprocess; stopped (and its simulated jobs killed) afterwards."""
    server = ServerProcess(tmp_path_factory.mktemp("live")).start()
    try:
        yield server
    finally:
        server.stop()


def dir_in_root(server: ServerProcess, prefix: str) -> Path:
    """A fresh directory under the server's root, where a user's notebooks (and the files
    their jobs stage) live: the server takes them from nowhere else."""
    import tempfile

    base = server.root / "work"
    base.mkdir(exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def kernel_env(server: ServerProcess, **extra: str) -> dict[str, str]:
    """The environment of a kernel started by ``server`` (it exports its URL and token)."""
    env = {**os.environ, "GPUSCHED_URL": server.url, "GPUSCHED_TOKEN": server.token, **extra}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def api(server: ServerProcess, method: str, path: str, body: Any = None) -> Any:
    """One REST call as the server's token holder; the JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        server.url + "gpusched/api/" + path,
        data=data,
        method=method,
        headers={"Authorization": f"token {server.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def notebook(*sources: str) -> nbformat.NotebookNode:
    """A notebook of code cells."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    return nb


def execute(
    nb: nbformat.NotebookNode,
    server: ServerProcess,
    cwd: Path,
    *,
    timeout_func: Callable[[Any], int | None] | None = None,
    allow_errors: bool = True,
) -> nbformat.NotebookNode:
    """Run ``nb`` top to bottom in a fresh python3 kernel whose server is ``server``."""
    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=120,
        allow_errors=allow_errors,
        interrupt_on_timeout=True,
        timeout_func=timeout_func,
        resources={"metadata": {"path": str(cwd)}},
    )
    client.execute(env=kernel_env(server))
    return nb


def outputs(cell: Any, output_type: str | None = None) -> list[Any]:
    """A cell's outputs, of one type if given."""
    return [o for o in cell.outputs if output_type is None or o.output_type == output_type]


def text(cell: Any) -> str:
    """Everything a cell printed (stdout and stderr streams)."""
    return "".join(o.text for o in outputs(cell, "stream"))
