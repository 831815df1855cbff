"""A guest that halts every vCPU with interrupts off ends `kmig run` with
status 0 (a halt probe of the control loop); one that keeps a vCPU running
does not."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from kmigtest import Report, have_kvm, kmig_vm, tmpdir  # noqa: E402

r = Report()
if not have_kvm():
    r.skip("halt", "no /dev/kvm")
    r.done()

d = tmpdir()
vm = kmig_vm(d, "ud", "crash=ud", memory="256M")
try:
    rc = vm.wait_exit(15)
    r.ok("halt_all_vcpus_exit_status_0", rc == 0, "exit status %r" % rc)
    r.ok("halt_guest_fault_line_printed",
         vm.console.wait(r"kmig-guest fault vec=6", timeout=1) is not None, vm.console.text())
    r.ok("halt_reason_logged", "halted with interrupts off" in vm.output(), vm.output())
finally:
    vm.kill()

vm = kmig_vm(d, "ud2", "crash=ud", memory="256M", cpus=2)
try:
    q = vm.qmp()
    ev = q.wait_event("SHUTDOWN", timeout=15)
    r.ok("halt_shutdown_event_guest_true", ev is not None and ev["data"].get("guest") is True,
         "event %r" % ev)
    r.ok("halt_two_vcpus_one_never_started_exit_0", vm.wait_exit(10) == 0,
         "exit status %r" % vm.proc.poll())
finally:
    vm.kill()

vm = kmig_vm(d, "idle", "workload=idle cpus=2 report_ms=200", memory="256M", cpus=2)
try:
    ok = vm.console.wait(r"kmig-guest ready cpus=2", timeout=15) is not None
    time.sleep(3)
    r.ok("halt_one_vcpu_running_keeps_vm_alive", ok and vm.proc.poll() is None,
         "exit %r" % vm.proc.poll())
    n = vm.console.count(r"^heartbeat")
    time.sleep(1)
    r.ok("halt_heartbeats_continue", vm.console.count(r"^heartbeat") > n)
finally:
    vm.kill()
r.done()
