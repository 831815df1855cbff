#!/usr/bin/python3
"""kmig's command line: each bad input ends kmig with a non-zero status and
exactly one stderr line "kmig: error: ..." that names the problem, never a
crash; `kmig version` works."""
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from kmigtest import GUEST, KMIG, Report, tmpdir  # noqa: E402

R = Report()


def run_kmig(args, timeout=20):
    p = subprocess.Popen([KMIG] + args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, errors="replace",
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, err = p.communicate()
        return None, out, err
    return p.returncode, out, err


def bad_input(name, args, words, needs_kvm=False):
    """args must fail; every word in words must appear in the error line."""
    if needs_kvm and not os.path.exists("/dev/kvm"):
        R.skip("cli_" + name, "/dev/kvm is absent (the kernel is read after opening it)")
        return
    rc, out, err = run_kmig(["run"] + args)
    lines = err.splitlines()
    desc = "kmig run %s -> status %s, stderr %r" % (" ".join(args), rc, err)
    R.ok("cli_%s_fails" % name, rc is not None and rc > 0, desc)
    R.ok("cli_%s_one_error_line" % name,
         len(lines) == 1 and lines[0].startswith("kmig: error:"), desc)
    R.ok("cli_%s_names_problem" % name,
         len(lines) >= 1 and all(w.lower() in lines[0].lower() for w in words),
         "want %s in: %r" % (words, err))


def main():
    if not os.access(KMIG, os.X_OK):
        R.ok("cli_kmig_built", False, "%s is missing (make)" % KMIG)
        R.done()
    d = tmpdir()
    try:
        text = os.path.join(d, "notelf.txt")
        with open(text, "w") as f:
            f.write("this is not an ELF file\n" * 100)
        empty = os.path.join(d, "empty")
        open(empty, "w").close()
        missing = os.path.join(d, "no-such-kernel")
        g = ["--kernel", GUEST, "--console", "none"]

        bad_input("missing_kernel_file", ["--kernel", missing, "--console", "none"],
                  [missing, "no such file"], needs_kvm=True)
        bad_input("non_elf", ["--kernel", text, "--console", "none"],
                  [text, "not an ELF"], needs_kvm=True)
        bad_input("empty_kernel", ["--kernel", empty, "--console", "none"],
                  [empty], needs_kvm=True)
        bad_input("elf_without_pvh_note", ["--kernel", "/bin/true", "--console", "none"],
                  ["/bin/true", "PVH"], needs_kvm=True)
        bad_input("no_kernel", ["--console", "none"], ["--kernel"])
        bad_input("memory_bogus", g + ["--memory", "bogus"], ["--memory", "bogus"])
        bad_input("memory_1K", g + ["--memory", "1K"], ["--memory", "1K"])
        bad_input("memory_64G", g + ["--memory", "64G"], ["--memory", "64G"])
        bad_input("cpus_0", g + ["--cpus", "0"], ["--cpus", "0"])
        bad_input("cpus_1000", g + ["--cpus", "1000"], ["--cpus", "1000"])
        bad_input("cpus_bogus", g + ["--cpus", "two"], ["--cpus", "two"])
        bad_input("dirty_ring_1000", g + ["--dirty-ring", "1000"], ["--dirty-ring", "1000"])
        bad_input("unknown_option", g + ["--frobnicate"], ["--frobnicate"])
        bad_input("missing_option_value", g + ["--cpus"], ["--cpus"])
        bad_input("console_bogus", ["--kernel", GUEST, "--console", "bogus"],
                  ["--console", "bogus"])
        bad_input("qmp_tcp", g + ["--qmp", "tcp:x"], ["--qmp", "tcp:x"])
        bad_input("stray_argument", g + ["extra"], ["extra"])

        rc, out, err = run_kmig(["version"])
        R.ok("cli_version", rc == 0 and re.match(r"^kmig \d+\.\d+\.\d+\n$", out) and not err,
             "status %s, stdout %r, stderr %r" % (rc, out, err))
        rc, out, err = run_kmig(["run", "--help"])
        R.ok("cli_run_help", rc == 0 and "--kernel" in out, "status %s, stdout %r" % (rc, out))
        rc, out, err = run_kmig([])
        R.ok("cli_no_command", rc is not None and rc > 0 and "usage" in err,
             "status %s, stderr %r" % (rc, err))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    R.done()


if __name__ == "__main__":
    main()
