"""P5: the worker's memory with many parked links, and the operator's visibility query.

A parked link's workflow stays open for its operator (`parked-link-stays-open`), so
N parked links are N open LinkWorkflows. The cheapest honest way to get there:
N saves admitted through the product's admission (pending creates, nothing sent),
parked in Postgres in one statement as a run of exhausted creates would leave them
(`pending -> terminal_failed`, a legal move the triggers check, with a reason), then
each link's workflow woken by the CRM entry's signal-with-start. Each run reads its
attempt, publishes `NeedsOperator = true` and waits for an operator: no POST.

Measured: the RSS of the `connector-push worker` process (its own process, so the
bench's client and the sandbox are not counted) once every workflow is parked,
with the worker's sticky-cache size (`CONNECTOR_PUSH_MAX_CACHED_WORKFLOWS`), and
the latency of the Temporal server's `NeedsOperator = true AND ExecutionStatus =
"Running"` query (count, and the first page of a listing) at that size.

Alone: `python -m bench.parked_bench [--n 10000] [--cache 1000]` (or `BENCH_P5_N`).

A/B of what the worker's memory depends on (issue 48 item 4):
`python -m bench.parked_bench --arms product,gc-default,...` (or `BENCH_P5_ARMS` with
`make bench ONLY=P5`) parks N links once per arm, each on a fresh stack, in one run, and
writes the arms' figures (`P5_ab_<arm>_rss_mb`, `..._mb_per_cached_workflow`) to
bench/results/p5-ab-latest.json. An arm is the product's worker with one suspect changed
(`ARMS`), or the worker of an older commit (`TREE_ARMS`, its tree exported by `git archive`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from io import BytesIO
from pathlib import Path

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from bench.ingress_bench import RESULTS, record
from bench.stack import BenchStack, bench_stack, record_id
from cli.stack.process import stop_process
from db.pool import create_pool
from protocol.admission import CreateReserved, SaveRequest
from protocol.rate_limit import RemoteBudgetResult
from services.rate_limit import reservation_budget
from services.save_entry import admit_one
from services.wake import wake_link
from worker.settings import MAX_CACHED_WORKFLOWS

ROOT = Path(__file__).resolve().parents[1]
QUEUE = "connector-push-bench-parked"
CONCURRENCY = 50
PARKED_QUERY = 'NeedsOperator = true AND ExecutionStatus = "Running"'
DEFAULT_CACHE = MAX_CACHED_WORKFLOWS  # the worker's default sticky cache
PARK = """
UPDATE connector_push_attempt
SET status = 'terminal_failed', last_error = 'bench P5: parked for an operator'
WHERE status = 'pending'
"""


# A/B arms: the product's worker with one suspect changed, in the worker process before
# `connector-push worker` runs (every arm, "product" too, starts through the same code).
ARMS: dict[str, str] = {
    "product": "",
    # The GC policy as a whole off: CPython's defaults (700, 10, 10), nothing frozen.
    "gc-default": "worker.gc_policy.apply_gc_policy = lambda: None",
    # Its two halves alone: the raised young threshold without the freeze, and back.
    "gc-threshold-only": (
        "worker.gc_policy.apply_gc_policy = lambda: gc.set_threshold("
        "50_000, *worker.gc_policy.OLDER_THRESHOLDS)"
    ),
    "gc-freeze-only": "worker.gc_policy.apply_gc_policy = gc.freeze",
    # What the worker applied before issue 48's fix (the CLI's 50,000 in the worker too).
    "gc-50k-in-worker": (
        "worker.gc_policy.WORKER_YOUNG_THRESHOLD = worker.gc_policy.YOUNG_THRESHOLD"
    ),
    # The sandbox's pass-through list of 23b70d1, where P5 read 224 MB: without services/
    # (6f51554) and workflows.link_retries (1380841).
    "sandbox-before": (
        "import worker.runtime as r; r.PASSTHROUGH_MODULES = tuple(m for m in "
        "r.PASSTHROUGH_MODULES if m not in ('services', 'workflows.link_retries'))"
    ),
}
ARM_LAUNCH = """
import gc, sys
import worker.gc_policy
{toggle}
from cli.main import app
app(["worker"])
"""
# Arms that run an older commit's worker, as it was (`python -m cli worker` in its tree):
# the run-lifecycle change (WF-1', 861db76) against its parent; both predate the GC policy.
TREE_ARMS: dict[str, str] = {"lifecycle-before": "6020889", "lifecycle-after": "861db76"}
AB_RESULTS = RESULTS.with_name("p5-ab-latest.json")  # an A/B run's own file


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def _bounded(n: int, job: Callable[[int], Awaitable[object]]) -> list[object]:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(i: int) -> object:
        async with gate:
            return await job(i)

    return await asyncio.gather(*(one(i) for i in range(n)))


async def admit_and_park(dsn: str, n: int) -> tuple[list[str], RemoteBudgetResult]:
    """N admitted creates, then parked in one statement; returns their link keys and the
    remote budget the CRM entry starts their workflows with (they share one profile)."""
    pool = await create_pool(dsn, min_size=4, max_size=20)
    try:

        async def admit(i: int) -> object:
            save = SaveRequest(
                connector_owner_key="demo-owner",
                action_slot_id="push-contact",
                destination_slot_id="remote-contacts",
                source_object="Contact",
                source_record_id=record_id(i),
                originating_user_id="bench",
            )
            return await admit_one(pool, save)

        decisions = [d for d in await _bounded(n, admit) if isinstance(d, CreateReserved)]
        assert len(decisions) == n, decisions[:3]
        budget = await reservation_budget(pool, decisions[0].reservation.request)
        async with pool.acquire() as conn:
            parked = await conn.execute(PARK)
        assert parked == f"UPDATE {n}", parked
        return [d.reservation.link_key for d in decisions], budget
    finally:
        await pool.close()


def _env(stack: BenchStack, cache: int) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": stack.dsn,
        "TEMPORAL_ADDRESS": stack.client.service_client.config.target_host,
        "TEMPORAL_NAMESPACE": stack.client.namespace,
        "CONNECTOR_PUSH_TASK_QUEUE": QUEUE,
        "CONNECTOR_PUSH_LOG_LEVEL": "WARNING",
        "CONNECTOR_PUSH_MAX_CACHED_WORKFLOWS": str(cache),
    }


def export_tree(commit: str) -> Path:
    """The files of `commit` in a temporary directory (`git archive`: no worktree, no
    change to the repository)."""
    tree = Path(tempfile.mkdtemp(prefix=f"cp-bench-p5-{commit}-"))
    archive = subprocess.run(
        ["git", "archive", commit], cwd=ROOT, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    return tree


def _worker_command(arm: str | None) -> tuple[list[str], Path, dict[str, str]]:
    """(argv, cwd, extra environment) of the worker for `arm` (None: the product's own
    `python -m cli worker`). `BENCH_P5_AT=<commit>` runs the `ARMS` on that commit's
    files, so the working tree can change during a long A/B."""
    if arm is None:
        return [sys.executable, "-m", "cli", "worker"], ROOT, {}
    if arm in TREE_ARMS:
        tree = export_tree(TREE_ARMS[arm])
        return [sys.executable, "-m", "cli", "worker"], tree, {"PYTHONPATH": str(tree)}
    argv = [sys.executable, "-c", ARM_LAUNCH.format(toggle=ARMS[arm])]
    if at := os.environ.get("BENCH_P5_AT"):
        tree = export_tree(at)
        return argv, tree, {"PYTHONPATH": str(tree)}
    return argv, ROOT, {}


@contextmanager
def worker_process(
    stack: BenchStack, cache: int, log_path: Path, arm: str | None = None
) -> Iterator[int]:
    """One `connector-push worker` (of `arm`, when named); yields its pid."""
    argv, cwd, extra = _worker_command(arm)
    with log_path.open("wb") as out:
        process = subprocess.Popen(
            argv,
            env={**_env(stack, cache), **extra},
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield process.pid
        if process.poll() is not None:
            raise RuntimeError(f"the worker exited during the run; see {log_path}")
    finally:
        stop_process(process, 30)


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of `pid` in MB: resident now, and the peak."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )

    def mb(key: str) -> float:
        return int(fields[key].split()[0]) / 1024

    return mb("VmRSS"), mb("VmHWM")


async def wait_for_poller(client: Client) -> None:
    request = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=QUEUE),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
    )
    async with asyncio.timeout(120):
        while not (await client.workflow_service.describe_task_queue(request)).pollers:
            await asyncio.sleep(0.2)  # poll interval; the poller list is the condition


async def parked_count(client: Client) -> int:
    return (await client.count_workflows(PARKED_QUERY)).count


async def wait_parked(client: Client, n: int, timeout: float) -> float:
    """Seconds until the visibility query lists all N (the condition the bench waits on)."""
    started = time.monotonic()
    async with asyncio.timeout(timeout):
        polls = 0
        while (parked := await parked_count(client)) < n:
            polls += 1
            if polls % 30 == 0:
                log(f"P5: {parked} of {n} parked after {time.monotonic() - started:.0f} s")
            await asyncio.sleep(1.0)  # poll interval of a count query, not a synchronisation
    return time.monotonic() - started


async def query_latency_ms(client: Client, repeats: int = 5) -> tuple[float, float]:
    """Median ms of the count query, and of the first page (100) of the listing."""
    counts, pages = [], []
    for _ in range(repeats):
        started = time.monotonic()
        await parked_count(client)
        counts.append(time.monotonic() - started)
        started = time.monotonic()
        listed = [w async for w in client.list_workflows(PARKED_QUERY, limit=100, page_size=100)]
        pages.append(time.monotonic() - started)
        assert len(listed) == 100, len(listed)
    return statistics.median(counts) * 1000, statistics.median(pages) * 1000


async def _park_workflows(
    stack: BenchStack, keys: list[str], budget: RemoteBudgetResult, pid: int
) -> dict[str, float]:
    """Wake every parked link's workflow through the worker `pid`; its memory once parked."""
    n = len(keys)
    await wait_for_poller(stack.client)
    idle, _ = rss_mb(pid)
    started = time.monotonic()
    await _bounded(n, lambda i: wake_link(stack.client, QUEUE, keys[i], None, budget))
    woken = time.monotonic() - started
    log(f"P5: {n} signal-with-starts in {woken:.0f} s; waiting for them to park")
    parked_s = woken + await wait_parked(stack.client, n, timeout=60 + n / 5)
    rss, peak = rss_mb(pid)
    return {
        "P5_rss_mb": round(rss, 1),
        "P5_peak_rss_mb": round(peak, 1),
        "P5_idle_rss_mb": round(idle, 1),
        "P5_parked_per_s": round(n / parked_s, 1),
    }


async def measure(n: int, cache: int, arm: str | None = None) -> dict[str, float]:
    # Unpaced: the wake-up's first dispatch carries the budget's fairness key even when it
    # sends nothing, so under the demo pack's 10/s budget parking 10,000 links took 28 min
    # of the bench; what is measured here is memory and visibility, not the remote's pace.
    async with bench_stack(n, rate_limited=False) as stack:
        log(f"P5: admitting and parking {n} creates")
        keys, budget = await admit_and_park(stack.dsn, n)
        log_path = Path(tempfile.mkdtemp(prefix="cp-bench-p5-")) / "worker.log"
        with worker_process(stack, cache, log_path, arm) as pid:
            figures = await _park_workflows(stack, keys, budget, pid)
            count_ms, page_ms = await query_latency_ms(stack.client)
    cached = min(n, cache)
    return {
        **figures,
        # What one cached workflow costs: the cache size that keeps RSS under a target.
        "P5_mb_per_cached_workflow": round(
            (figures["P5_rss_mb"] - figures["P5_idle_rss_mb"]) / cached, 3
        ),
        "P5_n": n,
        "P5_max_cached_workflows": cache,
        "P5_query_count_ms": round(count_ms, 1),
        "P5_query_page_ms": round(page_ms, 1),
        "P5_load_1m": round(os.getloadavg()[0], 2),  # the machine is shared: say how busy
    }


async def run_parked_bench(
    n: int = 10_000, cache: int = DEFAULT_CACHE, write: bool = True
) -> dict[str, float]:
    r = await measure(n, cache)
    one, five, _ = os.getloadavg()
    print(
        f"P5 = {r['P5_rss_mb']:.0f} MB worker RSS with {n:,} parked LinkWorkflows open "
        f"(target <= 300; peak {r['P5_peak_rss_mb']:.0f}, idle {r['P5_idle_rss_mb']:.0f}; "
        f"sticky cache {cache}, {r['P5_mb_per_cached_workflow']:.2f} MB per cached run); "
        f"parked at {r['P5_parked_per_s']:.0f}/s; "
        f"`{PARKED_QUERY}`: count {r['P5_query_count_ms']:.0f} ms, first page of 100 "
        f"{r['P5_query_page_ms']:.0f} ms (load {one:.1f}, {five:.1f})"
    )
    if write:
        record(r)
    return r


def arm_names(spec: str | None) -> list[str]:
    """The arms named in `spec` ("a,b"), checked; none when `spec` is empty."""
    names = [a.strip() for a in (spec or "").split(",") if a.strip()]
    unknown = sorted(set(names) - ARMS.keys() - TREE_ARMS.keys())
    if unknown:
        raise SystemExit(f"P5: unknown arm(s) {unknown}; known: {[*ARMS, *TREE_ARMS]}")
    return names


async def run_arms(
    arms: Sequence[str], n: int = 10_000, cache: int = DEFAULT_CACHE, write: bool = True
) -> dict[str, float]:
    """Each arm once, in order, each on a fresh stack; the figures keyed by arm."""
    figures: dict[str, float] = {}
    for arm in arms:
        log(f"P5 arm {arm}: {n:,} parked links")
        try:
            r = await measure(n, cache, arm)
        except Exception as exc:  # an older tree that cannot run here: say so, go on
            log(f"P5 arm {arm} failed: {exc!r}")
            continue
        print(
            f"P5 arm {arm}: {r['P5_rss_mb']:.0f} MB (peak {r['P5_peak_rss_mb']:.0f}, "
            f"idle {r['P5_idle_rss_mb']:.0f}), {r['P5_mb_per_cached_workflow']:.3f} MB per "
            f"cached run (load {r['P5_load_1m']:.1f})",
            flush=True,
        )
        for key in ("rss_mb", "peak_rss_mb", "idle_rss_mb", "mb_per_cached_workflow"):
            figures[f"P5_ab_{arm}_{key}"] = r[f"P5_{key}"]
    if write:
        figures["P5_ab_n"] = n
        figures["P5_ab_max_cached_workflows"] = cache
        record(figures, AB_RESULTS, replaces=("P5_ab_",))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=int(os.environ.get("BENCH_P5_N", "10000")))
    parser.add_argument("--cache", type=int, default=DEFAULT_CACHE)
    parser.add_argument("--no-write", action="store_true", help="do not touch latest.json")
    parser.add_argument(
        "--arms",
        default=os.environ.get("BENCH_P5_ARMS"),
        help=f"A/B arms instead of the product's figure, e.g. product,gc-default; "
        f"known: {', '.join([*ARMS, *TREE_ARMS])}",
    )
    args = parser.parse_args()
    if arms := arm_names(args.arms):
        asyncio.run(run_arms(arms, args.n, args.cache, not args.no_write))
    else:
        asyncio.run(run_parked_bench(args.n, args.cache, not args.no_write))


if __name__ == "__main__":
    main()
