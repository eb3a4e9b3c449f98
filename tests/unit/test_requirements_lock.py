"""requirements.lock keeps up with the ranges it was written from (`make lock`).

`make venv` installs the lock alone (pip --require-hashes), never pyproject.toml's
ranges: a dependency added or narrowed there without `make lock` would go uninstalled or
stay at a version outside its range, unnoticed until something imports it. These tests
fail first.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements.lock"
# The platform `make lock` resolves for (the Makefile's LOCK_FOR): CPython 3.11 on x86_64
# Linux. A requirement whose marker excludes it is not in the lock.
LOCKED_FOR: dict[str, str] = {
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "python_version": "3.11",
    "python_full_version": "3.11.0",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
_HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


def _locked() -> dict[NormalizedName, tuple[Version, int]]:
    """Each pinned package's version and how many file hashes it lists."""
    pins: dict[NormalizedName, tuple[Version, int]] = {}
    name: NormalizedName | None = None
    for line in LOCK.read_text().splitlines():
        if pin := _PIN.match(line):
            name = canonicalize_name(pin[1])
            pins[name] = (Version(pin[2]), 0)
        elif name is not None and _HASH.search(line):
            version, hashes = pins[name]
            pins[name] = (version, hashes + 1)
    return pins


def _requirements(pyproject: Path, *extras: str) -> list[Requirement]:
    config: dict[str, Any] = tomllib.loads(pyproject.read_text())
    project = config["project"]
    named = [
        *config["build-system"]["requires"],
        *project["dependencies"],
        *(r for extra in extras for r in project["optional-dependencies"][extra]),
    ]
    return [Requirement(r) for r in named]


def _declared() -> list[Requirement]:
    """The service's dependencies, its dev extra and build backend, and the client
    distribution's (its tests install it from the same venv, build backend included)."""
    every = _requirements(ROOT / "pyproject.toml", "dev")
    every += _requirements(ROOT / "client" / "pyproject.toml")
    return [r for r in every if r.marker is None or r.marker.evaluate(LOCKED_FOR)]


def test_every_declared_dependency_is_locked_within_its_range() -> None:
    pins = _locked()
    unlocked = [str(r) for r in _declared() if canonicalize_name(r.name) not in pins]
    assert not unlocked, f"not in requirements.lock (run `make lock`): {unlocked}"
    outside = [
        f"{r} locked at {pins[canonicalize_name(r.name)][0]}"
        for r in _declared()
        if not r.specifier.contains(pins[canonicalize_name(r.name)][0], prereleases=True)
    ]
    assert not outside, f"outside its range (run `make lock`): {outside}"


def test_every_pin_is_exact_and_hashed() -> None:
    pins = _locked()
    assert len(pins) > 50  # the parser found the lock's entries, not a header
    unhashed = sorted(name for name, (_, hashes) in pins.items() if hashes == 0)
    assert not unhashed
    loose = [
        line
        for line in LOCK.read_text().splitlines()
        if line and not line[0].isspace() and not line.startswith("#") and not _PIN.match(line)
    ]
    assert not loose, f"requirements.lock holds lines that are not exact pins: {loose}"


def test_the_lock_was_written_by_make_lock_for_the_platform_it_declares() -> None:
    """The header names `make lock` with its platform flags, the Makefile's LOCK_FOR."""
    (lock_for,) = re.findall(r"^LOCK_FOR := (.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert f"#    make lock ({lock_for})" in LOCK.read_text().splitlines()[:3]
    assert "--python-version 3.11" in lock_for
    assert "--python-platform x86_64-" in lock_for
