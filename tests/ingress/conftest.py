"""Processing tests reuse the end-to-end harness: demo pack, sandbox remote, a worker."""

from tests.e2e.conftest import demo_db, hooks, remote, sandbox, stack

__all__ = ["demo_db", "hooks", "remote", "sandbox", "stack"]
