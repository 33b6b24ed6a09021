"""engine/switch_interval.py: the smallest bound asked for holds; the process's interval comes back after the
last ask, unless someone else changed it meanwhile."""

from __future__ import annotations

import sys

import pytest

from graphtop.engine import switch_interval


@pytest.fixture(autouse=True)
def default_interval():
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(before)


def test_the_smallest_ask_holds_and_the_interval_comes_back_after_the_last():
    parity = switch_interval.at_most(0.0005)
    assert sys.getswitchinterval() == pytest.approx(0.0005, abs=2e-6)
    server = switch_interval.at_most(0.0002)
    assert sys.getswitchinterval() == pytest.approx(0.0002, abs=2e-6)
    switch_interval.release(server)
    assert sys.getswitchinterval() == pytest.approx(0.0005, abs=2e-6)  # the parity checker still asks
    switch_interval.release(server)  # a second release of a token: nothing
    assert sys.getswitchinterval() == pytest.approx(0.0005, abs=2e-6)
    switch_interval.release(parity)
    assert sys.getswitchinterval() == pytest.approx(0.005, abs=2e-6)
    switch_interval.release(None)


def test_an_ask_never_raises_a_shorter_interval_and_leaves_anothers_setting_alone():
    sys.setswitchinterval(0.0001)
    ask = switch_interval.at_most(0.0005)
    assert sys.getswitchinterval() == pytest.approx(0.0001, abs=2e-6)  # already shorter: kept
    switch_interval.release(ask)
    assert sys.getswitchinterval() == pytest.approx(0.0001, abs=2e-6)
    ask = switch_interval.at_most(0.0005)
    sys.setswitchinterval(0.003)  # someone else, meanwhile
    switch_interval.release(ask)
    assert sys.getswitchinterval() == pytest.approx(0.003, abs=2e-6)
