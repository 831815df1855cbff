#!/usr/bin/env python3
"""Fails (exit 1) if ring-0 code of the guest contains an instruction that
kvm_pvm's emulator may lack, or leaves ring-0 code for a ring-3 function.

Ring 0 is every section named .text.r0* : .text.r0_16 (real mode, AP
trampoline), .text.r0_32 (PVH entry) and .text.r0 (64-bit).  Code between
the symbols r0_crash_emul and r0_crash_emul_end (crash=emul) is exempt, and
so are bytes after a symbol whose name ends in "_data" (data inside a code
section, e.g. the trampoline's GDT pointer).

usage: check_r0.py [--objdump OBJDUMP] ELF
"""
import re
import subprocess
import sys

SECTIONS = [(".text.r0_16", "i8086"), (".text.r0_32", "i386"), (".text.r0", "x86-64")]
FORBIDDEN_MNEMONIC = re.compile(
    r"^(cmpxchg16b|cmpxchg8b|xsave\w*|xrstor\w*|fxsave\w*|fxrstor\w*|int3|popcnt|lzcnt|tzcnt"
    r"|fwait|wait|emms|femms|ldmxcsr|stmxcsr|[lms]fence|endbr32|endbr64|rdrand|rdseed|crc32"
    r"|movbe|rdpid|rdtscp|xgetbv|xsetbv|vzero\w*|\(bad\)"
    r"|f[a-z0-9]+"          # x87 (f*); 'fs'/'fs:' prefixes are excluded below
    r"|prefetch\w*|clflush\w*|movnti|maskmov\w*)$")
# SSE/AVX/MMX/x87 instructions are caught by their register operands.
ALLOWED = {"fs", "fs:", "movsd", "cmpsd", "stosd", "lodsd", "insd", "outsd", "scasd",
           "cmpxchg", "pushfq", "popfq", "pushf", "popf", "pushfd", "popfd"}
VECTOR_REG = re.compile(r"%(x|y|z)mm\d+|%mm\d|%st\b|%st\(")
EXEMPT_START, EXEMPT_END = "r0_crash_emul", "r0_crash_emul_end"


def sh(args):
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def section_ranges(objdump, elf):
    out = sh([objdump, "-h", elf])
    ranges = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 4 and f[1].startswith(".text.r0"):
            ranges[f[1]] = (int(f[3], 16), int(f[3], 16) + int(f[2], 16))
    return ranges


def main():
    args = sys.argv[1:]
    objdump = "objdump"
    if args[:1] == ["--objdump"]:
        objdump, args = args[1], args[2:]
    elf = args[0]
    ranges = section_ranges(objdump, elf)
    errors = []
    total = 0
    for sec, mode in SECTIONS:
        if sec not in ranges or ranges[sec][0] == ranges[sec][1]:
            errors.append("section %s missing or empty" % sec)
            continue
        dis = sh([objdump, "-d", "-w", "--no-show-raw-insn", "-M", mode, "-j", sec, elf])
        exempt = False
        func = "?"
        for line in dis.splitlines():
            m = re.match(r"^([0-9a-f]+) <(.+)>:$", line)
            if m:
                func = m.group(2)
                # r0_crash_emul is exempt; symbols ending in _data are data
                exempt = func == EXEMPT_START or func.endswith("_data")
                continue
            m = re.match(r"^\s*([0-9a-f]+):\s+(.*)$", line)
            if not m:
                continue
            addr, text = int(m.group(1), 16), m.group(2).strip()
            parts = text.split(None, 1)
            # skip prefixes that objdump prints as separate words
            while parts and parts[0] in ("rep", "repz", "repnz", "repe", "repne", "lock", "data16",
                                         "addr32", "data32", "cs", "ds", "es", "ss", "notrack", "bnd"):
                parts = parts[1].split(None, 1) if len(parts) > 1 else []
            if not parts:
                continue
            total += 1
            mn, ops = parts[0], (parts[1] if len(parts) > 1 else "")
            if exempt:
                continue
            bad = None
            if mn not in ALLOWED and FORBIDDEN_MNEMONIC.match(mn):
                bad = "forbidden instruction"
            elif VECTOR_REG.search(ops):
                bad = "SSE/MMX/x87 register"
            elif mn.startswith(("call", "jmp")) and sec != ".text.r0_16":
                t = re.match(r"^([0-9a-f]+)\b", ops)
                if t:
                    target = int(t.group(1), 16)
                    if not any(lo <= target < hi for lo, hi in ranges.values()):
                        bad = "leaves ring-0 code (target %#x)" % target
            if bad:
                errors.append("%s %#x <%s>: %s: %s" % (sec, addr, func, bad, text))
    for e in errors:
        print("check_r0: " + e, file=sys.stderr)
    if errors:
        print("check_r0: FAILED (%d problems) in %s" % (len(errors), elf), file=sys.stderr)
        return 1
    print("check_r0: %d ring-0 instructions, none forbidden" % total)
    return 0


if __name__ == "__main__":
    sys.exit(main())
