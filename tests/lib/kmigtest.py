"""Shared helpers for kmig's Python tests and benchmarks (standard library only).

A test prints "ok NAME", "not ok NAME: why" or "skip NAME: why" lines
(tests/run.sh counts them).  Helpers here start kmig or QEMU as real
processes, follow the guest's console through a file, and talk QMP.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.join(ROOT, os.environ.get("KMIG_BUILD", "build"))
KMIG = os.path.join(BUILD, "kmig")
GUEST = os.path.join(ROOT, "build", "guest", "kmig-guest.elf")


class Report:
    """Collects results; each check prints one line at once."""

    def __init__(self):
        self.failed = 0

    def ok(self, name, cond, why=""):
        if cond:
            print("ok %s" % name, flush=True)
        else:
            self.failed += 1
            print("not ok %s: %s" % (name, why), flush=True)
        return cond

    def skip(self, name, why):
        print("skip %s: %s" % (name, why), flush=True)

    def done(self):
        sys.exit(1 if self.failed else 0)


def have_kvm():
    return os.access("/dev/kvm", os.R_OK | os.W_OK)


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

    def cmd_full(self, name, **args):
        req = {"execute": name}
        if args:
            req["arguments"] = args
        self.sock.sendall(json.dumps(req).encode() + b"\n")
        return self.read_reply()

    def cmd(self, name, **args):
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

    def __init__(self, args, console, qmp_path=None, stdout=None):
        self.console = Console(console)
        self.qmp_path = qmp_path
        self.out = open(stdout or (console + ".out"), "w")
        self.proc = subprocess.Popen(args, stdout=self.out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
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


def kmig_vm(d, name, cmdline, memory="1G", cpus=1, extra=()):
    """Starts `kmig run` on the test guest; console in d/name.log, QMP in d/name.qmp."""
    console = os.path.join(d, name + ".log")
    qmp = os.path.join(d, name + ".qmp")
    args = [KMIG, "run", "--kernel", GUEST, "--cmdline", cmdline,
            "--memory", memory, "--cpus", str(cpus),
            "--console", "file:" + console, "--qmp", "unix:" + qmp] + list(extra)
    return VM(args, console, qmp)


def qemu_vm(d, name, cmdline, memory="1G", cpus=1, extra=()):
    """Starts QEMU 7.2 on the same test guest; console in d/name.log."""
    console = os.path.join(d, name + ".log")
    qmp = os.path.join(d, name + ".qmp")
    args = ["qemu-system-x86_64", "-accel", "kvm", "-nodefaults", "-nographic",
            "-machine", "pc", "-cpu", "host", "-m", memory, "-smp", str(cpus),
            "-kernel", GUEST, "-append", cmdline,
            "-chardev", "file,id=con,path=" + console, "-serial", "chardev:con",
            "-monitor", "none", "-qmp", "unix:%s,server=on,wait=off" % qmp] + list(extra)
    return VM(args, console, qmp)
