#!/usr/bin/env bash
# Installs the Debian packages kmig needs to build, test and benchmark,
# only those that are missing.  Needs root and apt-get.
set -euo pipefail
pkgs=(
  gcc                  # the compiler
  clang                # libFuzzer harnesses (make fuzz; tests/fuzz), with ASan/UBSan
  make                 # the build
  libjansson-dev       # JSON for the QMP control socket
  libzstd-dev          # zstd compression of migration pages
  liblz4-dev           # lz4 compression of migration pages
  zlib1g-dev           # zlib compression of migration pages (QEMU's multifd-compression zlib)
  binutils             # objdump: the guest build scans its ring-0 code
  qemu-system-x86      # test and benchmark peer, runs the same guest ELF
  python3              # test and benchmark drivers
  python3-pytest       # runs the Python test suites (tests/conftest.py)
  python3-pytest-timeout  # a per-test time limit, so a hung test fails instead of hanging CI
  libc6-dev            # static glibc (libc.a) for the Linux guest's memcheck
  cpio                 # scripts/kvm-vm and make linux-guest: pack their initramfs
  busybox-static       # scripts/kvm-vm and make linux-guest: the initramfs's shell and tools
  socat                # talking QMP by hand
  iproute2             # ip netns / veth / tc for shaped-link tests
  libgnutls28-dev      # TLS 1.3 for the migration streams (PSK and X.509)
  uuid-dev             # libuuid: --uuid's parsing and QMP query-uuid's text
  gnutls-bin           # certtool and psktool: the tests' certificates and keys
  libtsan2             # ThreadSanitizer runtime for make TSAN=1 (gcc)
  python3-matplotlib   # bench/report/plot.py: PNG plots of the benchmark results
  liburing-dev         # bench/blkio: the disk backend's micro-benchmark (pool vs io_uring)
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "setup-deps: missing packages: ${missing[*]} (run as root to install)" >&2
  exit 1
fi
echo "setup-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
