"""How the Linux tests read the guest's interrupt probe
(tests/lib/linux_guest.py probe_verdict, guest/linux/init kmig.probe): no
KVM, lines as the guest prints them.  A probe whose RTC interrupt never
reached Linux fails at once; one whose interrupt Linux counted but whose
reader woke late (a throttled source) is let pass only as the first probe
and only once an OK probe follows."""
import linux_guest as lg


def line(n, rtc, rtc0=9, raised=None, woke=None, serial=154):
    s = "KMIG-LINUX probe n=%d rtc=%s timer=18429 rtc0=%d serial=%d virtio=14" % (
        n, rtc, rtc0, serial)
    return s + (" raised=%d woke=%d" % (raised, woke) if raised is not None else "")


def verdict(*lines):
    return lg.probe_verdict(list(lg.PROBE.finditer("\n".join(lines))))[0]


def test_ok():
    assert verdict(line(5, "OK", raised=2, woke=2)) is True


def test_undecided_without_probe():
    assert verdict() is None


def test_late_wake_then_ok():
    # CI of 3b019e2: rtcwait woke for none of the interrupt Linux counted
    late = line(5, "FAIL", raised=1, woke=0)
    assert verdict(late) is None
    assert verdict(late, line(6, "OK", rtc0=11, raised=2, woke=2)) is True


def test_late_wake_then_fail():
    assert verdict(line(5, "FAIL", raised=1, woke=0),
                   line(6, "FAIL", rtc0=10, raised=1, woke=0)) is False


def test_lost_interrupt_fails_at_once():
    # the RTC's edge lost at a load: Linux counted nothing (rtc0 as before)
    assert verdict(line(4, "FAIL", rtc0=6, raised=0, woke=0),
                   line(5, "OK", rtc0=8, raised=2, woke=2)) is False
    # one interrupt came and woke rtcwait, the next never came
    assert verdict(line(4, "FAIL", rtc0=7, raised=1, woke=1)) is False


def test_late_wake_only_first():
    assert verdict(line(5, "OK", raised=2, woke=2), line(6, "FAIL", raised=1, woke=0)) is True
    assert verdict(line(5, "FAIL", raised=0, woke=0),
                   line(6, "FAIL", raised=1, woke=0)) is False


def test_rtcwait_without_count_is_not_late():
    assert verdict(line(5, "FAIL", raised=1, woke=-1)) is False


def test_old_line_fail_fails():
    # an initramfs from before raised/woke: no evidence of a late wake
    assert verdict(line(5, "FAIL")) is False
    assert verdict(line(5, "OK")) is True


def test_ok_needs_counts():
    assert verdict(line(5, "OK", serial=0, raised=2, woke=2)) is False
