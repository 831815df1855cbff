#!/usr/bin/python3
"""Guest failures in kmig: a triple fault and an instruction KVM cannot
emulate are reported (exit, registers, bytes at RIP), the VM stops, QMP
stays up and tells the state; a guest-internal fault does not hurt kmig;
without --qmp a guest failure ends kmig with status 1."""
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from kmigtest import GUEST, KMIG, Report, have_kvm, kmig_vm, tmpdir  # noqa: E402

R = Report()
RIP_LINE = r"rip=([0-9a-f]+)"
CODE_LINE = r"code at rip \(gpa ([0-9a-f]+)\): ((?:[0-9a-f]{2} ?)+)"


def why(vm):
    return "console:\n%s\nkmig output:\n%s" % (vm.console.text()[-1000:], vm.output()[-2000:])


def wait_output(vm, pattern, timeout=20.0):
    rx = re.compile(pattern)
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = rx.search(vm.output())
        if m:
            return m
        time.sleep(0.05)
    return None


def symbol(name):
    """Address of a symbol of the guest ELF, or None (no nm)."""
    try:
        out = subprocess.run(["nm", GUEST], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        f = line.split()
        if len(f) == 3 and f[2] == name:
            return int(f[0], 16)
    return None


def wait_status(q, want, timeout=10.0):
    deadline = time.time() + timeout
    s = None
    while time.time() < deadline:
        s = q.cmd("query-status")
        if s.get("status") == want:
            break
        time.sleep(0.05)
    return s


def guest_failure(d, name, crash, what, status):
    vm = kmig_vm(d, name, "workload=idle report_ms=200 crash=" + crash, memory="256M")
    try:
        q = vm.qmp()
        R.ok(name + "_guest_line", vm.console.wait("kmig-guest crash=" + crash, timeout=20,
                                                   proc=vm.proc) is not None, why(vm))
        m = wait_output(vm, CODE_LINE)
        if not R.ok(name + "_report", m is not None, why(vm)):
            return None
        out = vm.output()
        R.ok(name + "_report_names_exit", what in out, "no %r in: %s" % (what, out[-2000:]))
        rip = re.search(RIP_LINE, out)
        R.ok(name + "_report_registers", rip is not None and "rsp=" in out and "cr3=" in out,
             out[-2000:])
        R.ok(name + "_report_code_bytes", len(m.group(2).split()) >= 8, m.group(0))
        s = wait_status(q, status)
        R.ok(name + "_query_status", s.get("status") == status and s.get("running") is False,
             "query-status %s" % s)
        r = q.cmd_full("cont")
        R.ok(name + "_cont_refused", r.get("error", {}).get("class") == "GenericError",
             "cont replied %s" % r)
        time.sleep(1.0)
        R.ok(name + "_kmig_alive", vm.proc.poll() is None,
             "kmig exited with %s; %s" % (vm.proc.poll(), why(vm)))
        R.ok(name + "_qmp_answers", q.cmd("query-version").get("package", "").startswith("kmig"),
             "")
        s = q.cmd("query-status")
        R.ok(name + "_status_stays", s.get("status") == status, "query-status %s" % s)
        q.cmd_full("quit")
        rc = vm.wait_exit(10)
        R.ok(name + "_quit_exits", rc is not None and rc >= 0, "exit status %s" % rc)
        return int(rip.group(1), 16) if rip else None, m.group(2).split()
    finally:
        vm.kill()


def test_triple(d):
    guest_failure(d, "triple", "triple", "triple fault", "guest-panicked")


def test_emul(d):
    res = guest_failure(d, "emul", "emul", "internal error", "internal-error")
    if not res:
        return
    rip, code = res
    want = symbol("r0_crash_emul")
    if want is None:
        R.skip("emul_rip_is_popcnt", "nm not available")
    else:
        R.ok("emul_rip_is_popcnt", rip == want and code[:4] == ["f3", "48", "0f", "b8"],
             "rip=0x%x (r0_crash_emul=0x%x) code=%s" % (rip or 0, want, code))


def test_ud(d):
    vm = kmig_vm(d, "ud", "workload=idle report_ms=200 crash=ud", memory="256M")
    try:
        m = vm.console.wait(r"kmig-guest fault vec=6 rip=0x[0-9a-f]+ err=0x0 cr2=0x0 cpu=0",
                            timeout=20, proc=vm.proc)
        R.ok("ud_guest_fault_line", m is not None, why(vm))
        time.sleep(1.0)
        rc = vm.proc.poll()
        out = vm.output()
        R.ok("ud_kmig_not_crashed", rc is None or rc >= 0, "kmig killed by signal %s" % rc)
        R.ok("ud_no_vmm_failure", not re.search(r"triple fault|internal error|Sanitizer|"
                                                r"Segmentation|Aborted", out), out[-2000:])
        if rc is None:
            try:
                s = vm.qmp().cmd("query-status")
                R.ok("ud_qmp_answers", "status" in s, "query-status %s" % s)
            except (OSError, EOFError, RuntimeError, ValueError) as e:
                R.ok("ud_qmp_answers", False, repr(e))
    finally:
        vm.kill()


def test_no_qmp(d, crash, what):
    name = "no_qmp_" + crash
    console = os.path.join(d, name + ".log")
    args = [KMIG, "run", "--kernel", GUEST, "--cmdline", "workload=idle crash=" + crash,
            "--memory", "256M", "--console", "file:" + console]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        R.ok(name + "_exits_1", False, "kmig still running 20 s after the crash")
        return
    R.ok(name + "_exits_1", p.returncode == 1, "exit status %s; stderr %s" % (p.returncode, err))
    R.ok(name + "_reported", what in err and "code at rip" in err, "stderr: %s" % err)


def main():
    if not os.path.exists("/dev/kvm"):
        R.skip("failures", "/dev/kvm is absent")
        R.done()
    if not have_kvm():
        R.ok("failures_kvm_access", False, "/dev/kvm exists but is not accessible")
        R.done()
    d = tmpdir()
    try:
        test_triple(d)
        test_emul(d)
        test_ud(d)
        test_no_qmp(d, "triple", "triple fault")
        test_no_qmp(d, "emul", "internal error")
    finally:
        shutil.rmtree(d, ignore_errors=True)
    R.done()


if __name__ == "__main__":
    main()
