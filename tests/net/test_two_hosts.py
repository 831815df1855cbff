"""scripts/two-hosts: the two-host topology (network namespaces) that the
network tests and benchmarks use: who reaches whom, teardown on every exit
path, the shaped wire's rate and the relay's added round-trip time.

Marked netns: needs root and iproute2 (fails without them, as the other
netns tests do), no KVM (inside scripts/kvm-vm it proves that the VM's
initramfs loads the bridge, veth, tun and tbf modules).  Each test
uses a tag of its own, so it never touches a topology someone else has up.
"""
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TWO_HOSTS = os.path.join(ROOT, "scripts", "two-hosts")
NETTOOL = os.path.join(ROOT, "tests", "net", "nettool.py")

pytestmark = pytest.mark.netns


@pytest.fixture(autouse=True)
def needs_root_and_ip():
    if os.geteuid() != 0:
        pytest.fail("needs root: creates network namespaces", pytrace=False)
    if shutil.which("ip") is None:
        pytest.fail("needs iproute2's ip (scripts/setup-deps.sh installs it)", pytrace=False)

_seq = [0]


def new_tag():
    _seq[0] += 1
    return "kt%d%c" % (os.getpid() % 100000, ord("a") + _seq[0])


def two_hosts(*args, check=True, timeout=60):
    r = subprocess.run([TWO_HOSTS] + list(args), capture_output=True, text=True,
                       timeout=timeout)
    if check and r.returncode != 0:
        pytest.fail("two-hosts %s: status %d: %s" % (" ".join(args), r.returncode,
                                                     r.stderr.strip()), pytrace=False)
    return r


def namespaces(tag):
    names = os.listdir("/run/netns") if os.path.isdir("/run/netns") else []
    return sorted(n for n in names if n.startswith(tag + "-"))


def root_links():
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return sorted(ln.split(":")[1].strip() for ln in out.splitlines())


@pytest.fixture
def topo():
    """up(*opts) brings a topology up and returns its KMIG_NET_* variables;
    whatever was brought up is taken down at teardown."""
    tags = []

    def up(*opts):
        tag = new_tag()
        tags.append(tag)
        r = two_hosts("up", "--tag", tag, *opts)
        env = dict(ln.split("=", 1) for ln in r.stdout.splitlines() if "=" in ln)
        assert env["KMIG_NET_TAG"] == tag
        return env
    yield up
    for tag in tags:
        two_hosts("down", "--tag", tag, check=False)


def in_ns(ns, *args, timeout=30):
    return subprocess.run(["ip", "netns", "exec", ns, sys.executable, NETTOOL] +
                          [str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout)


def ping(ns, addr, count=1, timeout=3.0):
    """RTTs in ms of the replies (lost ones left out)."""
    r = in_ns(ns, "ping", addr, count, timeout)
    return [float(x) for x in r.stdout.split() if x != "lost"]


def transfer(src_ns, dst_ns, dst_addr, nbytes, port=5201):
    """TCP transfer of nbytes from src_ns to dst_addr (in dst_ns); bytes/s."""
    sink = subprocess.Popen(["ip", "netns", "exec", dst_ns, sys.executable, NETTOOL, "sink",
                             dst_addr, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert sink.stdout.readline().strip() == "listening"
        r = in_ns(src_ns, "send", dst_addr, port, nbytes, timeout=60)
        assert r.returncode == 0, r.stderr
        n, secs = sink.stdout.readline().split()
        assert int(n) == nbytes
        return nbytes / max(float(secs), 1e-6)
    finally:
        sink.kill()
        sink.wait()


def alive(pid):
    """Whether process pid runs (a zombie waiting for its reaper does not)."""
    try:
        with open("/proc/%s/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_reach_and_down():
    """client -> A's bridge, client -> B's bridge (across the wire), A <-> B;
    a tap0 with vnet_hdr on each host's bridge; down removes everything and
    is idempotent."""
    tag = new_tag()
    links = root_links()
    env = dict(ln.split("=", 1) for ln in
               two_hosts("up", "--tag", tag).stdout.splitlines() if "=" in ln)
    try:
        a, b, c = env["KMIG_NET_NS_A"], env["KMIG_NET_NS_B"], env["KMIG_NET_NS_CLIENT"]
        assert namespaces(tag) == sorted([a, b, c])
        assert (env["KMIG_NET_A"], env["KMIG_NET_B"], env["KMIG_NET_CLIENT"],
                env["KMIG_NET_GUEST"]) == ("10.77.0.1", "10.77.0.2", "10.77.0.100",
                                           "10.77.0.10")
        for ns, addr, what in ((c, env["KMIG_NET_A"], "client -> A"),
                               (c, env["KMIG_NET_B"], "client -> B"),
                               (a, env["KMIG_NET_B"], "A -> B"),
                               (b, env["KMIG_NET_A"], "B -> A"),
                               (b, env["KMIG_NET_CLIENT"], "B -> client")):
            assert ping(ns, addr), "%s (%s in %s): no reply" % (what, addr, ns)
        assert not ping(a, "10.77.0.99", timeout=0.5), "a reply from nobody"
        for ns in (a, b):
            tap = subprocess.run(["ip", "-n", ns, "-d", "link", "show", "tap0"],
                                 capture_output=True, text=True).stdout
            assert "master br0" in tap and "vnet_hdr on" in tap, tap
        assert root_links() == links, "links added outside the namespaces"
    finally:
        two_hosts("down", "--tag", tag)
    assert namespaces(tag) == []
    assert root_links() == links
    assert two_hosts("down", "--tag", tag).returncode == 0
    assert "no namespaces" in two_hosts("status", "--tag", tag).stdout


def test_up_refuses_existing(topo):
    env = topo()
    tag = env["KMIG_NET_TAG"]
    r = two_hosts("up", "--tag", tag, check=False)
    assert r.returncode != 0 and "exist already" in r.stderr, r.stderr
    assert len(namespaces(tag)) == 3, "the refused up must leave the topology as it was"
    r = two_hosts("run", "--tag", tag, "--", "true", check=False)
    assert r.returncode != 0 and "exist already" in r.stderr, r.stderr
    assert len(namespaces(tag)) == 3, "a refused run must not take the topology down"
    two_hosts("up", "--tag", tag, "--force")
    assert ping(env["KMIG_NET_NS_CLIENT"], env["KMIG_NET_B"])


def test_bad_options():
    tag = new_tag()
    for args, why in ((["--tag", tag, "--rate", "8"], "--rate"),
                      (["--tag", tag, "--rtt-ms", "x"], "--rtt-ms"),
                      (["--tag", tag + "-x"], "--tag")):
        r = two_hosts("up", *args, check=False)
        assert r.returncode != 0 and why in r.stderr, r.stderr
        assert namespaces(tag) == []


def test_run_tears_down_on_failure():
    """run: COMMAND sees the variables, its status is run's, and nothing is
    left, whether COMMAND fails or run is killed (with the relay up)."""
    links = root_links()
    tag = new_tag()
    r = two_hosts("run", "--tag", tag, "--", "sh", "-c",
                  'test "$KMIG_NET_B" = 10.77.0.2 && test -e "/run/netns/$KMIG_NET_NS_A" '
                  '&& exit 7', check=False)
    assert r.returncode == 7, r.stderr
    assert namespaces(tag) == [] and root_links() == links

    tag = new_tag()
    p = subprocess.Popen([TWO_HOSTS, "run", "--tag", tag, "--rtt-ms", "10", "--", "sleep", "60"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        relay = []
        while not relay and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.2)
            relay = subprocess.run(["ip", "netns", "pids", tag + "-w"], capture_output=True,
                                   text=True).stdout.split()
        assert relay, "the relay never ran in %s-w" % tag
        assert len(namespaces(tag)) == 4
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
            two_hosts("down", "--tag", tag, check=False)
    assert p.returncode == 143, err
    assert namespaces(tag) == [] and root_links() == links
    assert not any(alive(pid) for pid in relay), "the relay outlived down"


def test_rate_limits_the_wire(topo):
    """--rate 8mbit: A -> B and B -> A stay under 1.5x the cap; the same wire
    unshaped goes faster than 2x the cap (so the cap is what held it back)."""
    cap = 8e6 / 8
    env = topo("--rate", "8mbit")
    a, b = env["KMIG_NET_NS_A"], env["KMIG_NET_NS_B"]
    ab = transfer(a, b, env["KMIG_NET_B"], 1000000)
    ba = transfer(b, a, env["KMIG_NET_A"], 600000)
    for what, rate in (("A -> B", ab), ("B -> A", ba)):
        assert rate <= 1.5 * cap, "%s: %.2f MB/s over an 8mbit wire" % (what, rate / 1e6)
        assert rate >= 0.2 * cap, "%s: %.2f MB/s, far under the cap" % (what, rate / 1e6)
    for ns in (a, b):
        subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", "wire0", "root"], check=True)
    free = transfer(a, b, env["KMIG_NET_B"], 4000000)
    assert free > 2 * cap, "unshaped only %.2f MB/s" % (free / 1e6)


def test_rtt_relay(topo):
    """--rtt-ms 40: a round trip across the wire takes 40 ms or more; one
    that stays on A's bridge does not."""
    env = topo("--rtt-ms", "40")
    rtts = ping(env["KMIG_NET_NS_A"], env["KMIG_NET_B"], count=4)
    assert len(rtts) >= 3, rtts
    assert min(rtts) >= 40.0, rtts
    assert sorted(rtts)[len(rtts) // 2] < 1000.0, rtts
    local = ping(env["KMIG_NET_NS_CLIENT"], env["KMIG_NET_A"], count=2)
    assert local and min(local) < 40.0, local
    # the relay carries TCP (GSO frames, offloaded checksums) intact
    assert transfer(env["KMIG_NET_NS_CLIENT"], env["KMIG_NET_NS_B"], env["KMIG_NET_B"],
                    2000000) > 0
