"""memcheck, the Linux guest's memory checker (guest/linux/memcheck.c), run
on this host as the ordinary Linux program it is: its verify and stress
workloads end with every page intact, a page damaged behind its back is
found (the negative control), and bad arguments are refused."""
import os
import re
import subprocess

import kmigtest as kt

MEMCHECK = os.path.join(kt.ROOT, "build", "linux", "memcheck")
REPORT = re.compile(r"^memcheck mode=(\w+) thr=(\d+) gen=(\d+) pages=(\d+) bad=(\d+) "
                    r"t_ms=(\d+) max_step_ms=(\d+) back=(\d+)$", re.M)


def run(*args, timeout=60):
    return subprocess.run([MEMCHECK] + list(args), capture_output=True, text=True,
                          timeout=timeout)


def test_verify_clean(check):
    p = run("--mib", "8", "--threads", "2", "--seconds", "1", "--report-ms", "200")
    reps = REPORT.findall(p.stdout)
    check("exit_0", p.returncode == 0, p.stdout[-400:] + p.stderr)
    check("done_line", "memcheck done bad=0" in p.stdout, p.stdout[-300:])
    check("reports", len(reps) >= 3, "%d reports" % len(reps))
    check("generations", reps and int(reps[-1][2]) >= 2, reps[-1:] or p.stdout[-200:])
    check("pages", reps and int(reps[-1][3]) == 8 * 256, reps[-1:])
    check("clock_forward", all(r[7] == "0" for r in reps), reps[-1:])


def test_stress_runs(check):
    p = run("--mode", "stress", "--mib", "8", "--seconds", "1", "--report-ms", "250")
    reps = REPORT.findall(p.stdout)
    check("exit_0", p.returncode == 0, p.stdout[-300:] + p.stderr)
    check("stress_reports", reps and reps[-1][0] == "stress" and int(reps[-1][2]) > 10,
          reps[-1:] or p.stdout[-200:])


def test_corrupt_page_is_found(check):
    """Negative control: one flipped bit in one page fails the run."""
    p = run("--mib", "4", "--seconds", "1", "--report-ms", "100", "--corrupt", "77")
    check("corrupted", "memcheck corrupted thr=0 page=77" in p.stdout, p.stdout[-300:])
    check("bad_named", re.search(r"memcheck BAD thr=0 page=77 ", p.stdout) is not None,
          p.stdout[-400:])
    check("exit_1", p.returncode == 1, "status %d" % p.returncode)
    check("done_bad", re.search(r"memcheck done bad=[1-9]", p.stdout) is not None,
          p.stdout[-200:])


def test_fill_free(check):
    p = run("--mode", "fill-free", "--mib", "16")
    check("filled", p.returncode == 0 and "memcheck filled-and-freed mib=16 bad=0" in p.stdout,
          p.stdout + p.stderr)


def test_bad_arguments(check):
    for args in (["--mode", "nope"], ["--mib", "0"], ["--threads", "65"], ["--mib", "12x"],
                 ["--seconds"], ["stray"]):
        p = run(*args)
        check("refused_%s" % "_".join(args), p.returncode == 2 and "usage:" in p.stderr,
              "status %d: %s" % (p.returncode, p.stderr))
