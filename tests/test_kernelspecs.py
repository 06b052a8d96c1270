"""GPU kernelspecs: the ones the package installs, the ones a lab adds, what a notebook asks."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.provisioning import KernelProvisionerFactory

from jupyter_gpusched.cli import app as cli
from jupyter_gpusched.client.kernelspecs import (
    LOGO,
    PROVISIONER_NAME,
    describe,
    kernel_spec,
    lease_fields,
    notebook_fields,
)
from jupyter_gpusched.core.errors import InvalidSpecError

REPO = Path(__file__).resolve().parents[1]
SHIPPED = {
    "gpusched-1gpu": ("Python 3 (1 GPU)", {"gpus": 1}),
    "gpusched-1gpu-24gb": ("Python 3 (1 GPU, 24 GB share)", {"gpus": 1, "gpu_mem_gb": 24.0}),
}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_the_package_ships_gpu_kernelspecs_the_launcher_finds(name: str) -> None:
    display, fields = SHIPPED[name]
    shipped = json.loads((REPO / "kernelspecs" / name / "kernel.json").read_text())
    assert shipped == kernel_spec(fields)  # written by kernel_spec: regenerate when it changes
    assert shipped["display_name"] == display
    assert (REPO / "kernelspecs" / name / "logo-svg.svg").read_bytes() == Path(LOGO).read_bytes()
    # installed with the package (wheel shared-data), and its provisioner is found
    found = KernelSpecManager().get_kernel_spec(name)
    assert found.display_name == display and found.interrupt_mode == "message"
    assert KernelProvisionerFactory.instance().is_provisioner_available(found)
    provisioner = found.metadata["kernel_provisioner"]
    assert provisioner == {"provisioner_name": PROVISIONER_NAME, "config": fields}


@pytest.mark.parametrize(
    ("sources", "fields"),
    [
        (({"gpus": 1}, {"gpus": 2, "gpu_models": "A100"}), {"gpus": 2, "gpu_models": ["A100"]}),
        (({"gpus": 1, "gpu_mem_gb": 24}, {"gpu_mem_gb": "40G"}), {"gpus": 1, "gpu_mem_gb": 40.0}),
        (({"gpus": 1, "gpu_mem_gb": 24}, {"gpu_mem_gb": None}), {"gpus": 1}),
        (({"max_runtime_s": "2h", "mem_gb": "512M"},), {"max_runtime_s": 7200.0, "mem_gb": 0.5}),
    ],
)
def test_later_sources_override_earlier_ones_and_values_read_as_typed(
    sources: tuple[dict[str, Any], ...], fields: dict[str, Any]
) -> None:
    assert lease_fields(*sources) == fields


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"gpu": 2}, "metadata.gpusched.kernel.gpu: unknown field; use one of gpus, "),
        ({"gpus": "two"}, "metadata.gpusched.kernel.gpus: invalid literal"),
        ({"gpu_mem_gb": "lots"}, "metadata.gpusched.kernel.gpu_mem_gb: 'lots' is not a size"),
    ],
)
def test_a_bad_notebook_request_names_the_field_to_fix(
    tmp_path: Path, source: dict[str, Any], message: str
) -> None:
    nb = tmp_path / "bad.ipynb"
    nb.write_text(json.dumps({"cells": [], "metadata": {"gpusched": {"kernel": source}}}))
    with pytest.raises(InvalidSpecError) as err:
        notebook_fields(str(nb))
    assert err.value.message.startswith(message)


def test_a_notebook_without_a_request_or_not_yet_saved_asks_for_nothing(tmp_path: Path) -> None:
    nb = tmp_path / "plain.ipynb"
    nb.write_text(json.dumps({"cells": [], "metadata": {"gpusched": {"status": "done"}}}))
    assert notebook_fields(str(nb)) == {}
    assert notebook_fields(str(tmp_path / "Untitled.ipynb")) == {}
    assert notebook_fields(None) == {}


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"gpus": 1}, "1 GPU"),
        ({"gpus": 2, "gpu_mem_gb": 40, "gpu_models": ["A100"]}, "2 GPUs, 40 GB each, A100"),
        ({"gpus": 1, "gpu_mem_gb": 24}, "1 GPU, 24 GB share"),
        ({"gpus": 1, "gpu_share": 0.5}, "1 GPU, 0.5 of a GPU"),
    ],
)
def test_display_names_say_what_the_kernel_asks_for(fields: dict[str, Any], words: str) -> None:
    assert describe(fields) == words
    assert kernel_spec(fields)["display_name"] == f"Python 3 ({words})"


def test_kernelspec_add_installs_a_lab_s_own_gpu_kernel_and_list_shows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        capsys,
        *("kernelspec", "add", "--gpus", "2", "--gpu-mem", "40G", "--model", "A100"),
        *("--name", "a100x2", "--prefix", str(tmp_path)),
    )
    where = tmp_path / "share" / "jupyter" / "kernels" / "a100x2"
    assert (code, out) == (
        0,
        f"installed kernelspec a100x2 (Python 3 (2 GPUs, 40 GB each, A100)) in {where}\n",
    )
    spec = json.loads((where / "kernel.json").read_text())
    assert spec == kernel_spec({"gpus": 2, "gpu_mem_gb": 40, "gpu_models": ["A100"]})
    assert (where / "logo-svg.svg").exists()
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "share" / "jupyter"))
    code, out, _ = run(capsys, "kernelspec", "list")
    rows = [re.split(r"\s{2,}", line) for line in out.splitlines()]
    assert code == 0
    assert rows == [
        ["a100x2", "Python 3 (2 GPUs, 40 GB each, A100)", "2 GPUs, 40 GB each, A100"],
        ["gpusched-1gpu", "Python 3 (1 GPU)", "1 GPU"],
        ["gpusched-1gpu-24gb", "Python 3 (1 GPU, 24 GB share)", "1 GPU, 24 GB share"],
    ]
    shutil.rmtree(tmp_path / "share")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["add"], "add needs --name, e.g. --name a100x2"),
        (["add", "--name", "a b"], "argument --name: 'a b' may hold only letters, digits"),
        (["add", "--name", "x", "--gpus", "two"], "argument --gpus: 'two' is not a whole number"),
        (["add", "--name", "x", "--gpus", "2", "--share", "0.5"], "gpus: a fractional gpu_share"),
        (["add", "--name", "x", "--user", "--sys-prefix"], "give at most one of --user, "),
        (["remove", "x"], "argument verb: 'remove' is not one of add, list"),
    ],
)
def test_bad_kernelspec_arguments_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, "kernelspec", *argv)
    assert (code, out) == (2, "")
    assert err.startswith(f"jupyter gpusched kernelspec: error: {message}"), err
    assert len(err.splitlines()) == 1
