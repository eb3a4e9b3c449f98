"""The client on its own (issue 31): `client/` builds offline into a wheel holding only
`connector_push_client`, which installs into a fresh virtualenv without any of the
service's packages and saves through the running save API (SPEC API-1)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import sysconfig
import tomllib
import venv
from pathlib import Path

import asyncpg
import pytest
from pydantic import ValidationError

import connector_push_client as client
import protocol.save_api as server
from tests.e2e.conftest import contact_key
from tests.e2e.save_api_support import CRM_KEY, save_body, save_server, stored

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "client"
SERVICE_PACKAGES = "protocol,workflows,activities,services,db,worker,ingress,cli,sandbox"

# Runs in the fresh virtualenv: the service is not importable, the client is the
# installed one, and one save goes through the API twice under one Idempotency-Key.
SCRIPT = """
import asyncio, importlib.util, json, sys

present = [n for n in sys.argv[4].split(",") if importlib.util.find_spec(n) is not None]
assert not present, f"service packages importable: {present}"

import connector_push_client
from connector_push_client import SaveApiClient, SaveApiError, SaveIn

assert connector_push_client.__file__.startswith(sys.prefix), connector_push_client.__file__


async def main(base_url: str, key: str, body: dict) -> dict:
    save = SaveIn.model_validate(body)
    async with SaveApiClient(base_url, key) as api:
        first = await api.save(save, idempotency_key="alone-1")
        again = await api.save(save, idempotency_key="alone-1")
    async with SaveApiClient(base_url, "not-a-key") as stranger:
        try:
            await stranger.save(save)
            refused = None
        except SaveApiError as error:
            refused = error.status
    return {"first": first.model_dump(mode="json"), "replayed": again.replayed,
            "refused": refused}


print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3])))))
"""


def _run(*command: str | Path) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, f"{command}: {done.stderr}"
    return done.stdout.strip()


def _pip(*args: str | Path) -> None:
    # No index and no dependencies (each call says so, with or without build isolation):
    # nothing may be downloaded.
    _run(sys.executable, "-m", "pip", "--no-input", *args, "--no-index")


def _requirement_names(requirements: list[str]) -> dict[str, str]:
    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower(): r for r in requirements}


def _fresh_venv_with_the_client(work: Path) -> Path:
    """A new virtualenv with `pip install ./client` in it, nothing downloaded: the client's
    backend (flit_core), httpx and pydantic come from the project's environment by one
    path line, which runs none of that directory's own .pth files (the service's editable
    install stays out)."""
    venv.create(work / "venv", with_pip=False)
    python = work / "venv" / "bin" / "python"
    purelib = Path(
        _run(python, "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))")
    )
    (purelib / "project-dependencies.pth").write_text(sysconfig.get_path("purelib"))
    _pip("--python", python, "install", "--no-deps", "--no-build-isolation", CLIENT)
    (record,) = purelib.glob("connector_push_client-*.dist-info/RECORD")
    installed = {line.split("/")[0] for line in record.read_text().splitlines()}
    assert installed == {"connector_push_client", record.parent.name}
    metadata = (record.parent / "METADATA").read_text()
    requires = re.findall(r"^Requires-Dist: (\S+)", metadata, re.M)
    assert set(_requirement_names(requires)) == {"httpx", "pydantic"}
    return python


def test_the_client_declares_the_services_own_httpx_and_pydantic_ranges() -> None:
    """Two distributions state the ranges twice; they must not drift apart."""
    service = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    client = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert _requirement_names(client) == {
        name: requirement
        for name, requirement in _requirement_names(service).items()
        if name in ("httpx", "pydantic")
    }


def test_protocol_takes_the_clients_wire_models_without_importing_httpx() -> None:
    """`protocol.save_api` refines `connector_push_client.models`; protocol stays pure."""
    probe = "import sys, protocol.save_api; print(sorted(m for m in sys.modules if 'httpx' in m))"
    assert _run(sys.executable, "-c", probe) == "[]"


def test_the_client_reads_a_newer_servers_answer_and_the_server_only_its_own() -> None:
    """Answers evolve by adding (a field, a reject reason): the client parses them; the
    server's refinements read back only what it writes."""
    newer = {
        "result": {
            "decision": "rejected",
            "linkKey": "lk1_0",
            "workflowId": "link/lk1_0",
            "reason": "a_reason_added_later",
            "addedLater": 1,
        },
        "addedLater": True,
    }
    assert client.SaveAnswer.model_validate(newer).result.reason == "a_reason_added_later"
    with pytest.raises(ValidationError) as refused:
        server.SaveAnswer.model_validate(newer)
    assert {e["loc"] for e in refused.value.errors()} == {
        ("result", "reason"),
        ("result", "addedLater"),
        ("addedLater",),
    }


def test_the_identity_part_rule_is_the_servers_on_the_clients_fields() -> None:
    """ID-2's rule (protocol.identity) is applied by the server's SaveIn, named by alias,
    and by the client before it sends (tests/unit/test_client_refusals.py, every field)."""
    padded = save_body(recordId=" c-001")
    with pytest.raises(ValidationError) as refused_here:
        client.SaveIn.model_validate(padded)
    with pytest.raises(ValidationError) as refused:
        server.SaveBatchIn.model_validate({"saves": [padded]})
    (problem,) = refused.value.errors()
    assert problem["loc"] == ("saves", 0, "recordId") and "whitespace" in problem["msg"]
    assert [e["msg"] for e in refused_here.value.errors()] == [problem["msg"]]


@pytest.mark.slow(seconds=25)
async def test_the_client_installed_alone_saves_through_the_running_api(
    demo_db: asyncpg.Pool, db_dsn: str, tmp_path: Path
) -> None:
    python = _fresh_venv_with_the_client(tmp_path)
    (tmp_path / "save.py").write_text(SCRIPT)
    async with save_server(db_dsn) as live:
        process = await asyncio.create_subprocess_exec(
            python,
            "-I",  # no PYTHONPATH, no user site, not the script's directory
            tmp_path / "save.py",
            live.base_url,
            CRM_KEY,
            json.dumps(save_body()),
            SERVICE_PACKAGES,
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, err.decode()
    answer = json.loads(out)
    key = contact_key("c-001")
    assert answer["first"]["result"]["decision"] == "create_reserved"
    assert answer["first"]["result"]["link_key"] == key
    assert answer["replayed"] is True and answer["refused"] == 401
    assert (await stored(demo_db))["connector_push_attempt"] == 1
    row = await demo_db.fetchrow(
        "SELECT status FROM connector_push_attempt WHERE link_key = $1", key
    )
    assert row is not None and row["status"] == "pending"
