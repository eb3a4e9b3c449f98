"""Test harness: real Postgres and a real Temporal server, shared per session.

Fixture plugins live in `tests/fixtures/` (one file per component) so each
component's harness has one home.
"""

pytest_plugins = ["tests.fixtures.postgres", "tests.fixtures.temporal"]
