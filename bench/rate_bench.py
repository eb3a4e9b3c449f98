"""Benchmark P6 (issues 12 and 33): an initial sync against a rate-limited remote.

N creates are reported through `connector-push push --all` (its own process) and
sent by two `connector-push worker` processes (real processes, SIGKILL-able like
production) to the sandbox remote in its hubspot mode (examples/sandbox-hubspot.yaml),
whose strict limiter admits at most REQUESTS per rolling 10 s per token, with no
tolerance, as HubSpot's burst window does. The pack's profiles declare the same
`rateLimit`, so the runtime paces the shared budget (PROF-3, NF-8, NF-8': Temporal's
fairness keys dispatch, a slot per activity in Postgres spaces, a send window per
request in Postgres bounds). `make bench` runs it at 20, 100
and 190 per 10 s, each with STEADY_WINDOWS windows' worth of creates: limits below the
stack's own ceiling, so the figures measure the pacing, not the machine. Per limit L,
against issue 33's targets:

- P6_L: sustained creates/s at the remote over the limit (target >= 0.95), from the
  sandbox's log of admitted requests over the middle 80% of the creates (the start-up
  and the last stragglers are not "sustained");
- P6_429_share_L: requests answered 429 over all requests (target <= 1%);
- P6_worst_window_L: the most requests SENT in any rolling 10 s window (NF-8'), as the
  remote counted them arriving, admitted or refused (the admitted alone cannot exceed L:
  the limiter refuses the (L+1)th); target <= L. Each request takes its turn in its
  budget's send window right before it leaves (protocol.rate_limit: at most L per
  W + SEND_WINDOW_MARGIN_S, recorded in Postgres), so a window over L at the remote means
  a request arrived more than that margin after its turn. The journal's `sending_at`
  (the claim, before the turn) is printed beside it as "claimed".

`--requests 0 --n 1000` runs the same path with no limit anywhere: the stack's ceiling.
After the limits, the run measures that ceiling itself (N = the largest limit's size):
`P6_ceiling_creates_per_s`, and `P6_of_ceiling_L`, the paced rate over the lower of L and
the ceiling. On two cores the ceiling is about 18 creates/s (the Temporal dev server
alone keeps ~0.9 core busy), below 190 per 10 s: there P6_190 measures the machine.

    python -m bench.rate_bench [--requests 20,100,190] [--windows 5] [--workers 2]
    python -m bench.rate_bench --requests 100 --n 300 --no-write   # a quick run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import asyncpg
import httpx
import yaml
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from bench.cpu import cpu_seconds
from bench.ingress_bench import ROOT, record
from bench.rate_figures import figures, sent_posts
from bench.stack import DATABASE, EXAMPLES, BenchStack, bench_stack
from cli.stack.process import stop_process
from sandbox.client import SandboxClient
from sandbox.config import HubSpotLimits, RateLimitConfig
from services.packs import apply_pack

TASK_QUEUE: Final = "connector-push"
OWNER: Final = "demo-owner"
OBJECT_TYPE: Final = "contacts"
PUSH_CONCURRENCY: Final = 16  # wake-ups in flight (64 timed out wake-ups at load 8)
LIMITS: Final = (20, 100, 190)  # requests per 10 s: HubSpot's tiers, and a small one
STEADY_WINDOWS: Final = 5  # creates per run, in windows' worth: 4 measured after warm-up
WINDOW_S: Final = 10.0
IDLE_COMMITS: Final = 3  # per 1.2 s: the relay schedule and pollers of idle workers
TARGETS: Final = "targets: P6 >= 0.95, 429 share <= 1%, worst window <= L, parked 0"
SANDBOX_CONFIG: Final = EXAMPLES / "sandbox-hubspot.yaml"  # the strict limiter (NF-8')
# The demo pack's credentialRef is env:SANDBOX_TOKEN; the hubspot mode needs a token.
TOKEN: Final = "pat-bench-token"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Setup:
    n: int
    limit: float  # requests/s; 0 = no limit anywhere
    window: float  # seconds of the declared and enforced window
    workers: int
    concurrency: int

    @property
    def requests(self) -> int:
        return round(self.limit * self.window)


# -- the pack and the remote ---------------------------------------------------------


def limited_manifest(sandbox_url: str, setup: Setup) -> dict[str, object]:
    """The demo pack on this sandbox, every profile declaring the sandbox's own limit."""
    text = (EXAMPLES / "demo-pack.yaml").read_text()
    manifest: dict[str, object] = yaml.safe_load(
        re.sub(r"baseUrl: http://127\.0\.0\.1:\d+", f"baseUrl: {sandbox_url}", text)
    )
    profiles = manifest["profiles"]
    assert isinstance(profiles, list)
    for profile in profiles:
        profile.pop("rateLimit", None)
        if setup.limit:
            profile["rateLimit"] = {"requests": setup.requests, "perSeconds": setup.window}
    return manifest


async def prepare(stack: BenchStack, sandbox: SandboxClient, setup: Setup) -> None:
    conn = await asyncpg.connect(stack.dsn)
    try:
        await apply_pack(conn, limited_manifest(stack.sandbox_url, setup))
    finally:
        await conn.close()
    await sandbox.reset()
    burst = (
        RateLimitConfig(requests=setup.requests, per_seconds=setup.window) if setup.limit else None
    )
    await sandbox.set_limits(HubSpotLimits(burst=burst, daily=None))


# -- processes -----------------------------------------------------------------------


def _env(stack: BenchStack) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": stack.dsn,
        "TEMPORAL_ADDRESS": stack.client.service_client.config.target_host,
        "TEMPORAL_NAMESPACE": stack.client.namespace,
        "CONNECTOR_PUSH_TASK_QUEUE": TASK_QUEUE,
        "CONNECTOR_PUSH_LOG_LEVEL": "WARNING",
        # The token, and the host it may be sent to (S-3).
        "CONNECTOR_PUSH_CREDENTIAL_ENV_SANDBOX_TOKEN": TOKEN,
        "CONNECTOR_PUSH_CREDENTIAL_HOSTS_ENV_SANDBOX_TOKEN": stack.sandbox_url.split("//")[1],
    }


@contextmanager
def worker_processes(stack: BenchStack, count: int, log_dir: Path) -> Iterator[list[int]]:
    """`connector-push worker` processes; yields their pids."""
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(count):
            with (log_dir / f"worker-{i}.log").open("wb") as out:
                processes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "cli", "worker"],
                        env=_env(stack),
                        cwd=ROOT,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )
        yield [p.pid for p in processes]
        dead = [p.args for p in processes if p.poll() is not None]
        if dead:
            raise RuntimeError(f"a worker exited during the run; see {log_dir}")
    finally:
        for process in processes:
            stop_process(process, 30)


async def wait_for_pollers(client: Client, count: int) -> None:
    """Until `count` workers poll the activity queue (each set the fairness limit first)."""
    request = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=TASK_QUEUE),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
    )
    async with asyncio.timeout(120):
        while True:
            pollers = (await client.workflow_service.describe_task_queue(request)).pollers
            if len({p.identity for p in pollers}) >= count:
                return
            await asyncio.sleep(0.2)  # poll interval; the poller list is the condition


def run_push(stack: BenchStack, setup: Setup) -> tuple[dict[str, object], float]:
    """`connector-push push --all --json` until every save settles; (summary, seconds)."""
    command = [sys.executable, "-m", "cli", "push", "--owner-key", OWNER]
    command += ["--action-slot", "push-contact", "--user", "bench", "--all", "--json"]
    command += ["--concurrency", str(setup.concurrency)]
    started = time.monotonic()
    done = subprocess.run(
        command,
        env=_env(stack),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=max(600.0, 20 * setup.n / (setup.limit or 10)),
    )
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"push exited {done.returncode}: {done.stderr[-2000:]}")
    summary: dict[str, object] = json.loads(done.stdout)
    return summary, elapsed


# -- where the CPU went (Linux /proc): the machine is shared, so say who used it ----------


def _children_cpu_s() -> float:
    """CPU of this process's reaped children (the push process, once it has exited)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cores_busy(
    before: Mapping[str, float] | None, after: Mapping[str, float] | None, seconds: float
) -> dict[str, float]:
    """Cores each component kept busy; the worker processes (`worker-N`) summed."""
    if before is None or after is None:
        return {}
    totals: dict[str, float] = {}
    for name, value in after.items():
        group = "workers" if name.startswith("worker-") else name
        totals[group] = totals.get(group, 0.0) + value - before[name]
    return {name: round(total / seconds, 2) for name, total in totals.items()}


async def xact_commits(admin_dsn: str) -> int:
    """Committed transactions of the bench database, read from another database."""
    conn = await asyncpg.connect(admin_dsn)
    try:
        value = await conn.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = $1", DATABASE
        )
        return int(value)
    finally:
        await conn.close()


async def settled_commits(admin_dsn: str) -> int:
    """A reading once backends have flushed their counters (they do within about a
    second of going idle); idle workers still commit about one transaction a second."""
    last = await xact_commits(admin_dsn)
    for _ in range(10):
        await asyncio.sleep(1.2)
        now = await xact_commits(admin_dsn)
        if now - last <= IDLE_COMMITS:
            return now
        last = now
    return last


# -- figures -------------------------------------------------------------------------


# -- the run -------------------------------------------------------------------------


async def measure(setup: Setup) -> dict[str, float]:
    async with (
        bench_stack(setup.n, sandbox_config=SANDBOX_CONFIG) as stack,
        httpx.AsyncClient(timeout=30.0) as http,
    ):
        sandbox = SandboxClient(stack.sandbox_url, http)
        await prepare(stack, sandbox, setup)
        log_dir = Path(tempfile.mkdtemp(prefix="cp-bench-p6-"))  # kept if a worker fails
        with worker_processes(stack, setup.workers, log_dir) as pids:
            await wait_for_pollers(stack.client, setup.workers)
            log(f"P6: {setup.workers} workers polling; pushing {setup.n} contacts")
            roots = {**{f"worker-{i}": pid for i, pid in enumerate(pids)}, **stack.processes}
            commits = await settled_commits(stack.admin_dsn)
            cpu, push_cpu = cpu_seconds(roots, own=False), _children_cpu_s()
            summary, elapsed = await asyncio.to_thread(run_push, stack, setup)
            cpu_after = cpu_seconds(roots, own=False)
            push_cpu = _children_cpu_s() - push_cpu
            report = await sandbox.limits()
            sent = await sent_posts(stack.dsn)
            commits = await settled_commits(stack.admin_dsn) - commits
    shutil.rmtree(log_dir, ignore_errors=True)
    result = figures(setup, report, sent, summary, elapsed)
    busy = {**cores_busy(cpu, cpu_after, elapsed), "push": round(push_cpu / elapsed, 2)}
    result.update({f"cores_{name}": value for name, value in busy.items()})
    result["xacts_per_create"] = round(commits / setup.n, 2)
    return result


def _print(setup: Setup, r: dict[str, float], load: str) -> None:
    limit = f"{setup.requests}/{setup.window:g} s" if setup.limit else "none"
    print(
        f"P6 N={setup.n} limit {limit} ({setup.limit:g}/s) workers {setup.workers}: "
        f"sustained {r['creates_per_s']}/s = {r['ratio']} of the limit, "
        f"429 share {r['429_share']:.2%} ({r['429s']:.0f}), parked {r['parked']:.0f}, "
        f"finalized {r['finalized']:.0f}  [{TARGETS}]"
    )
    print(
        f"   end-to-end {r['end_to_end_per_s']}/s over {r['elapsed_s']} s, first-to-last POST "
        f"{r['remote_span_per_s']}/s; busiest {setup.window:g} s window sent "
        f"{r['busiest_window']} (admitted {r['busiest_admitted_window']}, claimed "
        f"{r['busiest_claimed_window']}), "
        f"first window {r['first_window']}, busiest 1 s {r['busiest_1s']}; "
        f"{r['xacts_per_create']} Postgres xacts/create; "
        f"push admitted {r['admitted_per_s']}/s ({r['wake_deferred']:.0f} wake-ups deferred)"
    )
    cores = ", ".join(f"{k[6:]} {v}" for k, v in r.items() if k.startswith("cores_"))
    print(f"   cores busy over the push: {cores}")
    print(f"   load: {load}")


def uptime() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} on {os.cpu_count()} cores"


async def run_one(setup: Setup) -> dict[str, float]:
    """Measure P6 at one setup and print it."""
    before = uptime()
    result = await measure(setup)
    _print(setup, result, f"{before} before, {uptime()} after")
    return result


def _figures(requests: int, r: dict[str, float]) -> dict[str, float]:
    return {
        f"P6_{requests}": r["ratio"],
        f"P6_429_share_{requests}": r["429_share"],
        f"P6_worst_window_{requests}": r["busiest_window"],
        f"P6_creates_per_s_{requests}": r["creates_per_s"],
        f"P6_parked_{requests}": r["parked"],
        f"P6_n_{requests}": r["posts"],
    }


async def run_rate_bench(
    limits: Sequence[int] = LIMITS,
    windows: int = STEADY_WINDOWS,
    workers: int = 2,
    concurrency: int = PUSH_CONCURRENCY,
    write: bool = True,
    n: int | None = None,
    ceiling: bool = True,
) -> dict[str, float]:
    """P6 at each limit (requests per 10 s), merged into `bench/results/latest.json` (when
    `write`; every earlier P6 key is replaced), returned. `ceiling`: then the same push with
    no limit (`P6_ceiling_creates_per_s`), and each paced rate over the lower of the
    limit and that ceiling (`P6_of_ceiling_<limit>`)."""
    figures: dict[str, float] = {}
    for requests in limits:
        size = n or requests * windows
        result = await run_one(Setup(size, requests / WINDOW_S, WINDOW_S, workers, concurrency))
        if requests:
            figures.update(_figures(requests, result))
    if ceiling and any(limits):
        # The same path with no limit anywhere, in the same run: the stack's own ceiling on
        # this machine. A limit above it measures the machine, not the pacing.
        size = n or max(limits) * windows
        result = await run_one(Setup(size, 0.0, WINDOW_S, workers, concurrency))
        top = result["creates_per_s"]
        figures["P6_ceiling_creates_per_s"] = top
        for requests in filter(None, limits):
            paced = figures[f"P6_creates_per_s_{requests}"]
            figures[f"P6_of_ceiling_{requests}"] = round(paced / min(top, requests / WINDOW_S), 3)
    figures["P6_load_1m"] = round(os.getloadavg()[0], 2)
    if write and any(limits):
        record(figures, replaces=("P6",))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", default=",".join(map(str, LIMITS)), help="per 10 s")
    parser.add_argument("--windows", type=int, default=STEADY_WINDOWS)
    parser.add_argument("--n", type=int, default=None, help="creates (default: windows' worth)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=PUSH_CONCURRENCY)
    parser.add_argument("--no-write", action="store_true", help="do not touch latest.json")
    parser.add_argument("--no-ceiling", action="store_true", help="skip the unlimited round")
    args = parser.parse_args()
    limits = [int(r) for r in args.requests.split(",")]
    asyncio.run(
        run_rate_bench(
            limits,
            args.windows,
            args.workers,
            args.concurrency,
            not args.no_write,
            args.n,
            not args.no_ceiling,
        )
    )


if __name__ == "__main__":
    main()
