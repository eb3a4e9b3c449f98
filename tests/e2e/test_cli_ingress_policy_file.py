"""`connector-push ingress --config FILE` (the server itself, not `readback`): a policy
file that cannot be read or parsed is bad input, exit 2 in one line, before anything
starts - not an "unexpected error", a multi-line YAML dump, or a read of /dev/zero
until memory runs out."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_cli_errors import assert_one_line, down_dsn, run


@pytest.mark.parametrize(
    ("problem", "expected"),
    [
        ("missing", "cannot read"),
        ("directory", "cannot read"),
        ("device", "a device, not a file"),
        ("yaml", "not valid YAML"),
        ("shape", "invalid ingress policy"),
    ],
)
def test_the_ingress_refuses_a_bad_policy_file_as_bad_input(
    tmp_path: Path, problem: str, expected: str
) -> None:
    path = tmp_path / "policy.yaml"
    if problem == "directory":
        path.mkdir()
    elif problem == "device":
        path.symlink_to("/dev/zero")
    elif problem == "yaml":
        path.write_text("endpoints: [\n", encoding="utf-8")
    elif problem == "shape":
        path.write_text("endpoints: 7\n", encoding="utf-8")
    result = run("ingress", "--config", str(path), env={"DATABASE_URL": down_dsn()})
    assert_one_line(result, 2, str(path), expected)
