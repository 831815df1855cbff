# kmig's Linux guest userland (included by the top-level Makefile).
# `make linux-guest` builds build/linux/initrd.gz: Debian's busybox-static,
# memcheck (a static C program that dirties and checks memory from Linux
# userspace), rtcwait (waits for the RTC's interrupts), /init (guest/linux/init) and, once scripts/kvm-vm --prepare
# has run, Linux's virtio_pci and virtio_balloon modules.  The kernel is Debian's own,
# unpacked by scripts/kvm-vm --prepare, never installed (docs/guest.md).
LINUX_OUT      := build/linux
LINUX_INITRD   := $(LINUX_OUT)/initrd.gz
LINUX_MEMCHECK := $(LINUX_OUT)/memcheck
LINUX_RTCWAIT  := $(LINUX_OUT)/rtcwait
# Linux's virtio_pci and virtio_balloon from the same kernel package, when
# scripts/kvm-vm --prepare has unpacked them: /init loads them
LINUX_MODS     := $(wildcard $(or $(KMIG_VM_CACHE),/var/cache/kmig/kvm-vm)/guest-mods/modules.list)

linux-guest: $(LINUX_INITRD)
.PHONY: linux-guest

$(LINUX_MEMCHECK): guest/linux/memcheck.c guest/linux/linux.mk
	@mkdir -p $(LINUX_OUT)
	gcc -std=gnu11 -O2 -g -Wall -Wextra -Werror -static -pthread -o $@ $<

$(LINUX_RTCWAIT): guest/linux/rtcwait.c guest/linux/linux.mk
	@mkdir -p $(LINUX_OUT)
	gcc -std=gnu11 -O2 -g -Wall -Wextra -Werror -static -o $@ $<

$(LINUX_INITRD): $(LINUX_MEMCHECK) $(LINUX_RTCWAIT) guest/linux/init guest/linux/mkinitrd.sh $(LINUX_MODS)
	guest/linux/mkinitrd.sh $@ $(LINUX_MEMCHECK) $(dir $(LINUX_MODS))
