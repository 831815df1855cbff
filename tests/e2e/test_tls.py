"""Migration over TLS 1.3 (tls-creds-psk, tls-creds-x509, authz-simple):
lossless over the main stream and multifd channels with nothing in clear
on the wire; every refusal (plain peer, wrong key, foreign CA, wrong host
name, a client tls-authz does not name) fails the source cleanly, its
guest still running, while the destination drops that connection, says
so (log, query-migrate's x-stray-connections) and keeps listening, so a
good migration to it completes afterwards; stray connections (garbage,
silence, a stray where a multifd channel is expected) never fail a TLS
destination; tls-creds and tls-authz cannot change while a destination
listens."""
import os
import socket
import subprocess
import threading
import time

import pytest

import kmigtest as kt

pytestmark = pytest.mark.kvm

HERE = os.path.dirname(os.path.abspath(__file__))
MAKE_CERTS = os.path.join(HERE, "..", "lib", "make-certs.sh")
VERIFY = "workload=verify mb=96 cpus=2 report_ms=300"


def certs(d, name, cn="source"):
    path = os.path.join(d, name)
    subprocess.run([MAKE_CERTS, path, cn], check=True)
    return path


class TapProxy:
    """Relays every connection to dst_port as bytes and keeps what the
    source sent (all connections, in arrival order)."""

    def __init__(self, dst_port):
        self.dst_port = dst_port
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(8)
        self.port = self.lsock.getsockname()[1]
        self.sent = bytearray()
        self.connections = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                a, _ = self.lsock.accept()
            except OSError:
                return
            self._before_connect()
            b = socket.create_connection(("127.0.0.1", self.dst_port))
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._pipe, args=(a, b, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(b, a, False), daemon=True).start()

    def _before_connect(self):
        pass

    def _pipe(self, src, dst, record):
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                for s in (src, dst):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return
            if record:
                with self._lock:
                    self.sent += data
            try:
                dst.sendall(data)
            except OSError:
                return

    def close(self):
        self.lsock.close()


def destination(d, vms, name, creds, extra=()):
    port = kt.free_port()
    args = ["--incoming", "tcp:127.0.0.1:%d" % port] + list(extra)
    if creds:
        args += ["--object", creds, "--tls-creds", creds.split("id=")[1].split(",")[0]]
    dst = kt.kmig_vm(d, name, VERIFY, memory="256M", cpus=2, extra=args)
    vms.append(dst)
    return dst, port


def verify_on(check, name, vm):
    vm.console.poll()
    n = len(vm.console.lines)
    ok = [vm.console.wait(r"verify ok round=\d+ cpu=%d" % c, timeout=kt.slow(20), start=n)
          for c in (0, 1)]
    check(name + "_verify_ok", all(ok), kt.dump(vm))
    check(name + "_no_verify_bad", vm.console.count("verify BAD") == 0, kt.dump(vm))


def test_psk_multifd(d, vms, check):
    """PSK on the main stream and three multifd channels, x-verify, through
    a proxy that records the wire: the stream's magic and the guest's
    console text never appear in clear."""
    keys = certs(d, "c")
    creds = "tls-creds-psk,id=k0,dir=%s/psk" % keys
    src = kt.kmig_vm(d, "src", VERIFY, memory="256M", cpus=2, extra=["--object", creds])
    vms.append(src)
    dst, port = destination(d, vms, "dst", creds)
    tap = TapProxy(port)
    check("boot", src.console.wait(r"kmig-guest ready cpus=2", timeout=kt.slow(20)) is not None,
          kt.dump(src))
    # auto-converge: under emulation (and more so with kmig built with
    # ASan) TLS carries about what the guest dirties
    res = kt.migrate(src, dst, "tcp:127.0.0.1:%d" % tap.port,
                     caps={"multifd": True, "x-verify": True, "auto-converge": True},
                     params={"tls-creds": "k0", "multifd-channels": 3, "max-bandwidth": 0,
                             "downtime-limit": 1000, "x-cpu-throttle-policy": "computed"},
                     timeout=kt.slow(180))
    tap.close()
    check("completed", res.get("status") == "completed", "%r %s" % (res, kt.dump(dst)))
    check("four_connections", tap.connections == 4, "%d" % tap.connections)
    check("tls_on_both", "TLS 1.3 with 'k0'" in src.output() and
          "TLS 1.3 with 'k0'" in dst.output(), src.output()[-400:] + dst.output()[-400:])
    wire = bytes(tap.sent)
    check("sent_enough", len(wire) > 8 << 20, "%d bytes" % len(wire))
    check("magic_not_in_clear", b"KMIGSTRM" not in wire)
    check("no_plain_record_header", wire[:8] != b"KMIGSTRM")
    verify_on(check, "dst", dst)


def strays(vm):
    return vm.qmp().cmd("query-migrate").get("x-stray-connections", {})


def refused(check, name, src, dst, port, want):
    """One migration the TLS layer must refuse: the source fails with want
    in its error and runs on; the destination drops the connection, says
    so (log, query-migrate's x-stray-connections) and keeps listening."""
    q = src.qmp()
    kt.wait_incoming(dst)
    before = strays(dst).get("count", 0)
    q.cmd("migrate", uri="tcp:127.0.0.1:%d" % port)
    res = kt.wait_migration(q, timeout=kt.slow(40))
    err = res.get("error-desc", "")
    print("# %s: source %r" % (name, err))
    check(name + "_failed", res.get("status") == "failed", "%r" % res)
    check(name + "_reason", want.lower() in err.lower(), "%r" % err)
    check(name + "_source_running", q.cmd("query-status")["status"] == "running")
    check(name + "_no_tracking", res.get("x-dirty-tracking") is False, "%r" % res)
    deadline = time.time() + kt.slow(20)
    s = {}
    while time.time() < deadline and dst.proc.poll() is None:
        s = strays(dst)
        # the count is published before the log line is written
        if s.get("count", 0) > before and "dropped a connection" in dst.output():
            break
        time.sleep(0.1)
    print("# %s: destination %r" % (name, s))
    check(name + "_destination_waits", dst.proc.poll() is None and
          dst.qmp().cmd("query-migrate").get("status") == "setup", dst.output()[-400:])
    check(name + "_destination_counts", s.get("count") == before + 1, "%r" % s)
    check(name + "_destination_says_tls", "TLS" in s.get("last-reason", "") and
          "dropped a connection" in dst.output(), "%r %s" % (s, dst.output()[-400:]))


class StrayProxy(TapProxy):
    """A TapProxy that, before it relays each connection after the first
    (the multifd channels), opens a connection of its own to the
    destination and sends it garbage, so the destination meets a stray
    where it expects a channel."""

    def __init__(self, dst_port):
        self.strays = []
        super().__init__(dst_port)

    def _before_connect(self):
        if self.connections >= 1:
            junk = socket.create_connection(("127.0.0.1", self.dst_port))
            junk.sendall(b"\x00" * 64)
            self.strays.append(junk)

    def close(self):
        super().close()
        for s in self.strays:
            s.close()


def test_psk_strays(d, vms, check):
    """A PSK destination meets, before the real source, a connection that
    sends garbage and one that stays silent, and then a stray before each
    of the source's two multifd channels: each fails its TLS handshake and
    is dropped and counted, and the migration completes."""
    keys = certs(d, "c")
    creds = "tls-creds-psk,id=k0,dir=%s/psk" % keys
    src = kt.kmig_vm(d, "src", "workload=idle report_ms=300", memory="256M",
                     extra=["--object", creds])
    vms.append(src)
    port = kt.free_port()
    dst = kt.kmig_vm(d, "dst", "workload=idle report_ms=300", memory="256M",
                     extra=["--object", creds, "--tls-creds", "k0", "--incoming",
                            "tcp:127.0.0.1:%d" % port])
    vms.append(dst)
    check("boot", src.console.wait(r"^heartbeat", timeout=kt.slow(20)) is not None,
          kt.dump(src))
    if not check("listening", kt.wait_incoming(dst, kt.slow(30)), kt.dump(dst)):
        return
    kt.set_caps(dst.qmp(), multifd=True)
    junk = socket.create_connection(("127.0.0.1", port))
    junk.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
    silent = socket.create_connection(("127.0.0.1", port))
    tap = StrayProxy(port)
    try:
        deadline = time.time() + kt.slow(15)
        while time.time() < deadline and dst.proc.poll() is None and \
                strays(dst).get("count", 0) < 2:
            time.sleep(0.1)
        s = strays(dst)
        print("# strays before the source: %r" % s)
        if not check("dropped_before", s.get("count") == 2, "%r; %s" % (s, kt.dump(dst))):
            return
        res = kt.migrate(src, dst, "tcp:127.0.0.1:%d" % tap.port,
                         caps={"multifd": True},
                         params={"tls-creds": "k0", "multifd-channels": 2, "max-bandwidth": 0},
                         timeout=kt.slow(90))
        check("completed", res.get("status") == "completed", "%r %s" % (res, kt.dump(dst)))
        s = strays(dst)
        print("# strays: %r" % s)
        check("counted", s.get("count") == 4, "%r" % s)
        check("reason_tls", "TLS" in s.get("last-reason", ""), "%r" % s)
        check("channels", "2 multifd channels" in dst.output(), dst.output()[-600:])
    finally:
        tap.close()
        junk.close()
        silent.close()


def test_tls_creds_while_listening(d, vms, check):
    """tls-creds and tls-authz cannot change while an incoming listener is
    up (--incoming tcp: at start-up, or migrate-incoming): the change is
    refused and query-migrate-parameters shows what is in force."""
    keys = certs(d, "c")
    creds = "tls-creds-psk,id=k0,dir=%s/psk" % keys
    authz = "authz-simple,id=only,identity=qemu"
    dst = kt.kmig_vm(d, "dst", "workload=idle", memory="128M",
                     extra=["--object", creds, "--object", authz, "--incoming",
                            "tcp:127.0.0.1:%d" % kt.free_port()])
    vms.append(dst)
    if not check("listening", kt.wait_incoming(dst, kt.slow(30)), kt.dump(dst)):
        return
    q = dst.qmp()
    for name, value in (("tls-creds", "k0"), ("tls-authz", "only")):
        rep = q.cmd_full("migrate-set-parameters", **{name: value})
        print("# %s at start-up: %r" % (name, rep))
        check(name + "_refused", "error" in rep and "incoming" in rep["error"]["desc"],
              "%r" % rep)
        check(name + "_not_shown", q.cmd("query-migrate-parameters").get(name) == "",
              "%r" % q.cmd("query-migrate-parameters"))
    rep = q.cmd_full("migrate-set-parameters", **{"max-bandwidth": 1 << 20})
    check("others_change", "return" in rep, "%r" % rep)

    dst = kt.kmig_vm(d, "dst2", "workload=idle", memory="128M",
                     extra=["--object", creds, "--incoming", "defer"])
    vms.append(dst)
    q = dst.qmp()
    q.cmd("migrate-set-parameters", **{"tls-creds": "k0"})
    q.cmd("migrate-incoming", uri="tcp:127.0.0.1:%d" % kt.free_port())
    if not check("listening2", kt.wait_incoming(dst, kt.slow(30)), kt.dump(dst)):
        return
    rep = q.cmd_full("migrate-set-parameters", **{"tls-creds": ""})
    check("clear_refused", "error" in rep and "incoming" in rep["error"]["desc"], "%r" % rep)
    check("still_k0", q.cmd("query-migrate-parameters").get("tls-creds") == "k0",
          "%r" % q.cmd("query-migrate-parameters"))
    rep = q.cmd_full("migrate-set-parameters", **{"tls-creds": "k0"})
    check("same_value_accepted", "return" in rep, "%r" % rep)


def test_x509_refusals_then_success(d, vms, check):
    """X.509 with client certificates and tls-authz.  One source tries, in
    turn: plain to a TLS destination, a certificate of another CA, a host
    name the destination's certificate does not carry, a client the
    destination's tls-authz does not name; each is refused on both sides;
    then the right credentials complete with x-verify."""
    good = certs(d, "good")
    other = certs(d, "other", cn="intruder")
    creds = "tls-creds-x509,id=x0,dir=%s/x509" % good
    authz = "authz-simple,id=only,identity=CN=source,,O=kmig"
    src = kt.kmig_vm(d, "src", VERIFY, memory="256M", cpus=2,
                     extra=["--object", creds, "--object",
                            "tls-creds-x509,id=bad,dir=%s/x509" % other])
    vms.append(src)
    check("boot", src.console.wait(r"kmig-guest ready cpus=2", timeout=kt.slow(20)) is not None,
          kt.dump(src))
    q = src.qmp()
    kt.set_caps(q, x_verify=True)
    kt.set_params(q, max_bandwidth=0, downtime_limit=500)
    rep = q.cmd_full("migrate-set-parameters", **{"tls-creds": "nosuch"})
    check("unknown_creds_refused", "error" in rep and "nosuch" in rep["error"]["desc"], "%r" % rep)

    dst, port = destination(d, vms, "dst-plain", creds, ["--object", authz, "--tls-authz", "only"])
    refused(check, "plain", src, dst, port, "")
    first = dst, port
    kt.set_params(q, tls_creds="bad")
    dst, port = destination(d, vms, "dst-ca", creds)
    refused(check, "foreign_ca", src, dst, port, "certificate")
    kt.set_params(q, tls_creds="x0", tls_hostname="elsewhere.example")
    dst, port = destination(d, vms, "dst-name", creds)
    refused(check, "wrong_name", src, dst, port, "name")
    kt.set_params(q, tls_hostname="")
    dst, port = destination(d, vms, "dst-authz", creds,
                            ["--object", "authz-simple,id=someone,identity=CN=someone", "--tls-authz",
                             "someone"])
    refused(check, "not_authorized", src, dst, port, "denied")
    p = q.cmd("query-migrate-parameters")
    check("params_shown", p.get("tls-creds") == "x0" and p.get("tls-hostname") == "",
          "%r" % p)

    # the first destination, which dropped the plain source, waits on
    dst, port = first
    # with a bandwidth limit (the limiter and TLS's 16 KiB records:
    # tests/unit/test_tls.c t_rate_limit) and auto-converge: under
    # emulation TLS carries ~10 MB/s, about what the guest dirties
    kt.set_caps(q, x_verify=True, auto_converge=True)
    kt.set_params(q, max_bandwidth=64 << 20, downtime_limit=1000, x_cpu_throttle_policy="computed")
    res = kt.migrate(src, dst, "tcp:127.0.0.1:%d" % port, timeout=kt.slow(180))
    print("# x509 at a 64 MiB/s limit: %.0f Mbit/s, %s ms" % (
        res.get("ram", {}).get("mbps", 0), res.get("total-time")))
    check("completed", res.get("status") == "completed", "%r %s" % (res, kt.dump(dst)))
    verify_on(check, "dst_ok", dst)


def test_bad_objects_refused(d, vms, check):
    """kmig run refuses a malformed object or a missing file at start."""
    keys = certs(d, "c")
    for name, spec in [("no_dir", "tls-creds-psk,id=a"),
                       ("no_file", "tls-creds-psk,id=a,dir=/nonexistent"),
                       ("no_ca", "tls-creds-x509,id=a,dir=%s/psk" % keys),
                       ("bad_type", "tls-creds-none,id=a,dir=%s" % keys),
                       ("bad_prop", "tls-creds-psk,id=a,dir=%s/psk,colour=red" % keys)]:
        vm = kt.kmig_vm(d, "bad-" + name, "workload=idle", memory="128M", extra=["--object", spec])
        vms.append(vm)
        rc = vm.wait_exit(kt.slow(10))
        check(name + "_exits", rc not in (None, 0), "exit %r" % rc)
        check(name + "_says_object", "--object" in vm.output(), vm.output()[-300:])
    vm = kt.kmig_vm(d, "bad-ref", "workload=idle", memory="128M", extra=["--tls-creds", "x"])
    vms.append(vm)
    check("unknown_id_exits", vm.wait_exit(kt.slow(10)) not in (None, 0))
