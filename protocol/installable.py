"""What a manifest must meet to be installed, beyond parsing (`pack apply` and its
`--dry-run`). A stored install from before a rule still parses: these rules are checked
when a manifest is applied, never when an install is read back."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from protocol.manifest import ManifestInvalid, PackManifest, parse_manifest


def shared_destination_problems(m: PackManifest) -> Iterator[str]:
    """G-2: every two action slots of one source object that create at one remote
    destination (remote scope and target object) and are not declared separate. One
    record saved under both would own two remote objects there; the gate refuses the
    second create, so the pack is refused before it is installed."""
    separate = m.separate_pairs()
    slots = list(enumerate(m.action_slots))
    for i, first in slots:
        for j, second in slots[i + 1 :]:
            if first.source_object != second.source_object:
                continue
            where = m.remote_destination(first.destination_slot)
            if where is None or where != m.remote_destination(second.destination_slot):
                continue
            if frozenset((first.id, second.id)) in separate:
                continue
            scope, target = where
            yield (
                f"actionSlots[{j}]: {second.id!r} and actionSlots[{i}] {first.id!r} both "
                f"create {first.source_object} records as {target!r} in {scope!r} (G-2: one "
                "record would own two remote objects); give one another destination, or "
                "declare them in separateOwnership with a reason"
            )


def key_retention_problems(m: PackManifest) -> Iterator[str]:
    """G-5: a remote forgets idempotency keys; a profile that re-sends a create under one
    says for how long the remote honours it, or re-sends would be blind."""
    for i, profile in enumerate(m.profiles):
        post = profile.idempotency.post
        if post is not None and post.key_retention is None:
            yield (
                f"profiles[{i}].idempotency.post.keyRetention: required with idempotency.post: "
                "how long the remote honours a key, e.g. 24h, PT24H or 86400 (seconds) (G-5)"
            )


def check_installable(manifest: PackManifest) -> PackManifest:
    """The rules a manifest must meet to be installed, beyond parsing (a stored install
    from before a rule still parses); raises `ManifestInvalid`."""
    problems = (*shared_destination_problems(manifest), *key_retention_problems(manifest))
    if problems:
        raise ManifestInvalid(problems)
    return manifest


def parse_installable(data: Mapping[str, object]) -> PackManifest:
    """`parse_manifest`, then `check_installable`: what `pack apply` accepts."""
    return check_installable(parse_manifest(data))


def plain_http_problems(m: PackManifest) -> Iterator[str]:
    """S-3: every profile whose base URL is not `https` — refused by `pack apply` where the
    deployment refuses plain http (a production profile without the named exception), as
    its worker would refuse every request the profile sends."""
    for i, profile in enumerate(m.profiles):
        if not profile.base_url.lower().startswith("https://"):
            yield (
                f"profiles[{i}].baseUrl: {profile.name!r} is not https and the production "
                "profile refuses plain http (S-3); use https, or name the exception for the "
                "deployment (CONNECTOR_PUSH_ALLOW_PLAIN_HTTP=1)"
            )
