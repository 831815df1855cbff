#!/usr/bin/python3
"""Names the KVM the tests run on, for the first line of a test run.

  tests/lib/kvm_platform.py          prints one line, exits 0 when /dev/kvm
                                     is usable here and 1 when it is not
"""
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kmigtest as kt  # noqa: E402


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def loaded(names):
    return [m for m in names if os.path.isdir("/sys/module/" + m)]


def describe():
    state = kt.kvm_state()
    mods = loaded(("kvm_pvm", "kvm_intel", "kvm_amd"))
    host = "kernel %s" % platform.release()
    if "hypervisor" in cpu_flags():
        host += ", itself a guest (nested)"
    if kt.emulated():
        host += ", inside scripts/kvm-vm (TCG emulation: timings are not performance figures)"
    if state != "ok":
        return False, "platform: no usable KVM (%s; modules loaded: %s); %s" % (
            state, ", ".join(mods) or "none", host)
    # kvm_pvm may sit loaded but unbound next to a real one; the first match
    # in the order of kmigtest.kvm_module() is the one that serves /dev/kvm
    # on this project's machines
    return True, "platform: %s on /dev/kvm; %s" % (kt.kvm_module() or "unknown KVM module", host)


if __name__ == "__main__":
    usable, line = describe()
    print(line)
    sys.exit(0 if usable else 1)
