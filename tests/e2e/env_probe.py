"""Run by test_env_isolation in a child pytest: what the session sees of the shell."""

import os


def test_probe() -> None:
    print(f"probe DATABASE_URL={os.environ.get('DATABASE_URL')!r}")
    print(f"probe TEMPORAL_ADDRESS={os.environ.get('TEMPORAL_ADDRESS')!r}")
