import os, sys, time, re
sys.path.insert(0, "tests/lib")
import kmigtest as kt
CACHE = "/var/cache/kmig/kvm-vm"
d = kt.tmpdir()
import subprocess
rd = os.path.join(d, "rd.gz")
subprocess.run(["guest/linux/mkinitrd.sh", rd, "build/linux/memcheck", CACHE + "/guest-mods"], check=True)
wait = int(sys.argv[1]); mib = int(sys.argv[2])
uri = "tcp:127.0.0.1:%d" % kt.free_port()
base = ["build/kmig", "run", "--kernel", CACHE + "/vmlinuz", "--initrd", rd, "--memory", "512M",
        "--balloon", "--cmdline", "console=ttyS0 kmig.mode=fill-free kmig.mib=%d kmig.then=ticks" % mib]
vms = []
for side, extra in (("src", []), ("dst", ["--incoming", uri])):
    con = os.path.join(d, side + ".log"); qmp = os.path.join(d, side + ".qmp")
    vm = kt.VM(base + ["--console", "file:" + con, "--qmp", "unix:" + qmp] + extra, con)
    vm.qmp_path = qmp; vms.append(vm)
src, dst = vms
try:
    m = src.console.wait(r"KMIG-LINUX tick (5) ", 120, proc=src.proc)
    print("\n".join(src.console.text().splitlines()[-12:]))
    if not m: sys.exit(1)
    q = src.qmp()
    q.cmd("migrate-set-capabilities", capabilities=[{"capability": "x-verify", "state": True}])
    q.cmd("migrate-set-parameters", **{"max-bandwidth": 1 << 30, "x-free-page-hint-wait": wait})
    kt.wait_incoming(dst)
    q.cmd("migrate", uri=uri)
    r = kt.wait_migration(q, 120)
    print(r)
    time.sleep(3)
    print("\n".join(dst.console.text().splitlines()[-3:]))
    print(src.output()[-1500:])
finally:
    src.kill(); dst.kill()
