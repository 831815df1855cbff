#!/bin/sh
# mkinitrd.sh OUT MEMCHECK [MODS]: the Linux guest's initramfs (gzip'd newc
# cpio): Debian's busybox-static, memcheck, rtcwait (beside MEMCHECK) and
# guest/linux/init; with MODS
# (a directory of kernel modules and their modules.list, in load order:
# scripts/kvm-vm --prepare writes one for Linux's virtio_pci and
# virtio_balloon) also those, which /init loads.
set -eu
out=$1 memcheck=$2 mods=${3:-}
busybox=/bin/busybox
[ -x "$busybox" ] ||
	{ echo "mkinitrd.sh: $busybox missing (Debian package busybox-static)" >&2; exit 1; }
if ldd "$busybox" >/dev/null 2>&1; then
	echo "mkinitrd.sh: $busybox is not static (install busybox-static)" >&2; exit 1
fi
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/bin"
cp "$busybox" "$root/bin/busybox"
cp "$memcheck" "$root/bin/memcheck"
cp "$(dirname "$memcheck")/rtcwait" "$root/bin/rtcwait"
cp "$(dirname "$0")/init" "$root/init"
if [ -n "$mods" ]; then
	mkdir -p "$root/mods"
	for m in $(cat "$mods/modules.list"); do cp "$mods/$m.ko" "$root/mods/"; done
	cp "$mods/modules.list" "$root/mods/"
fi
chmod 755 "$root" "$root/bin" "$root/init" "$root/bin/memcheck" "$root/bin/rtcwait"
(cd "$root" && find . | cpio -o -H newc -R 0:0 --quiet | gzip -1) > "$out.tmp"
mv "$out.tmp" "$out"
