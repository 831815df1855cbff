"""Network probes for a guest that serves the network (the test guest's
net=1: a UDP echo responder, numbered datagrams with net_send, ARP).

Each probe runs as a process of its own, usually inside the network
namespace that holds the guest's tap (`netns=`: `ip netns exec NS`), and
prints one JSON line when it is ready and one with its findings when it
ends (after `seconds`, or when stopped).  Times are time.monotonic()
(CLOCK_MONOTONIC: the same clock in every process of the machine), so a
test can compare them with its own instants (say, a migration's
switchover).

    p = netprobe.probe("10.77.0.10", 7777, interval_ms=10, netns=ns)
    ...                                  # migrate, whatever
    r = p.stop()                         # a ProbeResult
    r.lost, r.max_gap(), r.first_reply_after(t)

    l = netprobe.listen(7778, netns=ns)  # the guest's net_send datagrams
    r = l.stop()                         # a ListenResult: r.seqs, r.count

    netprobe.arp("tap0", "10.77.0.10", netns=ns)    # {"mac": ..., "rtt": ...}

Command line (what the helpers run):
    netprobe.py probe --dst IP --port N [--interval-ms MS] [--seconds S] [--size B]
    netprobe.py listen --port N [--seconds S]
    netprobe.py arp --ifname IF --ip IP [--timeout S]
    netprobe.py arpwatch --ifname IF [--seconds S]
    netprobe.py tcplines --dst IP --port N [--seconds S]
Standard library only.
"""
import argparse
import faulthandler
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

PY = "/usr/bin/python3"
ETH_P_ARP = 0x0806


# ------------------------------------------------------------------ results

class ProbeResult:
    """What a prober saw: probes sent (seq -> send time), replies (seq ->
    arrival time of the first echo), echoes whose payload differed from
    the probe (mismatched), repeated echoes (dupes)."""

    def __init__(self, d):
        self.raw = d
        self.sent = {s: t for s, t in d["sent"]}
        self.replies = {}
        for s, t in d["replies"]:
            self.replies.setdefault(s, t)
        self.mismatched = d["mismatched"]
        self.dupes = d["dupes"]
        self.start, self.end = d["start"], d["end"]

    @property
    def lost(self):
        """Probes never echoed (the prober waits `grace` after its last one)."""
        return len([s for s in self.sent if s not in self.replies])

    def lost_seqs(self):
        return sorted(s for s in self.sent if s not in self.replies)

    def reply_times(self):
        return sorted(self.replies.values())

    def max_gap(self):
        """(gap, t_before, t_after): the longest time between two replies
        in a row (arrival times), (0, None, None) with fewer than two."""
        ts = self.reply_times()
        best = (0.0, None, None)
        for a, b in zip(ts, ts[1:]):
            if b - a > best[0]:
                best = (b - a, a, b)
        return best

    def first_reply_after(self, t, sent_after=False):
        """The arrival time of the first reply at or after instant t
        (time.monotonic()); with sent_after, only replies to probes sent at
        or after t count.  None if there is none."""
        ts = [r for s, r in self.replies.items()
              if r >= t and (not sent_after or self.sent.get(s, -1) >= t)]
        return min(ts) if ts else None

    def rtts(self):
        return sorted(self.replies[s] - self.sent[s] for s in self.replies if s in self.sent)

    def summary(self):
        g = self.max_gap()
        r = self.rtts()
        return "sent=%d replies=%d lost=%d mismatched=%d dupes=%d max_gap=%.3fs rtt_max=%.3fms" % (
            len(self.sent), len(self.replies), self.lost, self.mismatched, self.dupes, g[0],
            (r[-1] * 1e3) if r else -1)


class ListenResult:
    """Numbered datagrams that arrived: (seq, arrival time, source)."""

    def __init__(self, d):
        self.raw = d
        self.arrivals = [tuple(a) for a in d["arrivals"]]
        self.start, self.end = d["start"], d["end"]

    @property
    def count(self):
        return len(self.arrivals)

    @property
    def seqs(self):
        return [a[0] for a in self.arrivals]

    def rate(self):
        """Datagrams per second between the first and the last arrival."""
        if len(self.arrivals) < 2:
            return 0.0
        return (len(self.arrivals) - 1) / (self.arrivals[-1][1] - self.arrivals[0][1])

    def missing(self):
        """Sequence numbers absent between the first and the last seen."""
        s = set(self.seqs)
        return [q for q in range(min(s), max(s) + 1) if q not in s] if s else []


# ------------------------------------------------------------------ processes

class Run:
    """A netprobe process: waits for its ready line; stop() (SIGTERM) or
    wait() returns its result."""

    # the start is a Python interpreter's: a CI run on a busy emulated
    # machine (scripts/kvm-vm) saw two probers print nothing in 10 s
    def __init__(self, argv, netns=None, wrap=None, timeout=60.0):
        self.wrap = wrap
        cmd = [PY, os.path.abspath(__file__)] + argv
        if netns:
            cmd = ["ip", "netns", "exec", netns] + cmd
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        line = _readline(self.proc, timeout)
        if not line:
            self.proc.kill()
            raise RuntimeError("netprobe %s did not start: %s" % (
                " ".join(argv), self.proc.stderr.read()[-500:]))
        self.ready = json.loads(line)["ready"]

    def stop(self, timeout=120.0):
        # generous for a busy emulated machine (scripts/kvm-vm); the probes
        # that once never ended had deadlocked in their own signal handler
        # (Stop); one that hangs again is reported with its stacks (stuck)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.wait(timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError("netprobe did not end within %.0f s of its SIGTERM: %s"
                               % (timeout, self.stuck())) from None

    def stuck(self):
        """What a probe that does not end is doing: its scheduler state,
        CPU time and kernel wait channel, then every thread's stack (it
        prints them on SIGUSR1); kills it."""
        pid, what = self.proc.pid, []
        try:
            with open("/proc/%d/stat" % pid) as f:
                st = f.read().rsplit(")", 1)[1].split()
            with open("/proc/%d/wchan" % pid) as f:
                wchan = f.read()
            tck = os.sysconf("SC_CLK_TCK")
            what.append("state %s, user %.2f s, system %.2f s, wchan %s"
                        % (st[0], int(st[11]) / tck, int(st[12]) / tck, wchan or "-"))
        except (OSError, IndexError, ValueError) as e:
            what.append("no /proc view (%s)" % e)
        try:
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(2)
        except OSError:
            pass
        self.proc.kill()
        _, err = self.proc.communicate()
        return "; ".join(what) + "; stderr: " + err[-3000:]

    def wait(self, timeout=60.0):
        out, err = self.proc.communicate(timeout=timeout)
        lines = [ln for ln in out.splitlines() if ln.strip()]
        if not lines:
            raise RuntimeError("netprobe ended without a result (status %s): %s"
                               % (self.proc.returncode, err[-500:]))
        d = json.loads(lines[-1])
        return self.wrap(d) if self.wrap else d

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _readline(proc, timeout):
    box = []
    t = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    t.start()
    t.join(timeout)
    return box[0] if box else ""


def probe(dst, port, interval_ms=10, seconds=None, size=64, grace=1.0, netns=None):
    """Starts a prober: a datagram to dst:port every interval_ms (payload:
    8-byte big-endian sequence number from 1, 8-byte send time in ns,
    padding to `size` bytes); its result is a ProbeResult."""
    argv = ["probe", "--dst", dst, "--port", str(port), "--interval-ms", str(interval_ms),
            "--size", str(size), "--grace", str(grace)]
    if seconds is not None:
        argv += ["--seconds", str(seconds)]
    return Run(argv, netns, ProbeResult)


def listen(port, seconds=None, netns=None):
    """Starts a listener on UDP port (all addresses) recording each
    datagram's 8-byte big-endian sequence number; a ListenResult."""
    argv = ["listen", "--port", str(port)]
    if seconds is not None:
        argv += ["--seconds", str(seconds)]
    return Run(argv, netns, ListenResult)


def arp(ifname, ip, timeout=3.0, netns=None):
    """Asks who-has ip on ifname (a raw ARP request from the interface's
    own MAC and first IPv4 address); {"mac": "..", "rtt": s} or {"mac": None}."""
    return Run(["arp", "--ifname", ifname, "--ip", ip, "--timeout", str(timeout)],
               netns).wait(timeout + 10)


def tcplines(dst, port, seconds=None, netns=None):
    """Starts a TCP client of a server that streams numbered lines ("N\\n"
    from 0, the Linux guest's kmig.serve): records each line's arrival; its
    result is a dict: lines (count), bad (lines out of sequence), first and
    last arrival, max_gap (longest time between two lines) and gap_at (the
    arrival ending it), error (why the connection ended early: a reset, an
    EOF; None if it was still open when stopped) and retrans (the client
    namespace's TCP segments retransmitted meanwhile, /proc/net/snmp)."""
    argv = ["tcplines", "--dst", dst, "--port", str(port)]
    if seconds is not None:
        argv += ["--seconds", str(seconds)]
    return Run(argv, netns)


def arpwatch(ifname, seconds=None, netns=None):
    """Starts recording every ARP frame on ifname; the result is a dict
    with "frames": [{"t", "op", "sha", "spa", "tha", "tpa"}]."""
    argv = ["arpwatch", "--ifname", ifname]
    if seconds is not None:
        argv += ["--seconds", str(seconds)]
    return Run(argv, netns)


# ------------------------------------------------------------------ the probes themselves

class Stop:
    """SIGTERM or SIGINT, or `seconds` passed.  The handlers only set a
    flag: a handler runs in the main thread between two of its bytecodes,
    so one that took a lock (threading.Event.set) could wait for ever on
    a lock that the same thread held where the signal found it."""

    def __init__(self, seconds):
        self.flag = False
        self.deadline = time.monotonic() + seconds if seconds else None
        signal.signal(signal.SIGTERM, self._set)
        signal.signal(signal.SIGINT, self._set)
        # `kill -USR1` prints every thread's stack (Run.stop does, before
        # it gives up on a probe that does not end)
        faulthandler.register(signal.SIGUSR1, all_threads=True)

    def _set(self, *_):
        self.flag = True

    def wait(self, dt):
        """Sleeps up to dt (a signal's handler runs meanwhile and the sleep
        goes on); True when it is time to stop."""
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                return True
            dt = min(dt, left)
        if not self.flag and dt > 0:
            time.sleep(dt)
        return self.flag


def emit(d):
    sys.stdout.write(json.dumps(d) + "\n")
    sys.stdout.flush()


def run_probe(a):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(0.2)
    sent, replies = [], []
    counts = {"mismatched": 0, "dupes": 0}
    payloads = {}
    done = threading.Event()

    def rx():
        seen = set()
        while not done.is_set():
            try:
                data, _ = s.recvfrom(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            t = time.monotonic()
            if len(data) < 8:
                counts["mismatched"] += 1
                continue
            seq = struct.unpack(">Q", data[:8])[0]
            if payloads.get(seq) != data:
                counts["mismatched"] += 1
                continue
            if seq in seen:
                counts["dupes"] += 1
                continue
            seen.add(seq)
            replies.append((seq, t))

    th = threading.Thread(target=rx, daemon=True)
    th.start()
    stop = Stop(a.seconds)
    t0 = time.monotonic()
    emit({"ready": t0})
    period = a.interval_ms / 1000.0
    seq, nxt = 0, t0
    pad = bytes((i * 7) & 0xff for i in range(max(0, a.size - 16)))
    while True:
        seq += 1
        t = time.monotonic()
        data = struct.pack(">QQ", seq, time.monotonic_ns()) + pad
        payloads[seq] = data
        try:
            s.sendto(data, (a.dst, a.port))
            sent.append((seq, t))
        except OSError:         # e.g. no ARP answer yet: counts as lost
            sent.append((seq, t))
        nxt += period
        if nxt < time.monotonic():  # the prober itself was late: no burst
            nxt = time.monotonic()
        if stop.wait(nxt - time.monotonic()):
            break
    end = time.monotonic()
    time.sleep(a.grace)         # replies still on their way
    done.set()
    th.join(1)
    emit({"kind": "probe", "dst": a.dst, "port": a.port, "interval_ms": a.interval_ms,
          "start": t0, "end": end, "sent": sent, "replies": list(replies),
          "mismatched": counts["mismatched"], "dupes": counts["dupes"]})


def _receive(s, seconds):
    """Emits the ready line, then yields (data, source, arrival time) of
    each packet on socket s until `seconds` passed or a signal came."""
    s.settimeout(0.05)
    stop = Stop(seconds)
    emit({"ready": time.monotonic()})
    while not stop.wait(0):
        try:
            data, src = s.recvfrom(65536)
        except socket.timeout:
            continue
        yield data, src, time.monotonic()


def run_listen(a):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", a.port))
    t0 = time.monotonic()
    arrivals = [(struct.unpack(">Q", data[:8])[0], t, src[0], src[1])
                for data, src, t in _receive(s, a.seconds) if len(data) >= 8]
    emit({"kind": "listen", "port": a.port, "start": t0, "end": time.monotonic(),
          "arrivals": arrivals})


def _retrans():
    with open("/proc/net/snmp") as f:
        rows = [ln.split() for ln in f if ln.startswith("Tcp:")]
    return int(rows[1][rows[0].index("RetransSegs")])


def run_tcplines(a):
    r0 = _retrans()
    s = socket.create_connection((a.dst, a.port), timeout=10)
    s.settimeout(0.05)
    stop = Stop(a.seconds)
    emit({"ready": time.monotonic()})
    buf, want, lines, bad, error = b"", 0, 0, 0, None
    first = last = None
    gap, gap_at = 0.0, None
    while not stop.wait(0):
        try:
            data = s.recv(65536)
        except socket.timeout:
            continue
        except OSError as e:
            error = "%s: %s" % (type(e).__name__, e)
            break
        if not data:
            error = "EOF"
            break
        now = time.monotonic()
        buf += data
        *done, buf = buf.split(b"\n")
        for ln in done:
            n = int(ln) if ln.isdigit() else -1
            bad += n != want
            want = n + 1 if n >= 0 else want + 1
            lines += 1
            if last is not None and now - last > gap:
                gap, gap_at = now - last, now
            first = now if first is None else first
            last = now
    s.close()
    emit({"kind": "tcplines", "lines": lines, "bad": bad, "first": first, "last": last,
          "max_gap": gap, "gap_at": gap_at, "error": error, "retrans": _retrans() - r0})


def _mac(b):
    return ":".join("%02x" % x for x in b)


def _if_addr(ifname):
    """The interface's MAC and first IPv4 address (from `ip`)."""
    with open("/sys/class/net/%s/address" % ifname) as f:
        mac = bytes(int(x, 16) for x in f.read().strip().split(":"))
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", ifname],
                         capture_output=True, text=True).stdout.split()
    ip = out[out.index("inet") + 1].split("/")[0] if "inet" in out else "0.0.0.0"
    return mac, socket.inet_aton(ip)


def _parse_arp(frame):
    if len(frame) < 42 or frame[12:14] != b"\x08\x06":
        return None
    a = frame[14:42]
    return {"op": struct.unpack(">H", a[6:8])[0], "sha": _mac(a[8:14]),
            "spa": socket.inet_ntoa(a[14:18]), "tha": _mac(a[18:24]),
            "tpa": socket.inet_ntoa(a[24:28])}


def run_arp(a):
    mac, myip = _if_addr(a.ifname)
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ARP))
    s.bind((a.ifname, 0))
    s.settimeout(0.1)
    emit({"ready": time.monotonic()})
    req = (b"\xff" * 6 + mac + b"\x08\x06" + struct.pack(">HHBBH", 1, 0x0800, 6, 4, 1)
           + mac + myip + b"\x00" * 6 + socket.inet_aton(a.ip))
    t0 = time.monotonic()
    s.send(req.ljust(60, b"\x00"))
    res = {"kind": "arp", "ip": a.ip, "mac": None}
    while time.monotonic() - t0 < a.timeout:
        try:
            p = _parse_arp(s.recv(2048))
        except socket.timeout:
            continue
        if p and p["op"] == 2 and p["spa"] == a.ip:
            res.update(mac=p["sha"], rtt=time.monotonic() - t0, tha=p["tha"], tpa=p["tpa"])
            break
    emit(res)


def run_arpwatch(a):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ARP))
    s.bind((a.ifname, 0))
    t0 = time.monotonic()
    frames = []
    for data, _, t in _receive(s, a.seconds):
        p = _parse_arp(data)
        if p:
            p["t"] = t
            frames.append(p)
    emit({"kind": "arpwatch", "start": t0, "end": time.monotonic(), "frames": frames})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("probe")
    p.add_argument("--dst", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--interval-ms", type=float, default=10)
    p.add_argument("--seconds", type=float)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--grace", type=float, default=1.0)
    p = sub.add_parser("listen")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--seconds", type=float)
    p = sub.add_parser("arp")
    p.add_argument("--ifname", required=True)
    p.add_argument("--ip", required=True)
    p.add_argument("--timeout", type=float, default=3.0)
    p = sub.add_parser("arpwatch")
    p.add_argument("--ifname", required=True)
    p.add_argument("--seconds", type=float)
    p = sub.add_parser("tcplines")
    p.add_argument("--dst", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--seconds", type=float)
    a = ap.parse_args()
    {"probe": run_probe, "listen": run_listen, "arp": run_arp, "arpwatch": run_arpwatch,
     "tcplines": run_tcplines}[a.cmd](a)


if __name__ == "__main__":
    main()
