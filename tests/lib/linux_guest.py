"""A stock Linux guest for the tests marked linux: Debian's kernel (the
bzImage scripts/kvm-vm downloads into its cache) with the project's
initramfs (guest/linux/mkinitrd.sh: busybox, memcheck, rtcwait, /init and
Linux's virtio modules), run by kmig.  memcheck's report line and what a
clean console means are here so that every Linux test reads them alike.
"""
import os
import re
import subprocess

import kmigtest as kt

CACHE = os.environ.get("KMIG_VM_CACHE", "/var/cache/kmig/kvm-vm")
KERNEL = os.path.join(CACHE, "vmlinuz")
GUEST_MODS = os.path.join(CACHE, "guest-mods")
REPORT = re.compile(r"^memcheck mode=verify thr=(\d+) gen=(\d+) pages=(\d+) bad=(\d+) "
                    r"t_ms=(\d+) max_step_ms=(\d+) back=(\d+)", re.M)
# a report of memcheck's verify mode with no page found wrong
REPORT_OK = r"^memcheck mode=verify thr=\d+ gen=\d+ pages=\d+ bad=0 "
# what must never appear on the console of a guest under migration, once
# its init runs (the boot before it holds the emulated CPU's XSAVE warning,
# docs/platform.md)
BAD = ("watchdog", "stall", "soft lockup", "hard LOCKUP", "BUG:", "Oops", "Call Trace",
       "WARNING:", "Kernel panic", "memcheck BAD", "unstable", "KMIG-LINUX insmod")
# the init's probe line (guest/linux/init, kmig.probe); a line a kernel
# message split after virtio= has no raised and late_ms
PROBE = re.compile(r"KMIG-LINUX probe n=(\d+) rtc=(\w+) timer=(\d+) rtc0=(\d+) serial=(\d+) "
                   r"virtio=(\d+)(?: raised=(-?\d+) late_ms=(-?\d+))?")
# the clocksource watchdog's note that an interval grew by a stop (the
# downtime): it skips that one comparison, it reports nothing wrong
BENIGN = ("Long readout interval, skipping watchdog check",)


def missing():
    """Why the kernel cache cannot serve a Linux guest, or ""."""
    if os.path.isfile(KERNEL) and os.path.isfile(os.path.join(GUEST_MODS, "modules.list")):
        return ""
    return "%s incomplete: scripts/kvm-vm --prepare fetches the kernel" % CACHE


def initramfs(d):
    """Builds the project's Linux initramfs with Linux's virtio modules into d."""
    out = os.path.join(d, "linux-initrd.gz")
    subprocess.run([os.path.join(kt.ROOT, "guest/linux/mkinitrd.sh"), out,
                    os.path.join(kt.BUILD, "linux", "memcheck"), GUEST_MODS], check=True)
    return out


def cmdline(mib, cpus, extra=""):
    """memcheck verify over mib MiB on every vCPU; the PIC alone on one."""
    apic = "noapic nolapic " if cpus == 1 else ""
    return ("console=ttyS0 panic=-1 %skmig.mode=verify kmig.mib=%d kmig.threads=%d "
            "kmig.report_ms=1000 %s" % (apic, mib, cpus, extra)).strip()


def vm(d, name, rd, cmd, memory="512M", cpus=1, extra=(), netns=None):
    """kmig running the Linux guest: console d/name.log, QMP d/name.qmp;
    netns: the network namespace to run in."""
    con = os.path.join(d, name + ".log")
    qmp = os.path.join(d, name + ".qmp")
    args = [os.path.join(kt.BUILD, "kmig"), "run", "--kernel", KERNEL, "--initrd", rd,
            "--memory", memory, "--cpus", str(cpus), "--console", "file:" + con,
            "--qmp", "unix:" + qmp, "--cmdline", cmd] + list(extra)
    return kt.VM(kt.in_netns(netns, args), con, qmp)


def reports(vm_):
    return [tuple(int(x) for x in m.groups()) for m in REPORT.finditer(vm_.console.text())]


def init_line(vm_):
    """The console's line number where the guest's init began, or 0."""
    return next((i for i, l in enumerate(vm_.console.text().splitlines())
                 if "KMIG-LINUX up" in l), 0)


def around_first_bad(vm_, start=0, before=12):
    """The console lines before (and at) the first bad one from line start
    on: what Linux said when it began to report trouble ("" if none)."""
    lines = vm_.console.text().splitlines()
    for i in range(start, len(lines)):
        if any(b in lines[i] for b in BAD) and not any(b in lines[i] for b in BENIGN):
            return " / ".join(lines[max(start, i - before):i + 1])
    return ""


def bad_lines(vm_, start=0):
    """Console lines from line start on that tell of a problem."""
    return [l for l in vm_.console.text().splitlines()[start:]
            if any(b in l for b in BAD) and not any(b in l for b in BENIGN)]


def late_wake(p):
    """Whether a failed probe p (a PROBE match) is a late wake-up: after
    rtcwait gave up, the RTC interrupt it waited for still reached it
    (late_ms).  The device delivered; the guest's own work item that hands
    an RTC interrupt on to its readers (and arms the next alarm) ran late,
    as it does on a source the throttle holds (docs/testing.md, "The RTC
    under a throttle").  After an interrupt lost on its way to Linux no
    alarm is armed again and nothing comes."""
    return p.group(8) is not None and int(p.group(8)) >= 0


def probe_verdict(probes):
    """Whether the probes a guest printed after a point (PROBE matches, in
    order) show its interrupts arriving: (True, line) at the first OK probe
    whose timer, RTC and UART counts are all above 0; (False, line) at an
    OK probe with a count of 0 or at a failed probe, except that the first
    probe may be a late wake (its wait may have begun on a throttled
    source), if an OK probe follows; (None, text) while undecided."""
    for i, p in enumerate(probes):
        if p.group(2) == "OK":
            return all(int(p.group(k)) > 0 for k in (3, 4, 5)), p.group(0)
        if i > 0 or not late_wake(p):
            return False, p.group(0)
    return None, probes[0].group(0) + " (a late wake; the next probe decides)" \
        if probes else "no probe yet"
