"""kmig's command line: each bad input ends kmig with a non-zero status and
exactly one stderr line "kmig: error: ..." (ending with a newline) that names
the problem, never a crash; `kmig version`, `--version`, `--help`, `run --help`
and `migrate --help` work.

Only the bad kernel files that exist need KVM (kmig reads the kernel after
opening /dev/kvm; a kernel or initrd it cannot read is refused before):
those are marked kvm; the rest run anywhere."""
import os
import re
import subprocess

import pytest

import kmigtest as kt

KVM = pytest.mark.kvm
NOT_ELF = "notelf.txt"
EMPTY = "empty"
MISSING = "no-such-kernel"
G = ["--kernel", kt.GUEST, "--console", "none"]


def run_kmig(args, timeout=20):
    p = subprocess.Popen([kt.KMIG] + args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, errors="replace",
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, err = p.communicate()
        return None, out, err
    return p.returncode, out, err


@pytest.fixture
def files(d):
    """The bad kernel files, by name (MISSING is never created)."""
    with open(os.path.join(d, NOT_ELF), "w") as f:
        f.write("this is not an ELF file\n" * 100)
    open(os.path.join(d, EMPTY), "w").close()
    return lambda name: os.path.join(d, name)


def test_kmig_built(check):
    check("cli_kmig_built", os.access(kt.KMIG, os.X_OK), "%s is missing (make)" % kt.KMIG)


# (name, args, words that must be in the error line, exit status: 2 when the
# command's form is wrong, 1 for a value); {NAME} is the path of the file
# NAME in the test's directory
BAD = [
    ("missing_kernel_file", ["--kernel", "{%s}" % MISSING, "--console", "none"],
     ["--kernel", "{%s}" % MISSING, "no such file"], 1),
    ("missing_initrd_file", G + ["--initrd", "{%s}" % MISSING],
     ["--initrd", "{%s}" % MISSING, "no such file"], 1),
    pytest.param("non_elf", ["--kernel", "{%s}" % NOT_ELF, "--console", "none"],
                 ["{%s}" % NOT_ELF, "not an ELF"], 1, marks=KVM),
    pytest.param("empty_kernel", ["--kernel", "{%s}" % EMPTY, "--console", "none"],
                 ["{%s}" % EMPTY], 1, marks=KVM),
    pytest.param("elf_without_pvh_note", ["--kernel", "/bin/true", "--console", "none"],
                 ["/bin/true", "PVH"], 1, marks=KVM),
    ("no_kernel", ["--console", "none"], ["--kernel"], 2),
    ("memory_bogus", G + ["--memory", "bogus"], ["--memory", "bogus"], 1),
    ("memory_1K", G + ["--memory", "1K"], ["--memory", "1K"], 1),
    ("memory_64G", G + ["--memory", "64G"], ["--memory", "64G"], 1),
    ("cpus_0", G + ["--cpus", "0"], ["--cpus", "0"], 1),
    ("cpus_1000", G + ["--cpus", "1000"], ["--cpus", "1000"], 1),
    ("cpus_bogus", G + ["--cpus", "two"], ["--cpus", "two"], 1),
    ("dirty_ring_1000", G + ["--dirty-ring", "1000"], ["--dirty-ring", "1000"], 1),
    ("unknown_option", G + ["--frobnicate"], ["--frobnicate"], 2),
    ("missing_option_value", G + ["--cpus"], ["--cpus"], 2),
    ("short_group", G + ["-Sx"], ["unknown option: -x"], 2),
    ("flag_given_value", G + ["--mem-prealloc=1"], ["--mem-prealloc takes no argument"], 2),
    ("console_bogus", ["--kernel", kt.GUEST, "--console", "bogus"], ["--console", "bogus"], 1),
    ("qmp_tcp", G + ["--qmp", "tcp:x"], ["--qmp", "tcp:x"], 1),
    ("stray_argument", G + ["extra"], ["extra"], 2),
    ("balloon_value", G + ["--balloon=free-page-hint=maybe"], ["--balloon", "maybe", "on|off"], 1),
    ("balloon_property", G + ["--balloon=deflate-on-oom=on"], ["--balloon", "deflate-on-oom",
                                                                "unknown property"], 1),
    ("balloon_no_value", G + ["--balloon=free-page-reporting"], ["--balloon",
                                                                 "free-page-reporting"], 1),
]


def _ids(p):
    return p.values[0] if hasattr(p, "values") else p[0]


@pytest.mark.parametrize("name, args, words, status", BAD, ids=[_ids(p) for p in BAD])
def test_bad_input(files, check, name, args, words, status):
    """args must fail with status; every word in words must appear in the
    error line."""
    def fill(s):
        return files(s[1:-1]) if s.startswith("{") and s.endswith("}") else s
    args = [fill(a) for a in args]
    words = [fill(w) for w in words]
    rc, out, err = run_kmig(["run"] + args)
    lines = err.splitlines()
    desc = "kmig run %s -> status %s, stderr %r" % (" ".join(args), rc, err)
    check("cli_%s_fails" % name, rc == status, "want status %d: %s" % (status, desc))
    check("cli_%s_one_error_line" % name,
          len(lines) == 1 and lines[0].startswith("kmig: error:") and err.endswith("\n"), desc)
    check("cli_%s_names_problem" % name,
          len(lines) >= 1 and all(w.lower() in lines[0].lower() for w in words),
          "want %s in: %r" % (words, err))


@pytest.mark.parametrize("args", [["version"], ["--version"]], ids=["version", "dashdash"])
def test_version(check, args):
    rc, out, err = run_kmig(args)
    check("cli_version", rc == 0 and re.match(r"^kmig \d+\.\d+\.\d+\n$", out) and not err,
          "status %s, stdout %r, stderr %r" % (rc, out, err))


# (command line, words the help on stdout must hold)
HELP = [(["--help"], ["kmig run", "kmig migrate"]), (["-h"], ["kmig run"]),
        (["run", "--help"], ["--kernel", "--incoming"]),
        (["migrate", "--help"], ["--qmp", "URI", "--bandwidth", "--postcopy", "--disk"])]


@pytest.mark.parametrize("args, words", HELP, ids=[" ".join(a) for a, _ in HELP])
def test_help(check, args, words):
    rc, out, err = run_kmig(args)
    check("cli_help", rc == 0 and all(w in out for w in words) and not err,
          "kmig %s: status %s, stdout %r, stderr %r" % (" ".join(args), rc, out, err))


# kmig migrate's own mistakes: (name, args, words in the error line, status)
BAD_MIGRATE = [
    ("no_qmp", ["tcp:127.0.0.1:1"], ["--qmp"], 2),
    ("no_uri", ["--qmp", "unix:/nonexistent"], ["URI", "missing"], 2),
    ("two_uris", ["--qmp", "unix:/nonexistent", "a", "b"], ["more than one"], 2),
    ("unknown_option", ["--qmp", "unix:/x", "--frobnicate", "tcp:h:1"], ["--frobnicate"], 2),
    ("missing_value", ["--qmp", "unix:/x", "tcp:h:1", "--bandwidth"], ["--bandwidth", "missing"],
     2),
    ("short_group", ["--qmp", "unix:/x", "-xy", "tcp:h:1"], ["unknown option: -x"], 2),
    ("flag_given_value", ["--qmp", "unix:/x", "--json=1", "tcp:h:1"],
     ["--json takes no argument"], 2),
    ("ambiguous", ["--qmp", "unix:/x", "--d", "5", "tcp:h:1"], ["ambiguous option: --d"], 2),
    ("bad_bandwidth", ["--qmp", "unix:/x", "--bandwidth", "fast", "tcp:h:1"], ["--bandwidth"], 1),
    ("disk_postcopy", ["--qmp", "unix:/x", "--disk", "--postcopy", "auto", "tcp:h:1"],
     ["--disk", "post-copy"], 1),
    ("bad_policy", ["--qmp", "unix:/x", "--auto-converge", "fast", "tcp:h:1"],
     ["--auto-converge", "step, computed or off"], 1),
    ("two_policies", ["--qmp", "unix:/x", "--auto-converge", "off", "--dirty-limit", "5",
                      "tcp:h:1"], ["--dirty-limit", "--auto-converge"], 1),
]


@pytest.mark.parametrize("name, args, words, status", BAD_MIGRATE,
                         ids=[b[0] for b in BAD_MIGRATE])
def test_bad_migrate(check, name, args, words, status):
    rc, out, err = run_kmig(["migrate"] + args)
    lines = err.splitlines()
    desc = "kmig migrate %s -> status %s (want %d), stderr %r" % (" ".join(args), rc, status, err)
    check("cli_migrate_%s" % name, rc == status and len(lines) == 1 and
          lines[0].startswith("kmig: error:") and err.endswith("\n") and
          all(w.lower() in lines[0].lower() for w in words), desc)


def test_no_command(check):
    rc, out, err = run_kmig([])
    check("cli_no_command", rc == 2 and "usage" in err,
          "status %s, stderr %r" % (rc, err))


@pytest.mark.parametrize("args", [["version", "x"], ["--help", "x"]], ids=["version", "help"])
def test_extra_operand(check, args):
    rc, out, err = run_kmig(args)
    check("cli_extra_operand", rc == 2 and not out and err.startswith("kmig: error:") and
          len(err.splitlines()) == 1, "status %s, stdout %r, stderr %r" % (rc, out, err))


def test_unknown_command(check):
    rc, out, err = run_kmig(["frobnicate"])
    lines = err.splitlines()
    check("cli_unknown_command", rc == 2 and len(lines) == 1 and
          lines[0].startswith("kmig: error:") and "frobnicate" in lines[0] and not out,
          "status %s, stdout %r, stderr %r" % (rc, out, err))
