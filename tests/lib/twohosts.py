"""scripts/two-hosts from Python: the topology as a context manager.

    with twohosts.topology() as h:
        h["a"], h["b"], h["c"]       # the namespaces: host A, host B, client
        h["KMIG_NET_B"]              # addresses, as `two-hosts up` prints them

Torn down (processes inside ended, namespaces removed) however the block
ends.
"""
import contextlib
import os
import subprocess

import kmigtest as kt

TWO_HOSTS = os.path.join(kt.ROOT, "scripts", "two-hosts")


@contextlib.contextmanager
def topology(tag=None, extra=()):
    tag = tag or "kn%d" % (os.getpid() % 100000)
    out = subprocess.run([TWO_HOSTS, "up", "--tag", tag, "--force"] + list(extra),
                         capture_output=True, text=True, timeout=60)
    if out.returncode:
        raise RuntimeError("two-hosts up: %s" % out.stderr.strip()[-500:])
    h = dict(ln.split("=", 1) for ln in out.stdout.split() if ln.startswith("KMIG_NET_"))
    h.update(a=tag + "-a", b=tag + "-b", c=tag + "-c")
    try:
        yield h
    finally:
        subprocess.run([TWO_HOSTS, "down", "--tag", tag], capture_output=True, timeout=60)


def fdb_port(ns, mac):
    """The port of ns's bridge br0 that has learned mac ("" if none)."""
    out = subprocess.run(["ip", "netns", "exec", ns, "bridge", "fdb", "show", "br", "br0"],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        f = line.split()
        if f and f[0] == mac and "dev" in f:
            return f[f.index("dev") + 1]
    return ""
