"""How the Linux tests read the guest's interrupt probe
(tests/lib/linux_guest.py probe_verdict, guest/linux/init kmig.probe): no
KVM, lines as the guest prints them.  A failed probe whose RTC interrupt
never came fails at once; one whose interrupt came after rtcwait gave up
(late_ms: the guest's own work item ran late, on a throttled source) is
let pass only as the first probe and only once an OK probe follows."""
import linux_guest as lg


def line(n, rtc, rtc0=9, raised=None, late=-1, serial=154):
    s = "KMIG-LINUX probe n=%d rtc=%s timer=18429 rtc0=%d serial=%d virtio=14" % (
        n, rtc, rtc0, serial)
    return s + (" raised=%d late_ms=%d" % (raised, late) if raised is not None else "")


def verdict(*lines):
    return lg.probe_verdict(list(lg.PROBE.finditer("\n".join(lines))))[0]


LATE = line(5, "FAIL", raised=1, late=5700)


def test_ok():
    assert verdict(line(5, "OK", raised=2)) is True


def test_undecided_without_probe():
    assert verdict() is None


def test_late_wake_then_ok():
    # as in the CI of 3b019e2 (rtc0=9 after four OK probes, rtcwait
    # interrupts=0): the interrupt came, rtcwait heard of it 5.7 s late
    assert verdict(LATE) is None
    assert verdict(LATE, line(6, "OK", rtc0=11, raised=2)) is True


def test_late_at_once_is_late():
    # the interrupt came the moment rtcwait gave up: 0 ms late still came
    assert verdict(line(5, "FAIL", raised=1, late=0), line(6, "OK", rtc0=11, raised=2)) is True


def test_late_wake_then_fail():
    assert verdict(LATE, line(6, "FAIL", rtc0=10, raised=1, late=300)) is False
    assert verdict(LATE, line(6, "FAIL", rtc0=10, raised=0)) is False


def test_lost_interrupt_fails_at_once():
    # the RTC's edge lost at a load: nothing came, not even late
    assert verdict(line(4, "FAIL", rtc0=6, raised=0), line(5, "OK", rtc0=8, raised=2)) is False
    # Linux counted an edge (unhandled, or merged with one rtcwait read)
    # but no report ever reached rtcwait: not a late wake either
    assert verdict(line(4, "FAIL", rtc0=7, raised=1)) is False


def test_late_wake_only_first():
    assert verdict(line(5, "OK", raised=2), LATE) is True
    assert verdict(LATE, LATE, line(7, "OK", rtc0=12, raised=2)) is False


def test_split_line_fail_fails():
    # a kernel message cut the line after virtio=: no evidence of a late wake
    assert verdict(line(5, "FAIL")) is False
    assert verdict(line(5, "OK")) is True


def test_ok_needs_counts():
    assert verdict(line(5, "OK", serial=0, raised=2)) is False
