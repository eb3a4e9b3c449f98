"""`connector-push NAME` registers only the module of NAME (cli.main.modules_for): the
table it reads is what each module registers, and a process started for one command
imports no other command's module, while `--help` still lists them all."""

from __future__ import annotations

import importlib
import subprocess
import sys
from importlib.metadata import version

import typer
from typer.testing import CliRunner

from cli.main import COMMAND_MODULES, app, modules_for


def _names(typer_app: typer.Typer) -> list[str]:
    commands = [c.name or "" for c in typer_app.registered_commands]
    return commands + [g.name or "" for g in typer_app.registered_groups]


def test_each_module_registers_exactly_the_names_the_table_gives_it() -> None:
    for module, names in COMMAND_MODULES.items():
        scratch = typer.Typer()
        importlib.import_module(f"cli.{module}").register(scratch)
        assert sorted(_names(scratch)) == sorted(names), module
    # The app a test imports (no command named first) has every one of them.
    every = [name for names in COMMAND_MODULES.values() for name in names]
    assert sorted(_names(app)) == sorted(every)


def test_a_command_named_first_registers_its_module_alone() -> None:
    assert modules_for(["connector-push", "status", "--json"]) == ["status_cmd"]
    assert modules_for(["connector-push", "links", "list"]) == ["link_cmds"]
    everything = list(COMMAND_MODULES)
    for argv in (["connector-push"], ["connector-push", "--help"], ["x", "--debug", "status"]):
        assert modules_for(argv) == everything
    assert modules_for(["connector-push", "statsu"]) == everything  # click suggests


def _imported_modules(*args: str) -> set[str]:
    """The cli command modules imported once `cli.main` is, for a process started with
    `args` (the app is built at import, from sys.argv)."""
    probe = (
        "import sys; sys.argv = ['connector-push', *sys.argv[1:]]; import cli.main; "
        "print(' '.join(m for m in sys.modules if m.startswith('cli.') and m[4:] in "
        "cli.main.COMMAND_MODULES))"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe, *args], capture_output=True, text=True, check=True
    )
    return set(run.stdout.split())


def test_a_process_for_one_command_imports_no_other_command_module() -> None:
    assert _imported_modules("status", "--json") == {"cli.status_cmd"}
    assert _imported_modules("--help") == {f"cli.{m}" for m in COMMAND_MODULES}


def test_one_command_still_runs_with_its_own_help() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "cli", "status", "--help"], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert "status" in run.stdout and "Exit codes:" in run.stdout


def test_the_dev_install_has_the_local_stack_commands() -> None:
    """In a checkout's dev install `dev` and `sandbox` are commands; the wheel leaves them
    out with the sandbox remote (tests/e2e/test_wheel.py)."""
    assert {"stack.dev_cmd", "stack.sandbox_cmd"} <= set(COMMAND_MODULES)
    assert {"dev", "sandbox"} <= set(_names(app))


def test_version_is_the_installed_distributions() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"connector-push {version('connector-push')}\n"
