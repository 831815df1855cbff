"""QMP against a running kmig (docs/qmp.md): greeting, negotiation, run
state commands and their events, bad input, several clients, the socket's
mode, and quit."""
import json
import os
import socket
import stat
import time

import pytest

import kmigtest as kt

pytestmark = pytest.mark.kvm

HEARTBEAT = r"^heartbeat t_ms=(\d+) gap_ms=(\d+)$"


class Raw:
    """A QMP connection without automatic negotiation."""

    def __init__(self, path, timeout=10.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = b""

    def read(self):
        while b"\n" not in self.buf:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("QMP connection closed")
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def reply(self):
        while True:
            msg = self.read()
            if "event" not in msg:
                return msg

    def send(self, data):
        self.sock.sendall(data if isinstance(data, bytes) else json.dumps(data).encode() + b"\n")

    def close(self):
        self.sock.close()


def heartbeats(vm):
    return vm.console.count(HEARTBEAT)


def wait_more_heartbeats(vm, n0, more=2, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if heartbeats(vm) >= n0 + more:
            return True
        time.sleep(0.05)
    return False


def why(vm):
    return "console:\n%s\nkmig output:\n%s" % (vm.console.text()[-1000:], vm.output()[-1500:])


def start(d, vms, extra=(), name="q"):
    vm = kt.kmig_vm(d, name, "workload=idle report_ms=200", memory="256M", extra=list(extra))
    vms.append(vm)
    kt.QMP(vm.qmp_path, timeout=kt.slow(30)).close()   # waits for the socket to appear
    return vm


def running(d, vms, check, extra=(), name="q"):
    """A VM whose guest beats; its QMP client, or None (a failed check)."""
    vm = start(d, vms, extra, name)
    q = kt.QMP(vm.qmp_path)
    if not check("guest_heartbeats", vm.console.wait(HEARTBEAT, timeout=kt.slow(20),
                                                     proc=vm.proc) is not None, why(vm)):
        return vm, None
    return vm, q


def test_greeting_negotiation_socket_mode(d, vms, check):
    vm = start(d, vms)
    raw = Raw(vm.qmp_path)
    g = raw.read()
    ver = g.get("QMP", {}).get("version", {})
    qemu = ver.get("qemu", {})
    check("greeting_shape",
          set(g) == {"QMP"} and set(g["QMP"]) == {"version", "capabilities"} and
          g["QMP"]["capabilities"] == [] and
          all(isinstance(qemu.get(k), int) for k in ("major", "minor", "micro")) and
          str(ver.get("package", "")).startswith("kmig-"), "greeting %s" % g)

    raw.send({"execute": "query-status", "id": 7})
    r = raw.reply()
    check("before_negotiation_refused",
          r.get("error", {}).get("class") == "CommandNotFound" and r.get("id") == 7 and
          "return" not in r, "reply %s" % r)
    raw.send({"execute": "qmp_capabilities", "id": "neg"})
    r = raw.reply()
    check("negotiation", r == {"return": {}, "id": "neg"}, "reply %s" % r)
    raw.send({"execute": "qmp_capabilities"})
    r = raw.reply()
    check("second_negotiation_refused", r.get("error", {}).get("class") == "CommandNotFound",
          "reply %s" % r)
    raw.send({"execute": "query-version"})
    r = raw.reply()
    check("query_version_matches_greeting", r.get("return") == ver, "reply %s" % r)
    raw.send({"execute": "query-commands"})
    r = raw.reply()
    names = {c.get("name") for c in r.get("return", [])}
    want = {"qmp_capabilities", "query-version", "query-commands", "query-status",
            "stop", "cont", "quit"}
    check("query_commands", want <= names, "missing %s" % (want - names))
    raw.close()

    st = os.stat(vm.qmp_path)
    check("socket_mode_0600", stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600,
          "mode %o" % st.st_mode)


def test_stop_cont(d, vms, check):
    vm, q = running(d, vms, check)
    if q is None:
        return
    s = q.cmd("query-status")
    check("query_status_running", s.get("status") == "running" and s.get("running") is True,
          "query-status %s" % s)

    r = q.cmd_full("stop")
    check("stop_returns", r.get("return") == {}, "reply %s" % r)
    check("stop_event", q.wait_event("STOP", timeout=kt.slow(5)) is not None, "no STOP event")
    s = q.cmd("query-status")
    check("query_status_paused", s.get("status") == "paused" and s.get("running") is False,
          "query-status %s" % s)
    time.sleep(0.3)               # a line already on its way may land
    n0 = heartbeats(vm)
    time.sleep(1.5)               # report_ms=200: ~7 heartbeats if it were running
    n1 = heartbeats(vm)
    check("stopped_guest_is_silent", n1 == n0, "%d new heartbeats while paused" % (n1 - n0))

    r = q.cmd_full("cont")
    check("cont_returns", r.get("return") == {}, "reply %s" % r)
    check("resume_event", q.wait_event("RESUME", timeout=kt.slow(5)) is not None,
          "no RESUME event")
    s = q.cmd("query-status")
    check("query_status_running_again", s.get("status") == "running", "query-status %s" % s)
    check("heartbeats_resume", wait_more_heartbeats(vm, n1, 2, timeout=kt.slow(10)), why(vm))


def test_bad_input_keeps_connection_and_vm(d, vms, check):
    vm, q = running(d, vms, check)
    if q is None:
        return
    q.send_raw(b"this is not json\n")
    r = q.read_reply()
    check("garbage_generic_error", r.get("error", {}).get("class") == "GenericError",
          "reply %s" % r)
    q.send_raw(b'{"execute": "no-such-command"}\n')
    r = q.read_reply()
    check("unknown_command", r.get("error", {}).get("class") == "CommandNotFound",
          "reply %s" % r)
    q.send_raw(b'{"execute": "stop", "arguments": {"bogus": 1}}\n')
    r = q.read_reply()
    check("unexpected_argument", r.get("error", {}).get("class") == "GenericError",
          "reply %s" % r)
    if q.cmd("query-status").get("status") == "paused":
        q.cmd("cont")             # the bogus stop was obeyed; go on from running
    q.send_raw(b'[1, 2]\n')
    r = q.read_reply()
    check("non_object_generic_error", r.get("error", {}).get("class") == "GenericError",
          "reply %s" % r)
    s = q.cmd("query-status")
    check("running_after_garbage", s.get("status") == "running", "query-status %s" % s)
    check("heartbeats_after_garbage",
          wait_more_heartbeats(vm, heartbeats(vm), 2, timeout=kt.slow(10)), why(vm))


def test_clients_and_quit(d, vms, check):
    """Two clients both see events; another connects after one leaves; quit."""
    vm, q = running(d, vms, check)
    if q is None:
        return
    q2 = kt.QMP(vm.qmp_path)
    q.cmd("stop")
    check("two_clients_stop_event_1", q.wait_event("STOP", timeout=kt.slow(5)) is not None, "")
    check("two_clients_stop_event_2", q2.wait_event("STOP", timeout=kt.slow(5)) is not None, "")
    q2.cmd("cont")
    check("two_clients_resume_event_1", q.wait_event("RESUME", timeout=kt.slow(5)) is not None,
          "")
    q2.close()
    q.close()
    time.sleep(0.2)
    try:
        q3 = kt.QMP(vm.qmp_path, timeout=10)
        s = q3.cmd("query-status")
        check("client_after_disconnect", s.get("status") == "running", "query-status %s" % s)
    except (OSError, EOFError, RuntimeError, ValueError) as e:
        check("client_after_disconnect", False, repr(e))
        return
    check("alive_after_clients_left", vm.proc.poll() is None, why(vm))

    r = q3.cmd_full("quit")
    check("quit_returns", r.get("return") == {}, "reply %s" % r)
    ev = q3.wait_event("SHUTDOWN", timeout=kt.slow(5))
    check("quit_shutdown_event", ev is not None and ev.get("data", {}).get("guest") is False,
          "event %s" % ev)
    rc = vm.wait_exit(kt.slow(10))
    check("quit_exit_code_0", rc == 0, "exit status %s; %s" % (rc, why(vm)))
    check("quit_socket_removed", not os.path.exists(vm.qmp_path), "socket still there")
    q3.close()


def test_introspection(d, vms, check):
    """x-query-dirty-tracking follows tracking on and off (a dirty-bitmap
    calc-dirty-rate holds it for its calc-time); x-query-kvm-stats returns
    KVM's statistics of the VM."""
    vm, q = running(d, vms, check, extra=["--dirty-ring", "0"])
    if q is None:
        return
    t = q.cmd("x-query-dirty-tracking")
    check("tracking_off", t.get("backend") == "bitmap" and t.get("active") is False
          and t.get("logging") is False and t.get("users") == 0
          and t.get("throttle-percentage") == 0, "%r" % t)
    r = q.cmd_full("calc-dirty-rate", **{"calc-time": 3, "mode": "dirty-bitmap"})
    check("calc_started", r.get("return") == {}, "reply %r" % r)
    seen = None
    deadline = time.time() + 2.5
    while time.time() < deadline and seen is None:
        t = q.cmd("x-query-dirty-tracking")
        if t.get("active"):
            seen = t
        time.sleep(0.05)
    check("tracking_on_while_measuring", seen is not None and seen.get("logging") is True
          and seen.get("users") == 1, "%r" % (seen or t))
    deadline = time.time() + kt.slow(10)
    while time.time() < deadline and q.cmd("query-dirty-rate").get("status") != "measured":
        time.sleep(0.1)
    t = q.cmd("x-query-dirty-tracking")
    check("tracking_off_after", t.get("active") is False and t.get("logging") is False
          and t.get("users") == 0 and t.get("syncs", 0) >= 1, "%r" % t)
    s = q.cmd("x-query-kvm-stats")
    vmst = s.get("vm", {}) if isinstance(s, dict) else {}
    check("kvm_stats", "pages_4k" in vmst and all(isinstance(v, int) for v in vmst.values()),
          "%r" % s)
    r = q.cmd_full("x-query-kvm-stats", bogus=1)
    check("kvm_stats_bad_arg", r.get("error", {}).get("class") == "GenericError", "%r" % r)
    # QEMU's query-cpus-fast: the vCPU, its thread one of kmig's
    c = q.cmd("query-cpus-fast")
    one = c[0] if isinstance(c, list) and len(c) == 1 else {}
    tid = one.get("thread-id", 0)
    check("cpus_fast", one.get("cpu-index") == 0 and one.get("target") == "x86_64" and
          tid > 0 and os.path.exists("/proc/%d/task/%d" % (vm.proc.pid, tid)), "%r" % c)


def test_kmig_migration_parameters(d, vms, check):
    """kmig's own migration parameters: defaults, set, read back, refused."""
    vm, q = running(d, vms, check)
    if q is None:
        return
    p = q.cmd("query-migrate-parameters")
    check("defaults", p.get("x-final-round") is True and p.get("x-free-page-hint-wait") == 0,
          "%r" % p)
    r = q.cmd_full("migrate-set-parameters", **{"x-final-round": False,
                                                "x-free-page-hint-wait": 2000})
    p = q.cmd("query-migrate-parameters")
    check("set", r.get("return") == {} and p.get("x-final-round") is False
          and p.get("x-free-page-hint-wait") == 2000, "%r %r" % (r, p))
    r = q.cmd_full("migrate-set-parameters", **{"x-free-page-hint-wait": 10001})
    check("hint_wait_range", r.get("error", {}).get("desc") ==
          "Parameter 'x-free-page-hint-wait' expects a value from 0 to 10000", "%r" % r)
    r = q.cmd_full("migrate-set-parameters", **{"x-final-round": 1})
    check("final_round_type", "error" in r, "%r" % r)
    p = q.cmd("query-migrate-parameters")
    check("unchanged_after_refusal", p.get("x-final-round") is False
          and p.get("x-free-page-hint-wait") == 2000, "%r" % p)


def test_throttle_policy_default(d, vms, check):
    """auto-converge uses the computed throttle unless QEMU's step-law
    parameters are set without naming a policy; a named policy stays."""
    vm, q = running(d, vms, check)
    if q is None:
        return

    def pol():
        return q.cmd("query-migrate-parameters").get("x-cpu-throttle-policy")
    check("default_computed", pol() == "computed", pol())
    q.cmd("migrate-set-parameters", **{"downtime-limit": 200})
    check("other_params_keep_it", pol() == "computed", pol())
    q.cmd("migrate-set-parameters", **{"cpu-throttle-increment": 15})
    check("qemu_knob_means_step", pol() == "step", pol())
    q.cmd("migrate-set-parameters", **{"x-cpu-throttle-policy": "computed"})
    q.cmd("migrate-set-parameters", **{"cpu-throttle-initial": 30})
    check("named_policy_stays", pol() == "computed", pol())


def test_dirty_ring_default(d, vms, check):
    """With no --dirty-ring, kmig tracks with a 4096-entry ring where KVM has the
    acquire/release ring (the kernels here do); --dirty-ring 0 is the bitmap."""
    vm, q = running(d, vms, check)
    if q is None:
        return
    t = q.cmd("x-query-dirty-tracking")
    check("default_ring", t.get("backend") == "ring", "%r" % t)
    vm2, q2 = running(d, vms, check, extra=["--dirty-ring", "0"], name="bitmap")
    if q2 is None:
        return
    t = q2.cmd("x-query-dirty-tracking")
    check("explicit_bitmap", t.get("backend") == "bitmap", "%r" % t)
