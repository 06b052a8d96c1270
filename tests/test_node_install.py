"""A GPU node's install: the package without extras runs the agent, and nothing of the server.

The slow test installs the wheel into a fresh virtual environment without pip's index: the
wheel is built from this checkout without build isolation (the built lab extension is reused,
so no jlpm runs), its base requirements are resolved against the distributions of this test
environment and linked into the new one, ``pip install --no-deps --no-index`` installs the
wheel, and ``pip check`` proves that set complete. The node's venv then has exactly what
``pip install jupyter-gpusched`` would give it, at this environment's versions.
"""

from __future__ import annotations

import email.parser
import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from _fixtures_notebooks import read_notebook, write_notebook
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from jupyter_gpusched.cluster.sim.specs import DEFAULT_SIM_NODES, gpu_state

REPO_ROOT = Path(__file__).resolve().parents[1]
# Dependencies of the Jupyter host only: a node install must neither pull nor import them.
SERVER_ONLY = ["jupyter_server", "sqlalchemy", "asyncssh", "alembic", "numpy", "pydantic"]
SERVER_LAYERS = ["server", "scheduling", "store", "packing", "cluster.ssh", "client", "cli"]
NODE_MODULES = ["jupyter_gpusched.node." + m for m in ("agent", "probe", "kernel", "nbrun")]
SIM_NVML = "jupyter_gpusched.cluster.sim.nvml"


def imported_by(python: str, *modules: str) -> set[str]:
    """The modules a fresh ``python`` holds after importing ``modules``."""
    code = f"import sys, {', '.join(modules)}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def server_side(modules: set[str]) -> list[str]:
    """Which of ``modules`` belong to the Jupyter host's side."""
    ours = tuple(f"jupyter_gpusched.{layer}" for layer in SERVER_LAYERS)
    return sorted(m for m in modules if m.split(".")[0] in SERVER_ONLY or m.startswith(ours))


def test_the_node_modules_import_nothing_of_the_server_side() -> None:
    assert server_side(imported_by(sys.executable, "jupyter_gpusched", *NODE_MODULES)) == []


# ------------------------------------------------------------------------ the node's venv


def base_requirements(wheel: Path) -> list[Requirement]:
    """The wheel's requirements without extras (what ``pip install`` of it pulls)."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(zf.read(name).decode())
    reqs = [Requirement(r) for r in metadata.get_all("Requires-Dist") or []]
    return [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]


def resolve(requirements: list[Requirement]) -> dict[str, md.Distribution]:
    """The installed distributions those requirements need, transitively, extras included."""
    found: dict[str, md.Distribution] = {}
    extras: dict[str, set[str]] = {}
    todo = list(requirements)
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in found and set(req.extras) <= extras[name]:
            continue
        dist = found.get(name) or md.distribution(req.name)
        assert dist.version in req.specifier or not req.specifier, (req, dist.version)
        found[name] = dist
        extras[name] = extras.get(name, set()) | set(req.extras)
        for line in dist.requires or []:
            sub = Requirement(line)
            wanted = ["", *sorted(extras[name])]
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in wanted):
                todo.append(sub)
    return found


def link_into(dist: md.Distribution, site: Path) -> None:
    """Put a distribution's files (its RECORD) into another site-packages, as pip would."""
    assert dist.files is not None, f"{dist.name} has no RECORD"
    for file in dist.files:
        if file.parts[0] == "..":  # scripts and data outside site-packages: not needed
            continue
        target = site / file
        target.parent.mkdir(parents=True, exist_ok=True)
        source = Path(dist.locate_file(file))
        if not source.exists() or target.exists():
            continue  # a .pyc never written, or a file two distributions share
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)


def run(*argv: str | Path) -> str:
    """Run a command that must succeed; its stdout."""
    out = subprocess.run([str(a) for a in argv], capture_output=True, text=True)
    assert out.returncode == 0, f"{argv}: {out.stdout}{out.stderr}"
    return out.stdout


@pytest.fixture(scope="module")
def node_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Python of a fresh venv holding the wheel and its base requirements only."""
    if not (REPO_ROOT / "jupyter_gpusched" / "labextension" / "package.json").exists():
        pytest.fail("the lab extension is not built; run `make test` (pip install -e .) first")
    root = tmp_path_factory.mktemp("node")
    pip = [sys.executable, "-m", "pip"]
    run(*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", root, REPO_ROOT)
    (wheel,) = root.glob("jupyter_gpusched-*.whl")
    venv.create(root / "venv", with_pip=False)
    python = str(root / "venv" / "bin" / "python")
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").strip())
    for dist in resolve(base_requirements(wheel)).values():
        link_into(dist, site)
    run(*pip, "--python", python, "install", "-q", "--no-deps", "--no-index", wheel)
    run(*pip, "--python", python, "check")
    return python


@pytest.mark.slow
def test_a_node_install_has_none_of_the_servers_dependencies(node_python: str) -> None:
    code = f"import importlib.util as u; print([m for m in {SERVER_ONLY!r} if u.find_spec(m)])"
    out = subprocess.run([node_python, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_the_agent_probes_a_node_and_imports_only_the_node_side(
    node_python: str, tmp_path: Path
) -> None:
    state = tmp_path / "gpus.json"
    state.write_text(json.dumps(gpu_state(DEFAULT_SIM_NODES[0])))
    env = {**os.environ, "GPUSCHED_NVML_MODULE": SIM_NVML, "GPUSCHED_SIM_STATE": str(state)}
    probe = [node_python, "-X", "importtime", "-m", "jupyter_gpusched.node.agent", "probe"]
    out = subprocess.run(probe, capture_output=True, text=True, env=env, cwd=tmp_path)

    assert out.returncode == 0, out.stderr[-2000:]
    answer = json.loads(out.stdout)
    assert answer["source"] == "nvml"
    assert [g["model"] for g in answer["gpus"]] == ["A100-80GB"] * 8
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines()[1:]}
    # importlib.import_module (how the probe loads the NVML module) is not traced; its imports are
    assert {"jupyter_gpusched", "jupyter_gpusched.node.probe", "pynvml"} <= imported
    assert server_side(imported) == []


@pytest.mark.slow
def test_the_agent_without_a_gpu_reports_none(node_python: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCHED_")}
    probe = [node_python, "-m", "jupyter_gpusched.node.agent", "probe"]
    out = subprocess.run(probe, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    answer = json.loads(out.stdout)
    assert answer["cpus"] >= 1 and isinstance(answer["gpus"], list)
    if answer["source"] == "none":  # the real NVML found no driver (no GPU here)
        assert answer["gpus"] == []


@pytest.mark.slow
def test_nbrun_runs_a_notebook_on_a_node_install(node_python: str, tmp_path: Path) -> None:
    write_notebook(tmp_path / "nb.ipynb", ["print(n * 2)"], parameters="n = 0")
    run = [node_python, "-m", "jupyter_gpusched.node.nbrun", "nb.ipynb", "--output", "out.ipynb"]
    out = subprocess.run(
        [*run, "--parameters", '{"n": 21}'], capture_output=True, text=True, cwd=tmp_path
    )
    assert out.returncode == 0, out.stdout + out.stderr
    printed = [
        o.get("text")
        for c in read_notebook(tmp_path / "out.ipynb").cells
        for o in c.get("outputs", [])
    ]
    assert printed == ["42\n"]


@pytest.mark.slow
def test_the_server_extension_says_to_install_the_server_extra(node_python: str) -> None:
    code = "import jupyter_gpusched as g; g._jupyter_server_extension_points()"
    out = subprocess.run([node_python, "-c", code], capture_output=True, text=True)
    assert out.returncode == 1
    assert 'pip install "jupyter-gpusched[server]"' in out.stderr.splitlines()[-1]
