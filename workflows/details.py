"""The LinkWorkflow's current details (Temporal UI "Current Details", markdown).

They say, for the link's current state, why it waits for a person, what to do, the
evidence that decides it, and which update to send with the JSON to paste (SPEC OPS-1,
WF-3, G-6); a parked create whose journal proves no try landed says so. Pure: the
workflow calls it after every publish; `set_current_details` is not a command,
so the text may change without a `workflow.patched`.
"""

from __future__ import annotations

import json

from protocol.daily_quota import waiting_detail
from protocol.landing import PROOF
from protocol.messages import LinkView
from protocol.operator import OperatorAction
from protocol.park import ParkReason, proves_no_landing, remedy_for, update_template

UI_PATH = "More Actions → Send an Update → pick `{name}` → paste the JSON in Data → Submit"


def details_markdown(view: LinkView, reason: ParkReason | None) -> str:
    lines = _state_lines(view)
    if reason is not None:
        lines += _remedy_lines(view, reason)
    return "\n\n".join(lines)


def _state_lines(view: LinkView) -> list[str]:
    lines = [
        f"**link** `{view.link_status or 'none'}` remote id `{view.remote_id or '-'}`",
        f"**attempt** #{view.attempt_ordinal or '-'} `{view.attempt_status or 'none'}`"
        f" lane `{view.dispatch_lane or '-'}`",
    ]
    if view.last_patch_status is not None:
        lines.append(f"**last PATCH** `{view.last_patch_status}`")
    if view.quota_wait_until is not None:
        lines.append(f"**{waiting_detail(view.quota_wait_until)}** (not parked: resumes by itself)")
    landed = view.attempt_tries_may_have_landed + view.patch_tries_may_have_landed
    if proves_no_landing(view.attempt_landing):
        lines.append(
            f"**no try landed**: {PROOF} (evidence kept: `connector-push links show"
            f" {view.link_key}`)"
        )
    elif landed:
        lines.append(
            f"**tries that may have landed** create {view.attempt_tries_may_have_landed},"
            f" PATCH {view.patch_tries_may_have_landed}"
            f" (send journal: `connector-push links show {view.link_key}`)"
        )
    return lines


def _remedy_lines(view: LinkView, reason: ParkReason) -> list[str]:
    remedy = remedy_for(reason, view.suspend_reason, view.attempt_landing)
    why = view.suspend_reason or view.last_error
    lines = [
        f"**needs operator: `{reason}`**" + (f" ({why})" if why else ""),
        f"**what to do**: {remedy.what.replace('KEY', view.link_key)}",
        f"**evidence that decides it**: {remedy.evidence.replace('KEY', view.link_key)}",
    ]
    lines += [_update_lines(action) for action in remedy.actions]
    return lines


def _update_lines(action: OperatorAction) -> str:
    template = json.dumps(update_template(action), indent=2)
    return (
        f"**send update `{action}`**: {UI_PATH.format(name=action.value)}\n\n"
        f"```json\n{template}\n```"
    )
