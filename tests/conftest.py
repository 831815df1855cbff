"""pytest configuration for kmig's Python suites (tests/kvm, tests/e2e, tests/guest, tests/net).

Markers say what a test needs (registered in pytest.ini):
  kvm    a usable /dev/kvm (kmig boots a VM)
  qemu   qemu-system-x86_64 with KVM (QEMU runs the same guest ELF)
  linux  a stock Linux guest (needs an x86 KVM that runs Linux: not kvm_pvm)
  slow   left out under emulation (tests/run.sh inside scripts/kvm-vm)
  netns  root for network namespaces and taps; no KVM (QEMU, if any, under TCG),
         so it runs in tests/run.sh's host part

A test marked kvm or qemu where /dev/kvm is unusable FAILS: kmig's tests are
never green with the VMM untested.  tests/run.sh runs such tests inside
scripts/kvm-vm on machines without /dev/kvm; deselect them by hand with
`-m "not kvm and not qemu"`.

Fixtures (all reap what they start, pass or fail):
  d      a fresh directory for consoles and QMP sockets (short path)
  vms    a list; every VM appended is killed at teardown, and a sanitizer
         report in its output fails the test
  check  soft checks: check(name, cond, why) records a failure and returns
         cond; the test fails at its end with every failed check listed
         (kmigtest.R is the same object for helpers of the test module)
  ext4   ext4(mib, name): a fresh ext4 file system of mib MiB on a loop
         device, mounted in d (root): one that takes O_DIRECT, which the
         emulated VM's tmpfs does not, and that fills up; unmounted at
         teardown, after the test's VMs are killed

For tests/run.sh the plugin prints one line per test: "ok NODEID",
"not ok NODEID: why" or "skip NODEID: why".
"""
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "lib"))
sys.path.insert(0, os.path.join(HERE, "guest"))

import kmigtest as kt  # noqa: E402


# ------------------------------------------------------------------ needs

def pytest_runtest_setup(item):
    needs_kvm = item.get_closest_marker("kvm") or item.get_closest_marker("qemu") \
        or item.get_closest_marker("linux")
    if needs_kvm and not kt.have_kvm():
        pytest.fail("needs a usable /dev/kvm (%s); tests/run.sh runs it inside "
                    "scripts/kvm-vm on such machines" % kt.kvm_state(), pytrace=False)
    if item.get_closest_marker("qemu") and not shutil.which("qemu-system-x86_64"):
        pytest.fail("needs qemu-system-x86_64 (scripts/setup-deps.sh installs it)",
                    pytrace=False)
    if item.get_closest_marker("linux") and kt.kvm_module() == "kvm_pvm":
        pytest.skip("kvm_pvm cannot run a stock Linux kernel (docs/platform.md)")


# ------------------------------------------------------------------ fixtures

@pytest.fixture
def d(request):
    path = tempfile.mkdtemp(prefix="kmig-")
    yield path
    failed = any(getattr(request.node, "rep_" + w, None) is not None
                 and getattr(request.node, "rep_" + w).failed for w in ("setup", "call"))
    if failed and os.environ.get("KMIG_TEST_KEEP"):
        print("# kept %s" % path)
    else:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def vms():
    started = []
    yield started
    for vm in started:
        vm.kill()
    reports = []
    san = kt.sanitizer_reports(started, reports)
    if san:
        print("\n".join("# " + line for r in reports for line in r.splitlines()))
        pytest.fail("sanitizer reports: %r" % san, pytrace=False)


class _Mounts:
    """The mount points a fixture makes in d, undone at its end (after
    the VMs that may hold files there are killed)."""

    def __init__(self, d):
        self.d, self.paths = d, []

    def point(self, name):
        assert os.geteuid() == 0, "needs root: it mounts a file system"
        path = os.path.join(self.d, name)
        os.mkdir(path)
        self.paths.append(path)
        return path

    def undo(self, vms):
        for vm in vms:
            vm.kill()
        for path in self.paths:
            subprocess.run(["umount", path], check=False)


@pytest.fixture
def ext4(d, vms):
    """make(mib): an ext4 file system of that size on a loop device in d."""
    m = _Mounts(d)

    def make(mib, name="fs"):
        img, path = os.path.join(d, name + ".ext4"), m.point(name)
        subprocess.run(["truncate", "-s", "%dM" % mib, img], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", img], check=True)
        subprocess.run(["mount", "-o", "loop", img, path], check=True)
        return path
    yield make
    m.undo(vms)


@pytest.fixture
def tmpfs(d, vms):
    """make(mib): a tmpfs of that size mounted in d (shared memory for a
    memory file, whatever file system d is on)."""
    m = _Mounts(d)

    def make(mib, name="shm"):
        path = m.point(name)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%dm" % mib, "kmig-" + name, path],
                       check=True)
        return path
    yield make
    m.undo(vms)


@pytest.fixture(autouse=True)
def check():
    kt.R.begin()
    yield kt.R
    kt.R.end()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """Failed soft checks fail the test's call phase (after it ran)."""
    outcome = yield
    failures = kt.R.end()
    if failures and outcome.excinfo is None:
        pytest.fail("%d check(s) failed:\n%s" % (len(failures), "\n".join(failures)),
                    pytrace=False)


# ------------------------------------------------------------------ reporting

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def _why(rep):
    if rep.skipped and isinstance(rep.longrepr, tuple):
        return rep.longrepr[2]
    text = str(rep.longrepr or "")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if "check(s) failed" in ln:     # the check fixture: name the first one
            return (ln.strip() + " " + (lines[i + 1].strip() if i + 1 < len(lines)
                                        else ""))[:300]
    for ln in lines:
        if ln.startswith("E "):
            return ln[2:].strip()
    return lines[-1] if lines else rep.outcome


class LineReport:
    """Prints ok / not ok / skip per test as each one finishes."""

    def __init__(self, config):
        self.config = config
        self.outcome = {}

    def _write(self, line):
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None:
            tr.ensure_newline()
            tr.write_line(line)
        else:
            print(line, flush=True)

    def pytest_runtest_logreport(self, report):
        cur = self.outcome.get(report.nodeid)
        if report.failed:
            what = "error in %s: " % report.when if report.when != "call" else ""
            self.outcome[report.nodeid] = ("not ok", what + _why(report))
        elif report.skipped and cur is None:
            self.outcome[report.nodeid] = ("skip", _why(report))
        elif cur is None and report.when == "call":
            self.outcome[report.nodeid] = ("ok", "")

    def pytest_runtest_logfinish(self, nodeid, location):
        kind, why = self.outcome.pop(nodeid, ("not ok", "no result"))
        self._write("%s %s%s" % (kind, nodeid, ": " + why if why else ""))

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report, config):
        # the per-test lines above replace pytest's progress letters
        if report.when == "call" or report.failed or report.skipped:
            return report.outcome, "", report.outcome.upper()
        return None


def pytest_configure(config):
    # with -v pytest names each test itself; otherwise one line per test
    if config.option.verbose <= 0:
        config.pluginmanager.register(LineReport(config), "kmig-line-report")
