"""The test guest's verify workload seen from the host: its rounds on the
console, its complaints, and whether it writes on."""
import re
import time

import kmigtest as kt

VERIFY = "workload=verify mb=32 report_ms=300"
VERIFY_OK = r"^verify ok round=(\d+)"


def rounds(vm, start=0):
    """The round numbers of the `verify ok` lines from console line start."""
    return [int(x) for x in re.findall(VERIFY_OK, "\n".join(vm.console.lines[start:]), re.M)]


def bad_lines(vm):
    return [l for l in vm.console.text().splitlines() if "verify BAD" in l or "bad_pages" in l]


def goes_on(check, vm, name, n=2):
    """The guest writes on: n more verify rounds after now, none bad."""
    start = len(vm.console.lines)
    deadline = time.time() + kt.slow(30)
    while time.time() < deadline and len(rounds(vm, start)) < n and vm.proc.poll() is None:
        time.sleep(0.2)
        vm.console.poll()
    check(name + "_goes_on", len(rounds(vm, start)) >= n, kt.dump(vm, 15))
    check(name + "_no_bad", not bad_lines(vm), " / ".join(bad_lines(vm)[:5]))
