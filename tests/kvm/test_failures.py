"""Guest failures in kmig: a triple fault and an instruction KVM cannot
emulate are reported (exit, registers, bytes at RIP), the VM stops, QMP
stays up and tells the state; a guest-internal fault does not hurt kmig;
without --qmp a guest failure ends kmig with status 1."""
import os
import re
import struct
import subprocess
import time

import pytest

import kmigtest as kt

pytestmark = pytest.mark.kvm

RIP_LINE = r"rip=([0-9a-f]+)"
CODE_LINE = r"code at rip \(gpa ([0-9a-f]+)\): ((?:[0-9a-f]{2} ?)+)"
# kvm_amd INITs a vCPU on a shutdown intercept (the VMCB is undefined after
# it), so after a triple fault kmig can only show the reset state and says so
# (src/kvm/vcpu_report.c); kvm_pvm and kvm_intel keep the faulting state.
RESET_NOTE = r"registers are the vCPU's INIT state"


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
    """Address of a symbol of the guest ELF (its .symtab), or None.  Read
    here rather than with nm: nm takes ~30 s to start inside scripts/kvm-vm."""
    with open(kt.GUEST, "rb") as f:
        elf = f.read()
    if elf[:6] != b"\x7fELF\x02\x01":          # ELF64, little-endian
        return None
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", elf, 0x3a)
    sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize)
                for i in range(shnum)]
    for sh in sections:
        if sh[1] != 2:                           # SHT_SYMTAB
            continue
        off, size, strtab, entsize = sh[4], sh[5], sections[sh[6]][4], sh[9]
        for o in range(off, off + size, entsize):
            st_name, _, _, _, st_value, _ = struct.unpack_from("<IBBHQQ", elf, o)
            end = elf.index(b"\0", strtab + st_name)
            if elf[strtab + st_name:end] == name.encode():
                return st_value
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


def guest_failure(d, vms, check, name, crash, what, status):
    """Returns (rip, code bytes) of kmig's report, or None; code is None
    when kmig reported (on kvm_amd, after a triple fault) that the faulting
    state is lost."""
    vm = kt.kmig_vm(d, name, "workload=idle report_ms=200 crash=" + crash, memory="256M")
    vms.append(vm)
    q = vm.qmp()
    check(name + "_guest_line", vm.console.wait("kmig-guest crash=" + crash, timeout=kt.slow(20),
                                                proc=vm.proc) is not None, why(vm))
    m = wait_output(vm, CODE_LINE + "|" + RESET_NOTE, timeout=kt.slow(20))
    reset = m is not None and re.search(RESET_NOTE, m.group(0)) is not None
    if reset:
        # no code bytes to show: only right after a triple fault on kvm_amd
        check(name + "_reset_state_only_on_kvm_amd_triple",
              crash == "triple" and kt.kvm_module() == "kvm_amd",
              "kmig says the vCPU was reset after crash=%s on %s; %s"
              % (crash, kt.kvm_module(), why(vm)))
        m = wait_output(vm, r"code at rip: not in guest RAM", timeout=kt.slow(5))
    if not check(name + "_report", m is not None, why(vm)):
        return None
    out = vm.output()
    check(name + "_report_names_exit", what in out, "no %r in: %s" % (what, out[-2000:]))
    rip = re.search(RIP_LINE, out)
    check(name + "_report_registers", rip is not None and "rsp=" in out and "cr3=" in out,
          out[-2000:])
    if reset:
        # instead of the code bytes: the registers shown are the INIT state
        check(name + "_report_init_state", rip is not None and int(rip.group(1), 16) == 0xfff0
              and "cs=f000" in out, out[-2000:])
    else:
        check(name + "_report_code_bytes", len(m.group(2).split()) >= 8, m.group(0))
    s = wait_status(q, status, timeout=kt.slow(10))
    check(name + "_query_status", s.get("status") == status and s.get("running") is False,
          "query-status %s" % s)
    r = q.cmd_full("cont")
    check(name + "_cont_refused", r.get("error", {}).get("class") == "GenericError",
          "cont replied %s" % r)
    time.sleep(1.0)
    check(name + "_kmig_alive", vm.proc.poll() is None,
          "kmig exited with %s; %s" % (vm.proc.poll(), why(vm)))
    check(name + "_qmp_answers", q.cmd("query-version").get("package", "").startswith("kmig"),
          "")
    s = q.cmd("query-status")
    check(name + "_status_stays", s.get("status") == status, "query-status %s" % s)
    q.cmd_full("quit")
    rc = vm.wait_exit(kt.slow(10))
    check(name + "_quit_exits", rc is not None and rc >= 0, "exit status %s" % rc)
    return int(rip.group(1), 16) if rip else None, None if reset else m.group(2).split()


def test_triple_fault(d, vms, check):
    guest_failure(d, vms, check, "triple", "triple", "triple fault", "guest-panicked")


def test_emulation_failure(d, vms, check):
    res = guest_failure(d, vms, check, "emul", "emul", "internal error", "internal-error")
    if not res:
        return
    rip, code = res
    want = symbol("r0_crash_emul")
    if check("emul_rip_is_popcnt_symbol", want is not None,
             "no symbol r0_crash_emul in %s" % kt.GUEST):
        check("emul_rip_is_popcnt", rip == want and (code or [])[:4] == ["f3", "48", "0f", "b8"],
              "rip=0x%x (r0_crash_emul=0x%x) code=%s" % (rip or 0, want, code))


def test_guest_ud_fault(d, vms, check):
    vm = kt.kmig_vm(d, "ud", "workload=idle report_ms=200 crash=ud", memory="256M")
    vms.append(vm)
    m = vm.console.wait(r"kmig-guest fault vec=6 rip=0x[0-9a-f]+ err=0x0 cr2=0x0 cpu=0",
                        timeout=kt.slow(20), proc=vm.proc)
    check("ud_guest_fault_line", m is not None, why(vm))
    time.sleep(1.0)
    rc = vm.proc.poll()
    out = vm.output()
    check("ud_kmig_not_crashed", rc is None or rc >= 0, "kmig killed by signal %s" % rc)
    check("ud_no_vmm_failure", not re.search(r"triple fault|internal error|Sanitizer|"
                                             r"Segmentation|Aborted", out), out[-2000:])
    if rc is None:
        try:
            s = vm.qmp().cmd("query-status")
            check("ud_qmp_answers", "status" in s, "query-status %s" % s)
        except (OSError, EOFError, RuntimeError, ValueError) as e:
            check("ud_qmp_answers", False, repr(e))


@pytest.mark.parametrize("crash, what", [("triple", "triple fault"),
                                         ("emul", "internal error")])
def test_no_qmp_exit_1(d, check, crash, what):
    name = "no_qmp_" + crash
    console = os.path.join(d, name + ".log")
    args = [kt.KMIG, "run", "--kernel", kt.GUEST, "--cmdline", "workload=idle crash=" + crash,
            "--memory", "256M", "--console", "file:" + console]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=kt.slow(20))
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, err = p.communicate()
        check(name + "_exits_1", False, "kmig still running %d s after the crash; stderr %s"
              % (kt.slow(20), err))
        return
    check(name + "_exits_1", p.returncode == 1, "exit status %s; stderr %s" % (p.returncode, err))
    check(name + "_reported", what in err and "code at rip" in err, "stderr: %s" % err)
    san = kt.SANITIZER_RX.search(out + err)
    check(name + "_no_sanitizer_report", san is None, san.group(0) if san else "")
