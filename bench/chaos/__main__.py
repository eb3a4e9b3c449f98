"""`python -m bench.chaos` (`make chaos`): run one seeded campaign, print and write the verdict.

Exit status: 0 without violations, 1 with any.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections import Counter

from bench.chaos.campaign import Outcome, run_campaign
from bench.chaos.checker import RULES
from bench.chaos.config import ChaosConfig

SHOWN_PER_KIND = 5


def report(outcome: Outcome) -> str:
    data = outcome.as_json()
    lines = [f"chaos family={outcome.family} seed={outcome.seed} seconds={outcome.seconds:.0f}"]
    lines.append(f"faults injected: {data['faults_total']}")
    lines += [f"  {kind:<34} {n}" for kind, n in outcome.faults.items()]
    lines.append(f"end states: {outcome.end_states}  settled: {outcome.settled}")
    lines.append(f"traffic: {outcome.traffic}")
    lines.append(f"operator: {outcome.operator}")
    lines.append(f"side paths: {outcome.side_paths}")
    lines.append(f"side path answers: {outcome.side_path_answers}")
    for path, why in outcome.side_paths_not_applicable.items():
        lines.append(f"side path {path}: not applicable ({why})")
    kinds = Counter(str(v["kind"]) for v in outcome.violations)
    lines.append(f"violations: {len(outcome.violations)} {dict(kinds)}")
    for kind in kinds:
        shown = [v for v in outcome.violations if v["kind"] == kind][:SHOWN_PER_KIND]
        lines.append(f"  {kind} ({kinds[kind]}) — {RULES.get(kind, '')}")
        lines += [f"    {v['link_key']}: {v['detail']}" for v in shown]
    if outcome.logs:
        lines.append(f"logs kept in {outcome.logs}")
    return "\n".join(lines)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    cfg = ChaosConfig.from_env()
    outcome = asyncio.run(run_campaign(cfg))
    cfg.results.parent.mkdir(parents=True, exist_ok=True)
    cfg.results.write_text(json.dumps(outcome.as_json(), indent=2, default=str) + "\n")
    print(report(outcome))
    print(f"written {cfg.results}")
    return 1 if outcome.violations else 0


if __name__ == "__main__":
    sys.exit(main())
