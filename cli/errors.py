"""One way for commands to fail: a one-line message on stderr and a non-zero exit."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console

_stderr = Console(stderr=True)


def fail(message: str, code: int = 1) -> NoReturn:
    _stderr.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)
