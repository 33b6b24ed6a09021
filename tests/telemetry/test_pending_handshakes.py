"""Who gives way when too many connections are in their handshake (``engine/telemetry/handshakes.py``).

Pure bookkeeping, driven with made-up descriptors, inodes and clocks: the endpoint tests
(``test_viewer_crowd.py``) show the same policy letting real viewers in."""

from __future__ import annotations

import pytest

from graphtop.engine.telemetry.handshakes import PASSED_MEMORY_S, PendingHandshakes


def same_host(fd: int) -> str:
    return "10.0.0.1"


def table(limit: int = 2, patience_s: float = 1.0) -> PendingHandshakes:
    return PendingHandshakes(limit=limit, handshake_s=5.0, patience_s=patience_s)


def test_connections_count_until_they_pass_or_close() -> None:
    t = table()
    assert t.accepted((3, 30), 0.0, same_host) is None
    assert t.accepted((4, 40), 0.0, same_host) is None
    assert len(t) == 2
    t.passed((3, 30), 0.1)  # its Hello was read
    t.closed(4)
    assert len(t) == 0


def test_a_newcomer_is_shut_while_the_full_table_is_young_then_the_oldest_gives_way() -> None:
    t = table()
    t.accepted((3, 30), 0.0, same_host)
    t.accepted((4, 40), 0.5, same_host)
    assert t.accepted((5, 50), 0.9, same_host) == (5, 50)  # nobody waited 1 s yet: the newcomer retries
    assert t.accepted((6, 60), 1.2, same_host) == (3, 30)  # the one waiting since 0.0 gives way
    assert len(t) == 2
    assert t.accepted((7, 70), 1.3, same_host) == (7, 70)  # 4 waited 0.8 s, 6 just came


def test_an_address_holding_more_places_gives_one_up_to_another_address() -> None:
    peers = {3: "attacker", 4: "attacker", 5: "attacker", 9: "viewer"}
    t = table(limit=3, patience_s=60.0)
    for fd in (3, 4, 5):
        t.accepted((fd, fd * 10), float(fd), peers.__getitem__)
    # the flood is young (patience 60 s) yet its oldest gives way: one address cannot keep another out
    assert t.accepted((9, 90), 6.0, peers.__getitem__) == (3, 30)
    peers[10] = "attacker"
    assert t.accepted((10, 100), 7.0, peers.__getitem__) == (10, 100)  # the flood competes with itself
    t.passed((9, 90), 7.5)
    assert len(t) == 2


def test_a_connection_that_passed_before_its_accept_was_seen_is_not_counted_nor_shut() -> None:
    t = table(limit=1)
    t.passed((3, 30), 0.0)  # its message was read before the monitor's accept event
    assert not t.may_shut((3, 30))
    assert t.accepted((3, 30), 0.1, same_host) is None
    assert len(t) == 0
    assert not t.may_shut((3, 30))  # it stays passed: a later event naming it must not count it


def test_a_passed_viewer_is_never_counted_again_by_stale_accept_events() -> None:
    """An old connection's accept event, read after its number went to a viewer that passed, names the
    viewer's connection (its inode is read now); then that connection's own accept event comes. A full
    table must shut neither: the viewer would be attached with nobody hearing it (the crowd test)."""
    t = table(limit=1)
    t.accepted((9, 90), 0.0, same_host)  # the table is full of somebody's half-greeting
    t.passed((3, 31), 1.0)
    for at in (2.0, 3.0):  # the stale event, then its own
        assert t.accepted((3, 31), at, same_host) is None
    assert len(t) == 1 and not t.may_shut((3, 31))
    assert t.accepted((3, 31), 1.0 + PASSED_MEMORY_S + 1.0, same_host) is None  # forgotten: counted
    assert len(t) == 1


def test_a_stale_accept_event_for_a_counted_connection_counts_it_once() -> None:
    t = table(limit=2)
    t.accepted((3, 30), 0.0, same_host)
    assert t.accepted((3, 30), 2.0, same_host) is None  # not a newcomer that needs a place
    assert len(t) == 1


def test_a_stale_close_event_keeps_the_connection_now_on_that_descriptor() -> None:
    t = table(limit=2)
    t.accepted((3, 31), 0.0, same_host)
    t.closed(3, inode_now=31)  # about the connection that had number 3 before: 31 is still open
    assert len(t) == 1
    t.closed(3, inode_now=None)  # 31 closed
    assert len(t) == 0


def test_a_reused_descriptor_number_is_told_apart_by_its_inode() -> None:
    t = table(limit=1)
    t.accepted((3, 30), 0.0, same_host)
    t.passed((3, 31), 0.1)  # 3 closed (its event not read yet) and now holds a viewer that passed
    assert len(t) == 1  # the old entry stays until its close is read
    t.closed(3)
    assert t.accepted((3, 31), 0.2, same_host) is None
    assert len(t) == 0


def test_patience_counts_to_when_the_endpoint_last_read_its_messages() -> None:
    t = table(limit=1)
    t.accepted((3, 30), 0.0, same_host)
    # 5 s later but the endpoint has not read its messages since 0.5 s: 3's Hello may be waiting there
    assert t.accepted((4, 40), 5.0 - 1e-3, same_host, read_at=0.5) == (4, 40)
    assert t.accepted((4, 40), 5.0 - 1e-3, same_host, read_at=1.5) == (3, 30)


def test_entries_expire_after_the_handshake_timeout() -> None:
    t = table(limit=1, patience_s=60.0)
    t.accepted((3, 30), 0.0, same_host)
    assert t.accepted((4, 40), 6.0, same_host) is None  # 3 was dropped by ZeroMQ or passed by now
    assert len(t) == 1


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        PendingHandshakes(limit=0)
