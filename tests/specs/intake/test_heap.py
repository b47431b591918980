"""A started worker's heap is frozen and its collector's passes spaced (`workers/intake/heap.py`).

Given a process that has loaded what it needs, when it settles, then what it holds is
frozen (the collector never scans it again), the young generation's threshold is the
worker's, and garbage made afterwards, cycles included, is still collected.
"""
from __future__ import annotations

import gc
import weakref

import pytest

from workers.intake import heap


@pytest.fixture
def restored():
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


class Node:
    pass


def test_a_settled_heap_is_frozen_and_later_cycles_are_still_collected(restored):
    # Given what this process holds now
    held = len(gc.get_objects())

    # When it settles
    heap.settle()

    # Then what it held is frozen, and the young generation waits for the worker's threshold
    assert gc.get_freeze_count() >= held // 2
    assert gc.get_threshold() == heap.THRESHOLDS
    # and a cycle made afterwards is still garbage the collector frees
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None
