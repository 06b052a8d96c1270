"""A 429 over a per-user limit, as the CLI, the typed client and the magic show it: one line.

One server (a subprocess: the clients block) whose policy lets everyone queue one job and
hold one stream; the caller is the server's own user.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _fixtures_server import FAR_FUTURE
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from jupyter_gpusched.cli import app as cli
from jupyter_gpusched.client.api import ApiError, GpuSchedClient, close_websocket

FAR = FAR_FUTURE
ME = getpass.getuser()
FULL = (
    f"{ME} has 1 queued job, the limit (GpuSchedPolicy.limits queued_jobs) is 1: wait for "
    "some to start, or cancel some"
)


@pytest.fixture(scope="module")
def module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A server where everyone may queue 1 job and hold 1 stream, with one job queued."""
    from _fixtures_server import ServerProcess

    server = ServerProcess(
        tmp_path_factory.mktemp("limits"),
        policy={"limits": {"queued_jobs": 1, "streams": 1}},
    ).start()
    client = GpuSchedClient(server.url, server.token)
    client.submit(kind="script", command=["true"], not_before=FAR)
    yield server
    server.stop()


def test_the_cli_prints_the_refusal_in_one_line_and_exits_1(
    module_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    where = ["--url", module_server.url, "--token", module_server.token]
    code = cli.main(["submit", *where, "--at", FAR, "--", "true"])
    out, err = capsys.readouterr()
    assert (code, out, err) == (1, "", f"jupyter gpusched submit: {FULL}\n")


def test_the_client_raises_the_429_once_with_retry_after(module_server: Any) -> None:
    client = GpuSchedClient(module_server.url, module_server.token)
    with pytest.raises(ApiError) as info:
        client.submit(kind="script", command=["true"], not_before=FAR)
    assert (info.value.status, info.value.message, info.value.retry_after_s) == (429, FULL, 30.0)
    assert client.list_jobs(state="queued").total == 1  # not sent again behind the caller's back


def test_the_clients_events_say_the_streams_refusal(module_server: Any) -> None:
    client = GpuSchedClient(module_server.url, module_server.token)
    url = (
        "ws"
        + module_server.url[4:]
        + "gpusched/api/events?"
        + urllib.parse.urlencode({"after": -1})
    )

    async def second_stream() -> ApiError:
        held = await websocket_connect(
            HTTPRequest(url, headers={"Authorization": f"token {module_server.token}"})
        )
        try:
            with pytest.raises(ApiError) as info:
                await anext(aiter(client.events(after=-1)))
            return info.value
        finally:
            await close_websocket(held)

    refused = asyncio.run(second_stream())
    assert (refused.status, refused.retry_after_s) == (429, 10.0)
    assert refused.message.startswith(f"{ME} has 1 stream open")


def test_the_policy_command_asks_the_server_for_the_callers_limits(
    module_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    where = ["--url", module_server.url, "--token", module_server.token]
    assert cli.main(["policy", "--server", "--json", *where]) == 0
    view = json.loads(capsys.readouterr().out)
    assert (view["limits"]["yours"]["queued_jobs"], view["limits"]["yours"]["leases"]) == (1, None)
    assert f"yours ({ME}): queued jobs 1, running jobs unlimited" in view["explanation"]


def test_the_magic_prints_the_refusal_in_one_line(
    module_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from IPython.testing.globalipapp import get_ipython, start_ipython
    from IPython.utils.capture import capture_output

    shell = start_ipython() or get_ipython()  # None when another module started it
    shell.run_line_magic("load_ext", "jupyter_gpusched")
    root = Path(module_server.root)
    (root / "train.py").write_text("print('never')\n")
    monkeypatch.chdir(root)  # files come from inside the server's root
    with capture_output():
        shell.run_line_magic("gpu", f"config --url {module_server.url} --token test-token")
    with capture_output() as captured:
        result = shell.run_cell("%gpu submit train.py --gpus 0")
    assert not result.success
    assert (captured.stdout, captured.stderr) == ("", f"UsageError: {FULL}\n")
