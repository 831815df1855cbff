"""The fault matrix's Linux row: a few cells of tests/e2e/test_faults.py
(tests/lib/faultmatrix.py: its FaultProxy, phases, faults and expected outcomes, docs/protocol.md
"Faults and outcomes") with a stock Linux guest running memcheck in verify
mode (64 MiB) in place of the test guest.  "The guest goes on" is a new
memcheck report with no page bad; "never ran" is no memcheck report on
the destination's console.

  fault[bulk-kill-dst]       runs: the source's Linux goes on, its dirty
                             tracking off, and a retry completes with x-verify
  fault[switchover-kill-src] dst-fails: the destination never runs it
  fault[after-end-cut]       dst-runs: the destination runs it, the source
                             stays paused
KMIG_TEST_FULL=1 adds the rest of the CI cells of test_faults.py.
"""
import os

import pytest

import faultmatrix as tf
import linux_guest as lg

pytestmark = pytest.mark.linux

CELLS = [("bulk", "kill-dst"), ("switchover", "kill-src"), ("after-end", "cut")]
if os.environ.get("KMIG_TEST_FULL") == "1":
    CELLS += sorted(c for c in tf.CI_CELLS if c not in CELLS)


class LinuxGuest:
    """Linux with memcheck verify over 64 MiB, 1 vCPU, 512 MiB."""
    ok_rx = lg.REPORT_OK
    boot_s = 120
    caps = {}            # capabilities every migration of it needs (none)

    def __init__(self, d):
        self.d = d
        self.rd = lg.initramfs(d)

    def vm(self, name, extra=()):
        vm = lg.vm(self.d, name, self.rd, lg.cmdline(64, 1), extra=list(extra))
        vm.ok_rx = self.ok_rx
        return vm


@pytest.mark.parametrize("phase,fault", [pytest.param(p, f, id="%s-%s" % (p, f))
                                         for p, f in CELLS])
def test_fault(d, vms, check, phase, fault):
    if not check("kernel", not lg.missing(), lg.missing()):
        return
    tf.run_cell(LinuxGuest(d), vms, check, phase, fault)
