"""Processing tests reuse the end-to-end harness: demo pack, sandbox remote, a worker."""

import pytest
import yaml

from ingress.config import parse_policy
from protocol.action_callback import CallbackTarget
from protocol.action_callback import callback_targets as targets_of
from sandbox.server import BackgroundSandbox
from tests.e2e.conftest import demo_db, hooks, remote, sandbox, stack
from tests.ingress.support import policy_document

__all__ = ["callback_targets", "demo_db", "hooks", "remote", "sandbox", "stack"]


@pytest.fixture
def callback_targets(remote: BackgroundSandbox) -> dict[str, CallbackTarget]:
    """The worker's completion targets (S-2) from the policy these tests serve,
    `policy_document(callback_base_url=remote.url)`: the worker and the ingress read one
    policy, as `make dev` runs them."""
    document = policy_document(callback_base_url=remote.url)
    return targets_of(parse_policy(yaml.safe_dump(document)))
