"""Shared helpers for kmig's Python tests and benchmarks (standard library only).

Tests are pytest tests (tests/conftest.py: markers, fixtures, and the
"ok NAME" / "not ok NAME: why" lines tests/run.sh counts).  Helpers here
start kmig or QEMU as real processes, follow the guest's console through a
file, and talk QMP.
"""
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.join(ROOT, os.environ.get("KMIG_BUILD", "build"))
KMIG = os.path.join(BUILD, "kmig")
# the build with the test-only fault hooks (make SAN=1; src/mig/send/fault.h)
KMIG_FAULTS = os.path.join(ROOT, "build-san", "kmig")
GUEST = os.path.join(ROOT, "build", "guest", "kmig-guest.elf")


class Checks:
    """Soft checks of the running pytest test (tests/conftest.py's `check`
    fixture is this object): ok(name, cond, why) records a failed check and
    returns cond, so a test goes on to gather every finding; the fixture
    fails the test at its end, listing them."""

    def __init__(self):
        self.failures = []

    def begin(self):
        self.failures = []

    def end(self):
        f, self.failures = self.failures, []
        return f

    def ok(self, name, cond, why=""):
        if not cond:
            line = "%s: %s" % (name, why) if why else name
            self.failures.append(line)
            print("# check failed: %s" % line, flush=True)
        return bool(cond)

    __call__ = ok


R = Checks()

KVM_GET_API_VERSION = 0xAE00


def kvm_state():
    """'ok', or why /dev/kvm cannot be used here."""
    import fcntl
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        return "/dev/kvm: %s" % e.strerror
    try:
        v = fcntl.ioctl(fd, KVM_GET_API_VERSION)
        return "ok" if v == 12 else "/dev/kvm: API version %d, not 12" % v
    except OSError as e:
        return "/dev/kvm: KVM_GET_API_VERSION: %s" % e.strerror
    finally:
        os.close(fd)


def have_kvm():
    return kvm_state() == "ok"


def kvm_module():
    """The KVM module that provides /dev/kvm here: kvm_pvm, kvm_intel,
    kvm_amd, or None."""
    for m in ("kvm_pvm", "kvm_intel", "kvm_amd"):
        if os.path.isdir("/sys/module/" + m) and have_kvm():
            return m
    return None


def emulated():
    """True inside scripts/kvm-vm: everything runs under TCG emulation, so
    tests scale their rounds, timeouts and links (never their assertions)
    to it; a guest pace read after dirty logging is the one exception,
    asserted natively only (docs/testing.md, "Paces under emulation")."""
    return os.environ.get("KMIG_TEST_EMULATED") == "1"


def slow(seconds):
    """A timeout for something that takes `seconds` natively; longer under
    emulation."""
    return seconds * (6 if emulated() else 1)


def tmpdir():
    return tempfile.mkdtemp(prefix="kmigtest-")


class Console:
    """Follows a console log file written by a VM; waits for lines."""

    def __init__(self, path):
        self.path = path
        self.pos = 0
        self.lines = []
        self._part = ""

    def poll(self):
        try:
            with open(self.path, "r", errors="replace") as f:
                f.seek(self.pos)
                data = f.read()
                self.pos = f.tell()
        except FileNotFoundError:
            return
        data = self._part + data
        parts = data.split("\n")
        self._part = parts.pop()
        self.lines.extend(p.rstrip("\r") for p in parts)

    def wait(self, pattern, timeout=30.0, start=0, proc=None):
        """Returns the first match of pattern in lines[start:], or None."""
        rx = re.compile(pattern)
        deadline = time.time() + timeout
        i = start
        while True:
            self.poll()
            while i < len(self.lines):
                m = rx.search(self.lines[i])
                if m:
                    return m
                i += 1
            if time.time() > deadline:
                return None
            if proc is not None and proc.poll() is not None:
                self.poll()
                continue_scan = i < len(self.lines)
                if not continue_scan:
                    return None
            time.sleep(0.05)

    def partial(self):
        """The last line so far if it has no newline yet (else "")."""
        self.poll()
        return self._part

    def count(self, pattern):
        self.poll()
        rx = re.compile(pattern)
        return sum(1 for l in self.lines if rx.search(l))

    def text(self):
        self.poll()
        return "\n".join(self.lines)


class QMP:
    """A QMP client: greeting, qmp_capabilities, commands and events."""

    def __init__(self, path, timeout=30.0):
        deadline = time.time() + timeout
        while True:
            try:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.connect(path)
                break
            except OSError:
                self.sock.close()
                if time.time() > deadline:
                    raise
                time.sleep(0.05)
        self.sock.settimeout(timeout)
        self.buf = b""
        self.events = []
        self.greeting = self._read()
        self.cmd("qmp_capabilities")

    def _read(self):
        while b"\n" not in self.buf:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("QMP connection closed")
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def send_raw(self, data):
        self.sock.sendall(data)

    def read_reply(self):
        while True:
            msg = self._read()
            if "event" in msg:
                self.events.append(msg)
                continue
            return msg

    def cmd_full(self, name, /, **args):
        """name is positional only: commands such as set_link take an
        argument called name."""
        req = {"execute": name}
        if args:
            req["arguments"] = args
        self.sock.sendall(json.dumps(req).encode() + b"\n")
        return self.read_reply()

    def cmd(self, name, /, **args):
        reply = self.cmd_full(name, **args)
        if "error" in reply:
            raise RuntimeError("%s: %s" % (name, reply["error"]))
        return reply.get("return")

    def wait_event(self, name, timeout=30.0):
        deadline = time.time() + timeout
        while True:
            for i, e in enumerate(self.events):
                if e["event"] == name:
                    return self.events.pop(i)
            if time.time() > deadline:
                return None
            self.sock.settimeout(max(0.01, deadline - time.time()))
            try:
                self.events.append(self._read())
            except socket.timeout:
                return None

    def close(self):
        self.sock.close()


class VM:
    """A kmig or QEMU process running the test guest with its console in a file."""

    def __init__(self, args, console, qmp_path=None, stdout=None, env=None, pass_fds=()):
        self.console = Console(console)
        self.qmp_path = qmp_path
        self.out = open(stdout or (console + ".out"), "w")
        self.proc = subprocess.Popen(args, stdout=self.out, stderr=subprocess.STDOUT,
                                     start_new_session=True, pass_fds=pass_fds,
                                     env=dict(os.environ, **env) if env else None)
        self._qmp = None

    def qmp(self):
        if self._qmp is None:
            self._qmp = QMP(self.qmp_path)
        return self._qmp

    def output(self):
        self.out.flush()
        with open(self.out.name, errors="replace") as f:
            return f.read()

    def wait_exit(self, timeout=10.0):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        if self._qmp:
            self._qmp.close()
        self.out.close()


def in_netns(netns, args):
    """args run inside network namespace netns (None: here)."""
    return (["ip", "netns", "exec", netns] if netns else []) + list(args)


def kmig_vm(d, name, cmdline, memory="1G", cpus=1, extra=(), kmig=None, env=None, netns=None,
            pass_fds=()):
    """Starts `kmig run` on the test guest; console in d/name.log, QMP in
    d/name.qmp.  kmig: another binary (e.g. KMIG_FAULTS); env: variables
    added to the environment; netns: the network namespace to run in (a
    "host" of scripts/two-hosts); pass_fds: descriptors it inherits."""
    console = os.path.join(d, name + ".log")
    qmp = os.path.join(d, name + ".qmp")
    args = [kmig or KMIG, "run", "--kernel", GUEST, "--cmdline", cmdline,
            "--memory", memory, "--cpus", str(cpus),
            "--console", "file:" + console, "--qmp", "unix:" + qmp] + list(extra)
    return VM(in_netns(netns, args), console, qmp, env=env, pass_fds=pass_fds)


QBOOT = "/usr/share/qemu/qboot.rom"
# "-cpu host" alone aborts on these kvm_pvm machines (QEMU cannot set
# MSR_IA32_ARCH_CAPABILITIES, 0x10a); without that one feature it works.
QEMU_CPU = "host,-arch-capabilities"


def qemu_vm(d, name, cmdline, memory="1G", cpus=1, extra=(), firmware="qboot", accel="kvm",
            netns=None):
    """Starts QEMU 7.2 on the same test guest; console in d/name.log.

    firmware: "qboot" (QEMU's minimal firmware, used when installed: the
    guest is running ~0.1 s after start) or "seabios" (QEMU's default; its
    real-mode POST takes ~3.5 s under kvm_pvm).  The guest's power-off port
    0xf4 is QEMU's isa-debug-exit device (QEMU exits with status 1).
    accel: "kvm", or "tcg" (emulation, no /dev/kvm needed; CPU model
    qemu64).  netns: run QEMU inside that network namespace (`ip netns
    exec`), where its tap devices are.
    """
    console = os.path.join(d, name + ".log")
    qmp = os.path.join(d, name + ".qmp")
    fw = ["-bios", QBOOT] if firmware == "qboot" and os.path.exists(QBOOT) else []
    cpu = QEMU_CPU if accel == "kvm" else "qemu64"
    args = ["qemu-system-x86_64", "-accel", accel, "-nodefaults", "-nographic",
            "-machine", "pc", "-cpu", cpu, "-m", memory, "-smp", str(cpus)] + fw + [
            "-kernel", GUEST, "-append", cmdline,
            "-device", "isa-debug-exit,iobase=0xf4,iosize=0x04",
            "-chardev", "file,id=con,path=" + console, "-serial", "chardev:con",
            "-monitor", "none", "-qmp", "unix:%s,server=on,wait=off" % qmp] + list(extra)
    return VM(in_netns(netns, args), console, qmp)


# ---------------------------------------------------------------- migration

MIG_FINAL = ("completed", "failed", "cancelled")

# what ASan/UBSan/TSan print in a `make SAN=1` or `make TSAN=1` build
# (KMIG_BUILD=build-san, build-tsan)
SANITIZER_RX = re.compile(r"(?:ERROR|WARNING): (?:Address|Leak|Thread)Sanitizer.*|"
                          r"runtime error: .*")


def sanitizer_reports(vms, full=None):
    """[(console name, first sanitizer line)] over the VMs' outputs (also
    after kill()); full, a list, gets the first report of each, up to 80
    lines, so a failure shows where it was."""
    found = []
    for vm in vms:
        try:
            with open(vm.out.name, errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        m = SANITIZER_RX.search(text)
        if m:
            found.append((os.path.basename(vm.console.path), m.group(0)))
            if full is not None:
                full.append("\n".join(text[m.start():].splitlines()[:80]))
    return found


def free_port(host="127.0.0.1"):
    """A TCP port that was free a moment ago (bind to port 0, read it back)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((host, 0))
        return s.getsockname()[1]
    finally:
        s.close()


def wait_output(vm, pattern, timeout=30.0):
    """Waits until the VMM's own output (stdout/stderr) matches pattern."""
    rx = re.compile(pattern)
    deadline = time.time() + timeout
    while True:
        m = rx.search(vm.output())
        if m:
            return m
        if time.time() > deadline or vm.proc.poll() is not None:
            return rx.search(vm.output())
        time.sleep(0.05)


def wait_incoming(vm, timeout=30.0):
    """Waits until a kmig destination listens for its incoming migration."""
    return wait_output(vm, r"incoming migration: listening on", timeout) is not None


def set_caps(qmp, **caps):
    """migrate-set-capabilities with keyword names (x_verify -> x-verify)."""
    qmp.cmd("migrate-set-capabilities",
            capabilities=[{"capability": k.replace("_", "-"), "state": bool(v)}
                          for k, v in caps.items()])


def set_params(qmp, **params):
    """migrate-set-parameters with keyword names (downtime_limit -> downtime-limit)."""
    qmp.cmd("migrate-set-parameters", **{k.replace("_", "-"): v for k, v in params.items()})


def recovered(qmp, user_limits=()):
    """After a migration ended (cancelled, failed): dirty tracking is off
    with no user left, KVM no longer logs writes to the memslots, no vCPU
    throttle is in force and the vCPU dirty limits are the user's
    (user_limits: query-vcpu-dirty-limit's list as the user set it).
    Returns (ok, detail) for check()."""
    t = qmp.cmd("x-query-dirty-tracking")
    lim = qmp.cmd("query-vcpu-dirty-limit")
    ok = (isinstance(t, dict) and t.get("active") is False and t.get("logging") is False
          and t.get("users") == 0 and t.get("pending-pages") == 0
          and t.get("throttle-percentage") == 0 and lim == list(user_limits))
    return ok, "x-query-dirty-tracking %r, query-vcpu-dirty-limit %r" % (t, lim)


STRESS_PAGES_RX = re.compile(r"^stress cpu=(\d+) .* pages=(\d+)")


def stress_pages(console):
    """{cpu: the last pages= count} of the stress lines printed so far."""
    console.poll()
    last = {}
    for line in console.lines:
        m = STRESS_PAGES_RX.search(line)
        if m:
            last[int(m.group(1))] = int(m.group(2))
    return last


def stress_page_rate(console, secs):
    """The stress guest's page writes per second of host time over the next
    secs, summed over its vCPUs (from each one's cumulative pages= count).
    Host time, not the guest's: a vCPU held asleep by a throttle or a dirty
    limit writes nothing meanwhile, however fast it runs when it runs.
    Returns (rate, per-cpu deltas)."""
    a, t0 = stress_pages(console), time.time()
    time.sleep(secs)
    b, t1 = stress_pages(console), time.time()
    deltas = {c: b[c] - a.get(c, 0) for c in b}
    return sum(deltas.values()) / (t1 - t0), deltas


def wait_balloon(qmp, want, timeout):
    """Polls query-balloon until actual is want bytes; returns the last actual."""
    deadline = time.time() + timeout
    got = None
    while time.time() < deadline:
        got = qmp.cmd("query-balloon").get("actual")
        if got == want:
            break
        time.sleep(0.1)
    return got


def wait_migration(qmp, timeout=60.0, statuses=MIG_FINAL, interval=0.1):
    """Polls query-migrate until its status is one of statuses; returns the
    last reply (whatever its status, if the timeout passed first)."""
    deadline = time.time() + timeout
    while True:
        r = qmp.cmd("query-migrate")
        if r.get("status") in statuses or time.time() > deadline:
            return r
        time.sleep(interval)


def after_bulk_pass(qmp, timeout):
    """Polls query-migrate until the bulk pass is over (the first dirty
    sync), a final status, or the timeout; returns the last reply."""
    deadline = time.time() + timeout
    while True:
        r = qmp.cmd("query-migrate")
        if r.get("ram", {}).get("dirty-sync-count", 0) >= 1 or r.get("status") in MIG_FINAL \
                or time.time() >= deadline:
            return r
        time.sleep(0.05)


def wait_transferred(qmp, nbytes, timeout):
    """Polls query-migrate until the RAM bytes sent reach nbytes (or the
    timeout passed)."""
    deadline = time.time() + timeout
    while qmp.cmd("query-migrate").get("ram", {}).get("transferred", 0) < nbytes and \
            time.time() < deadline:
        time.sleep(0.1)


def cancel_in_bulk(qmp, timeout):
    """migrate_cancel once bytes have gone (past the connect, whatever it
    took; in the bulk pass on a slow link); returns the final reply."""
    wait_transferred(qmp, 256 << 10, timeout)
    qmp.cmd("migrate_cancel")
    return wait_migration(qmp, timeout)


def follow(qmp, timeout, interval=0.05):
    """Polls query-migrate until a final status or the timeout; returns
    (the last reply, the statuses seen in order)."""
    seen = []
    deadline = time.time() + timeout
    while True:
        r = qmp.cmd("query-migrate")
        if not seen or seen[-1] != r.get("status"):
            seen.append(r.get("status"))
        if r.get("status") in MIG_FINAL or time.time() > deadline:
            return r, seen
        time.sleep(interval)


def migrate(src, dst, uri, caps=None, params=None, timeout=60.0):
    """Migrates src (a VM) to uri, where dst (a VM, or None) listens.
    caps: {name: bool}; params: {name: value}, QMP spelling.  Waits for the
    destination's listener when dst is given, starts the migration and waits
    for a final status; returns the last query-migrate reply (on timeout it
    is not final and the migration is left running)."""
    q = src.qmp()
    if caps:
        q.cmd("migrate-set-capabilities",
              capabilities=[{"capability": k, "state": bool(v)} for k, v in caps.items()])
    if params:
        q.cmd("migrate-set-parameters", **params)
    if dst is not None:
        wait_incoming(dst)
    q.cmd("migrate", uri=uri)
    return wait_migration(q, timeout)


# ---------------------------------------------------------------- virtio-balloon

def qemu_balloon_args(hint=True, report=True, iothread="bio0"):
    """Extra QEMU arguments for a modern-only virtio-balloon-pci device (what
    the test guest's balloon=1 driver binds).  Free page hinting needs an
    iothread in QEMU; QEMU 7.2 then hints during every precopy migration."""
    dev = "virtio-balloon-pci,disable-legacy=on,free-page-hint=%s,free-page-reporting=%s" % (
        "on" if hint else "off", "on" if report else "off")
    args = []
    if hint:
        args += ["-object", "iothread,id=" + iothread]
        dev += ",iothread=" + iothread
    return args + ["-device", dev]


# ---------------------------------------------------------------- test cases

def dump(vm, n=12):
    """The tail of a VM's console and VMM output, for failure messages."""
    con = vm.console.text().splitlines()[-n:]
    return "console: %s | output: %s" % (" / ".join(con), vm.output().strip()[-600:])
