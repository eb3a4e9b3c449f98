"""Ports picked for tests, benchmarks and the chaos stack stay out of the kernel's ephemeral
range, so a port released for a restart is not taken by some process's outgoing connection
(seen under two test processes: a dev stack's second start found its Temporal port gone)."""

from __future__ import annotations

from pathlib import Path

from cli.stack.process import PICK_RANGE, free_ports, port_is_free

EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


def test_picked_ports_are_distinct_free_and_in_the_pick_range() -> None:
    ports = free_ports(50)
    assert len(set(ports)) == 50
    assert all(port in PICK_RANGE for port in ports)
    assert all(port_is_free("127.0.0.1", port) for port in ports)


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range where Linux reports it; elsewhere the IANA dynamic range that
    macOS and Windows use (49152-65535)."""
    if EPHEMERAL.exists():
        low, high = (int(v) for v in EPHEMERAL.read_text().split())
        return low, high
    return 49152, 65535


def test_picked_ports_are_never_ones_the_kernel_hands_to_outgoing_connections() -> None:
    low, high = _ephemeral_range()
    assert not any(low <= port <= high for port in free_ports(200))
