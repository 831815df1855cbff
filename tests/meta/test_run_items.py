"""tests/run.sh's kvm part takes exactly the pytest files that hold a test
marked kvm, qemu or linux, as pytest itself collects them: a file it left
out would never run its KVM tests (the host part deselects them), and a
file it took without one would only start pytest to select nothing.
No KVM needed."""
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARKS = "kvm or qemu or linux"


def collected_files():
    """The files holding a test pytest selects with MARKS."""
    files = sorted(os.path.relpath(f, ROOT) for f in glob.glob(os.path.join(ROOT, "tests/*/test_*.py")))
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                        "-p", "no:cacheprovider", "-m", MARKS] + files,
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return {line.split("::")[0] for line in r.stdout.splitlines() if "::" in line}


def run_items(**env):
    """`tests/run.sh --part items`: the kvm part's items (with
    build-san/kmig and build-tsan/kmig built, as make test builds them,
    also `san:FILE[::TEST]` and `tsan:e2e`)."""
    e = dict(os.environ)
    for k in ("KMIG_TEST_EMULATED", "KMIG_TEST_ALL"):
        e.pop(k, None)
    e.update(env)
    r = subprocess.run(["bash", "tests/run.sh", "--part", "items"], cwd=ROOT, env=e,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def pytest_items(items):
    """The plain pytest files among items (not san:FILE, not C tests)."""
    return {i for i in items if i.endswith(".py") and ":" not in i}


def test_kvm_items_are_the_marked_files():
    want = collected_files()
    assert want, "pytest collected no kvm, qemu or linux test at all"
    items = run_items()
    got = pytest_items(items)
    assert got == want, ("left out: %s; taken without a marked test: %s"
                         % (sorted(want - got), sorted(got - want)))
    assert len(items) == len(set(items)), "an item listed twice"


def test_emulated_items_the_same_files():
    """Under emulation the same files (only the sanitizer cuts differ)."""
    assert pytest_items(run_items()) == pytest_items(run_items(KMIG_TEST_EMULATED="1"))


def test_sanitizer_items_name_files():
    """Each `san:` item names a test file that exists (its cut may name
    one test of it), whether or not build-san/kmig is there now."""
    text = open(os.path.join(ROOT, "tests/run.sh")).read()
    named = set(re.findall(r"tests/e2e/test_[a-z_0-9]+\.py", text))
    assert named, "no test file named in tests/run.sh"
    missing = sorted(f for f in named if not os.path.exists(os.path.join(ROOT, f)))
    assert not missing, "tests/run.sh names files that do not exist: %s" % missing
