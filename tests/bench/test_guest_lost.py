"""bench/migrate's guest_lost: the time the guest lost while migrating,
from the work count its stress lines carry (no KVM: the lines are made
here).  It must count every wait, whatever its cause, and nothing when
the guest kept its pace."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "migrate"))
import run as mb  # noqa: E402

RATE = 20000.0          # pages per second at full pace
PERIOD = 0.05           # a report every 50 ms


def lines_of(stalls, n=200, cpu=0, offset=100.0, guest_hides=()):
    """Console lines (host time, text) of a guest writing RATE pages a
    second that stops for stalls[i] seconds before report i; a report in
    guest_hides also hides its stall from the guest's clock (as QEMU's
    restored TSC hides a pause)."""
    out, host, guest, pages = [], offset, 0.0, 0
    for i in range(n):
        stall = stalls.get(i, 0.0)
        host += PERIOD + stall
        guest += PERIOD + (0.0 if i in guest_hides else stall)
        pages += int(RATE * PERIOD)
        out.append((host, "stress cpu=%d t_ms=%d ms_per_gib=13.10 max_ms_per_gib=13.50 pages=%d"
                    % (cpu, round(guest * 1000), pages)))
    return out


def lost(seen, t_start, t_end):
    lines = mb.stress_lines(seen)
    g0 = (t_start - mb.guest_offset(seen)) * 1000.0
    return mb.guest_lost(lines, g0, t_start, t_end)


def test_full_pace_loses_nothing():
    seen = lines_of({})
    r = lost(seen, seen[50][0], seen[150][0])
    assert abs(r["sum_s"]) < 0.002, r


def test_every_stall_counts():
    seen = lines_of({80: 0.3, 90: 0.05, 120: 1.25})
    r = lost(seen, seen[60][0], seen[150][0])
    assert abs(r["sum_s"] - 1.6) < 0.002, r


def test_stall_outside_the_window_does_not_count():
    seen = lines_of({20: 2.0, 170: 2.0})
    r = lost(seen, seen[60][0], seen[150][0])
    assert abs(r["sum_s"]) < 0.002, r


def test_pause_hidden_from_the_guest_clock_counts():
    # a pause the guest's clock does not see (QEMU restores the TSC) is
    # still lost: the window is measured in host time
    seen = lines_of({100: 0.5}, guest_hides=(100,))
    r = lost(seen, seen[60][0], seen[150][0])
    assert abs(r["sum_s"] - 0.5) < 0.002, r


def test_vcpus_summed():
    seen = sorted(lines_of({100: 0.2}, cpu=0) + lines_of({110: 0.7}, cpu=1))
    r = lost(seen, seen[120][0], seen[300][0])
    assert r["per_cpu_s"].keys() == {"0", "1"}
    assert abs(r["per_cpu_s"]["0"] - 0.2) < 0.002 and abs(r["per_cpu_s"]["1"] - 0.7) < 0.002, r


def first_touch_then_full_pace(area=30000, slow=100, n=800):
    """A guest whose first sweep over its area (share line: area pages)
    writes only slow pages a report, as first writes into host memory the
    host had given back do, then RATE pages a second."""
    out, host, pages = [(99.0, "kmig-guest share cpu=0 base=0x1000000 pages=%d" % area)], 100.0, 0
    for i in range(n):
        host += PERIOD
        pages += slow if pages < area else int(RATE * PERIOD)
        out.append((host, "stress cpu=0 t_ms=%d ms_per_gib=%.2f max_ms_per_gib=%.2f pages=%d"
                    % (round((host - 100.0) * 1000), 13.1 if pages > area else 131.0,
                       13.5 if pages > area else 131.0, pages)))
    return out


def test_first_touch_is_not_the_baseline():
    # the first sweep is most of what came before the window: were its
    # reports the baseline (the first report alone left out, as before),
    # the guest at full pace would seem to have gained seconds
    seen = first_touch_then_full_pace()
    warm = [l for l in mb.stress_lines(seen) if l["warm"]]
    assert warm and warm[0]["pages"] >= 30000 + mb.PAGES_PER_GIB + 1000, warm[:1]
    r = lost(seen, seen[580][0], seen[700][0])
    assert abs(r["sum_s"]) < 0.002, r


def test_settled_counts_warm_reports_only():
    seen = first_touch_then_full_pace()
    assert mb.warm_reports(seen[:400], 1) == [0]
    assert mb.warm_reports(seen, 1)[0] > 200


def test_old_lines_without_a_count():
    seen = [(h, l.rsplit(" pages=", 1)[0]) for h, l in lines_of({100: 0.5})]
    assert lost(seen, seen[60][0], seen[150][0]) is None
