"""Read-back (SPEC PROF-2, §15 C-2).

A PATCH whose try may have landed is never sent again (C-2); a profile that
declares a read-back may prove it applied with a GET: if the object holds every
value the frozen body sent, the PATCH was applied (by us); anything else leaves
it ambiguous. A later PATCH answered 412 reads the object back the same way to
tell our own earlier effect (the entity tag moved because of us) from a real
out-of-band change.
"""

from __future__ import annotations

import json

from pydantic import JsonValue

from protocol.snapshots import LinkSnapshot, ProfileSnapshot
from protocol.templates import TemplateError, render


def readback_path(contract: ProfileSnapshot, link: LinkSnapshot, update_path: str) -> str:
    """The profile's read-back path for the linked object, else the PATCH's own path."""
    template = contract.readback_path_template
    if template is None:
        return update_path
    try:
        return render(template, {"target": link.names.target_object, "remoteId": link.remote_id})
    except TemplateError:
        return update_path


def readback_matches(sent: JsonValue, document: JsonValue) -> bool:
    """Every value of `sent` is in `document` at the same place (objects may hold more).

    Scalars compare by their JSON text, because HubSpot-shaped remotes return every
    property as a string ("100" for 100, "true" for true); nothing else is lenient."""
    if isinstance(sent, dict):
        if not isinstance(document, dict):
            return False
        return all(k in document and readback_matches(v, document[k]) for k, v in sent.items())
    if isinstance(sent, list):
        if not isinstance(document, list) or len(sent) != len(document):
            return False
        return all(readback_matches(a, b) for a, b in zip(sent, document, strict=True))
    if isinstance(document, dict | list):
        return False
    return _scalar_text(sent) == _scalar_text(document)


def _scalar_text(value: JsonValue) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def update_path_of(link: LinkSnapshot) -> str:
    """The linked object's update path, rendered from the durable remote id."""
    values = {"target": link.names.target_object, "remoteId": link.remote_id}
    return render(link.action.update_path_template, values)
