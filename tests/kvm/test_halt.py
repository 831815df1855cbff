"""A guest that halts every vCPU with interrupts off ends `kmig run` with
status 0 (a halt probe of the control loop); one that keeps a vCPU running
does not.  A guest's reset request (0xfe to port 0x64) ends it too, at
once and said so: kmig does not reboot a guest."""
import time

import pytest

import kmigtest as kt

pytestmark = pytest.mark.kvm


def test_halt_all_vcpus_exits_0(d, vms, check):
    vm = kt.kmig_vm(d, "ud", "crash=ud", memory="256M")
    vms.append(vm)
    rc = vm.wait_exit(kt.slow(15))
    check("exit_status_0", rc == 0, "exit status %r" % rc)
    check("guest_fault_line_printed",
          vm.console.wait(r"kmig-guest fault vec=6", timeout=1) is not None, vm.console.text())
    check("reason_logged", "halted with interrupts off" in vm.output(), vm.output())


def test_halt_two_vcpus_one_never_started(d, vms, check):
    vm = kt.kmig_vm(d, "ud2", "crash=ud", memory="256M", cpus=2)
    vms.append(vm)
    ev = vm.qmp().wait_event("SHUTDOWN", timeout=kt.slow(15))
    check("shutdown_event_guest_true", ev is not None and ev["data"].get("guest") is True,
          "event %r" % ev)
    check("exit_0", vm.wait_exit(10) == 0, "exit status %r" % vm.proc.poll())


def test_halt_one_vcpu_running_keeps_vm_alive(d, vms, check):
    vm = kt.kmig_vm(d, "idle", "workload=idle cpus=2 report_ms=200", memory="256M", cpus=2)
    vms.append(vm)
    ok = vm.console.wait(r"kmig-guest ready cpus=2", timeout=kt.slow(15)) is not None
    time.sleep(3)
    check("vm_alive", ok and vm.proc.poll() is None, "exit %r" % vm.proc.poll())
    n = vm.console.count(r"^heartbeat")
    time.sleep(1)
    check("heartbeats_continue", vm.console.count(r"^heartbeat") > n)


def test_reset_request_exits_0(d, vms, check):
    # ignored, the request would leave the guest to say it still runs and
    # halt, which the halt probe ends with status 0 too: the console and
    # the log tell the two apart
    vm = kt.kmig_vm(d, "reset", "workload=idle crash=reset", memory="256M", cpus=2)
    vms.append(vm)
    rc = vm.wait_exit(kt.slow(15))
    check("exit_status_0", rc == 0, "exit status %r" % rc)
    text = vm.console.text()
    check("guest_asked", "crash=reset: 0xfe to port 0x64" in text, text[-400:])
    check("no_guest_after_reset", "still running after the reset request" not in text, text[-400:])
    check("reason_logged", "asked for a reset (port 0x64)" in vm.output(), vm.output()[-600:])
