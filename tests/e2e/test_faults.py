"""The fault matrix (its machinery: tests/lib/faultmatrix.py): a migration broken once, at each phase, by each fault,
ends as docs/protocol.md ("Faults and outcomes") says, with never two
running copies of the guest and never a lost one.

A FaultProxy (tests/lib/faultproxy.py) sits between source and
destination.  Phases: setup (at the START record), bulk (at the 5th PAGES
record), dirty (at the first record after the source reports a dirty
round), switchover (at the 3rd STATE record: device state in flight),
after-end (END forwarded, before the source has the destination's
answer).  Faults: the link stalls, is cut, is cut inside a record
(truncate), repeats a record, carries a record of an unknown type
(corrupt); the source or the destination is killed (SIGKILL) or stopped
for a while (SIGSTOP, then SIGCONT).

Outcomes:
  runs       the migration fails (a stall: is cancelled); the source runs
             its guest; the destination exits non-zero, or was killed,
             without ever running it
  completes  the migration completes with x-verify; the guest goes on
  paused     END went out, so the source keeps its guest paused and says
             so (the destination might run it); the destination did not,
             so `cont` on the source runs it again
  either     paused or runs, by whether END had left the source when the
             link broke
  dst-runs   the destination got END and runs the guest; the source fails
             (or, a stall, is cancelled) and stays paused
  dst-waits  the source was killed before START reached the destination:
             to it that connection was a stray (dropped, counted in
             x-stray-connections); it listens on, never ran the guest
             (a stall, cut or corrupt record at setup: the same at the
             destination, and the source runs)
  dst-fails  the source was killed before END: the destination exits
             non-zero without running the guest
  dst-completes  the source was killed after END: the destination runs it
After a failure with the source alive and the destination not running the
guest, the source's dirty tracking and throttle are off and a retry to a
fresh destination completes with x-verify.

CI runs the cells in CI_CELLS; KMIG_TEST_FULL=1 runs all 45.
"""
import pytest

from faultmatrix import (CI_CELLS, FAULTS, FULL, PHASES, DiskGuest,  # noqa: F401
                         VerifyGuest, run_cell)

pytestmark = pytest.mark.kvm


def cells():
    return [pytest.param(p, f, id="%s-%s" % (p, f)) for p in PHASES for f in FAULTS
            if FULL or (p, f) in CI_CELLS]


@pytest.mark.parametrize("phase,fault", cells())
def test_fault(d, vms, check, phase, fault):
    run_cell(VerifyGuest(d), vms, check, phase, fault)


# the disk in the stream (x-block-migration): the link cut or the
# destination killed in the disk's bulk pass, the link cut at the
# switchover with the guest's disk requests in flight when it stopped
DISK_CELLS = [("disk-bulk", "cut"), ("disk-bulk", "kill-dst"), ("switchover", "cut")]


@pytest.mark.parametrize("phase,fault", [pytest.param(p, f, id="%s-%s" % (p, f))
                                         for p, f in DISK_CELLS])
def test_disk_fault(d, vms, check, phase, fault):
    """As test_fault, with the disk workload on an image each side; the
    guest the test ends with finds no block wrong."""
    vm = run_cell(DiskGuest(d), vms, check, phase, fault)
    bad = [ln for v in vms for ln in v.console.text().splitlines()
           if "disk BAD" in ln or "disk error" in ln]
    check("no_block_wrong", not bad, " / ".join(bad[:4]))
    check("ends_running", vm is not None, "no VM runs the guest at the end")


