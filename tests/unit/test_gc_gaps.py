"""Young garbage collections moved into the open loop's gaps (rig.loadgen.gc_gaps.GapCollector)."""

import gc

from rig.loadgen.gc_gaps import BACKSTOP, GEN0_GAP_S, GapCollector


def test_start_defers_the_automatic_collector_and_stop_restores_it():
    before = gc.get_threshold()
    c = GapCollector()
    c.start()
    try:
        assert c.active and gc.get_threshold() == (BACKSTOP, before[1], before[2])
    finally:
        c.stop()
    assert gc.get_threshold() == before and not c.active


def test_a_collection_runs_only_when_due_and_when_it_fits_the_gap():
    t0 = gc.get_threshold()[0]
    c = GapCollector()
    c.start()
    try:
        gc.collect(0)  # generation 0 empty: nothing due
        assert c.collect(1.0) is None
        junk = [[i] for i in range(2 * t0)]  # container allocations past the usual threshold: a collection is due
        assert gc.get_count()[0] >= t0  # the automatic collector (deferred to BACKSTOP) did not run
        assert c.collect(GEN0_GAP_S / 2) is None  # the next send is too close: not now
        assert gc.get_count()[0] >= t0
        assert c.collect(1.0) in (0, 1)  # a long gap: the due collection runs
        assert gc.get_count()[0] < t0
        del junk
    finally:
        c.stop()


def test_nothing_happens_with_the_collector_disabled():
    gc.disable()
    try:
        c = GapCollector()
        c.start()
        assert not c.active and c.collect(1.0) is None
        c.stop()
    finally:
        gc.enable()
