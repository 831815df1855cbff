#!/bin/sh
# mkinitrd.sh OUT MEMCHECK: the Linux guest's initramfs (gzip'd newc cpio):
# Debian's busybox-static, memcheck and guest/linux/init.
set -eu
out=$1 memcheck=$2
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
cp "$(dirname "$0")/init" "$root/init"
chmod 755 "$root" "$root/bin" "$root/init" "$root/bin/memcheck"
(cd "$root" && find . | cpio -o -H newc -R 0:0 --quiet | gzip -1) > "$out.tmp"
mv "$out.tmp" "$out"
