"""The quick ``jupyter gpusched queue`` on a live server: the full app's output, fewer imports."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, tzinfo
from typing import Any

import pytest
from _fixtures_polling import wait_for
from _fixtures_server import FAR_FUTURE

from jupyter_gpusched.cli import app as cli
from jupyter_gpusched.cli import queue_text
from jupyter_gpusched.cli.base import run_command
from jupyter_gpusched.cli.quick import quick_queue
from jupyter_gpusched.client.api import GpuSchedClient
from jupyter_gpusched.core.models import ARRAY_ID_LABEL, ARRAY_INDEX_LABEL

#: One instant for both paths' tables: ages and expected starts are written from "now".
NOW = datetime.now(UTC).replace(microsecond=0)


class _Frozen(datetime):
    @classmethod
    def now(cls, tz: tzinfo | None = None) -> Any:  # noqa: D102
        return NOW.astimezone(tz) if tz is not None else NOW.replace(tzinfo=None)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A server holding a job of each kind the table shows: running, waiting, held, an array."""
    from _fixtures_server import ServerProcess

    server = ServerProcess(tmp_path_factory.mktemp("quick")).start()
    client = GpuSchedClient(server.url, server.token)
    a100 = {"kind": "script", "gpus": 4, "gpu_models": ["A100-80GB"], "max_runtime_s": 3600}
    done = client.submit(kind="script", command=["true"], gpus=0, name="résumé")
    running = client.submit(**a100, command=["sleep", "300"], name="train")
    wait_for(lambda: client.get_job(running.id), lambda j: j.state == "running", what="a start")
    client.submit(**a100, command=["python", "eval.py", "--fold", "3"])  # waits behind it
    held = client.submit(**a100, command=["sleep", "1"])
    client.update(held.id, held=True)
    client.submit(kind="script", command=["true"], gpus=1, gpu_mem_gb=16, not_before=FAR_FUTURE)
    server.array_id = client.submit_array(
        5, kind="script", command=["true"], gpus=0, not_before=FAR_FUTURE
    ).array_id
    wait_for(lambda: client.get_job(done.id), lambda j: j.state == "succeeded", what="the end")
    yield server
    server.stop()


@pytest.fixture
def discovered(server: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The commands find the server through the running-server files; one clock for both."""
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", server.env["JUPYTER_RUNTIME_DIR"])
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", server.env["JUPYTER_CONFIG_DIR"])
    monkeypatch.delenv("GPUSCHED_URL", raising=False)
    monkeypatch.delenv("GPUSCHED_TOKEN", raising=False)
    monkeypatch.setattr(queue_text, "datetime", _Frozen)
    return server


def _full(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    from jupyter_gpusched.cli.commands import GpuSchedCLI

    code = run_command(GpuSchedCLI, argv)
    return (code, *capsys.readouterr())


def _quick(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int | None, str, str]:
    code = quick_queue(argv)
    return (code, *capsys.readouterr())


@pytest.mark.parametrize(
    "options",
    [
        [],
        ["--all"],
        ["--state", "queued"],
        ["--state=queued,running", "--limit", "2"],
        ["--user", "me"],
        ["--user=nobody"],
        ["--all", "--limit=3"],
        ["--array", "ARRAY"],
        ["--json"],
        ["--all", "--json", "--limit", "2"],
        ["--array", "ARRAY", "--json"],
    ],
)
def test_the_quick_queue_prints_what_the_full_app_prints(
    discovered: Any, capsys: pytest.CaptureFixture[str], options: list[str]
) -> None:
    argv = ["queue", *(str(discovered.array_id) if o == "ARRAY" else o for o in options)]
    quick = _quick(capsys, argv)
    full = _full(capsys, argv)
    if quick != full:  # a scheduling pass between the two may move an expected start: again
        quick, full = _quick(capsys, argv), _full(capsys, argv)
    assert quick[0] == 0, quick  # taken by the quick path, and it worked
    assert quick == full
    if "--json" not in options and "--user=nobody" not in options:
        assert quick[1].startswith("ID ")
    if options == []:
        rows = quick[1].partition("\n\nwaiting:")[0].splitlines()[1:]
        assert len(rows) == 6 and "running" in rows[0] and "1st in line" in rows[1]
        assert rows[2].endswith("held") and rows[5].startswith(f"{discovered.array_id}_[1-4] ")


def test_the_quick_queue_tells_the_rest_and_the_array_as_the_full_app(
    discovered: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _quick(capsys, ["queue", "--all", "--limit", "1"])
    assert code == 0 and out.splitlines()[3] == "... 5 more (use --limit)"  # 6 jobs, 1 array
    code, out, _ = _quick(capsys, ["queue", "--json"])
    page = json.loads(out)
    assert [a["id"] for a in page["arrays"]] == [discovered.array_id]
    assert page["total"] == 5 and len(page["jobs"]) == 5  # running, 3 queued, task 0


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--stat", "queued"], "unknown option --stat; did you mean --state?"),
        (["--limit", "two"], "argument --limit: 'two' is not a whole number"),
        (["--al"], "unknown option --al; did you mean --all?"),
        (["extra"], "unrecognized arguments: extra"),
        (["--json=yes"], "--json"),
    ],
)
def test_a_misspelt_or_bad_option_is_the_full_apps_to_explain(
    discovered: Any, capsys: pytest.CaptureFixture[str], options: list[str], said: str
) -> None:
    assert quick_queue(["queue", *options]) is None
    code = cli.main(["queue", *options])
    _, err = capsys.readouterr()
    assert code == 2 and said in err and err.startswith("jupyter gpusched queue: error:")


def test_help_and_trait_options_go_to_the_full_app(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["queue", "--help"], ["queue", "--QueueApp.limit=1"], ["nodes"], []):
        assert quick_queue(argv) is None
    assert cli.main(["queue", "--help"]) == 0
    assert "--QueueApp.limit" in capsys.readouterr().out


def test_a_config_file_sends_the_queue_to_the_full_app(
    discovered: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path))
    assert quick_queue(["queue", "--url", discovered.url, "--token", discovered.token]) == 0
    (tmp_path / "jupyter_gpusched_config.json").write_text('{"QueueApp": {"limit": 1}}')
    assert quick_queue(["queue"]) is None


def test_the_quick_queue_imports_neither_pydantic_nor_the_traitlets_app(discovered: Any) -> None:
    code = (
        "import sys\n"
        "from jupyter_gpusched.cli.app import main\n"
        "code = main(['queue', '--all', '--limit', '3'])\n"
        "heavy = {'pydantic', 'traitlets', 'jupyter_core.application', 'asyncio',\n"
        "         'jupyter_gpusched.core.api', 'jupyter_gpusched.core.models',\n"
        "         'jupyter_gpusched.client.api', 'jupyter_server', 'tornado'}\n"
        "print(sorted(heavy & set(sys.modules)), code, file=sys.stderr)\n"
    )
    env = {k: v for k, v in discovered.env.items() if not k.startswith("GPUSCHED_")}
    ran = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert ran.stderr.strip() == "[] 0"
    assert ran.stdout.startswith("ID ") and "... 3 more (use --limit)" in ran.stdout


def test_the_table_reads_an_array_task_by_the_models_labels() -> None:
    assert queue_text.ARRAY_LABELS == (ARRAY_ID_LABEL, ARRAY_INDEX_LABEL)
