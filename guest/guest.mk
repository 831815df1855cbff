# The kmig test guest (included by the top-level Makefile).
# `make guest` builds build/guest/kmig-guest.elf and fails if ring-0 code
# contains an instruction kvm_pvm cannot emulate (guest/check_r0.py).
GUEST_OUT    := build/guest
GUEST_ELF    := $(GUEST_OUT)/kmig-guest.elf
GUEST_CC     ?= gcc
GUEST_COMMON := -O2 -g -Wall -Wextra -Werror -ffreestanding -nostdlib -fno-pic -fno-pie \
                -static -mno-red-zone -mcmodel=small -fno-stack-protector \
                -fcf-protection=none -fno-asynchronous-unwind-tables \
                -fno-tree-loop-distribute-patterns -fno-omit-frame-pointer -Iguest
GUEST_CFLAGS := -std=gnu11 $(GUEST_COMMON)
# Ring-0 C: integer registers only.
GUEST_R0_CFLAGS := $(GUEST_CFLAGS) -mgeneral-regs-only -fno-tree-vectorize
GUEST_LDFLAGS := -nostdlib -static -no-pie -Wl,--build-id=none -Wl,-z,max-page-size=4096 \
                 -Wl,--no-warn-rwx-segments -Wl,-z,noexecstack
GUEST_C      := main.c lib.c work.c verify.c palloc.c virtio.c balloon.c net.c blk.c
GUEST_S      := entry.S pagetables.S
GUEST_OBJS   := $(patsubst %.c,$(GUEST_OUT)/%.o,$(GUEST_C)) \
                $(patsubst %.S,$(GUEST_OUT)/%.o,$(GUEST_S)) $(GUEST_OUT)/r0_fault.o
GUEST_HDRS   := guest/guest.h guest/layout.h guest/virtio.h

guest: $(GUEST_ELF)
.PHONY: guest guest-clean

$(GUEST_OUT)/%.o: guest/%.c $(GUEST_HDRS) guest/guest.mk
	@mkdir -p $(GUEST_OUT)
	$(GUEST_CC) $(GUEST_CFLAGS) -c -o $@ $<

$(GUEST_OUT)/r0_fault.o: guest/r0_fault.c $(GUEST_HDRS) guest/guest.mk
	@mkdir -p $(GUEST_OUT)
	$(GUEST_CC) $(GUEST_R0_CFLAGS) -c -o $@ $<

$(GUEST_OUT)/%.o: guest/%.S guest/layout.h guest/guest.mk
	@mkdir -p $(GUEST_OUT)
	$(GUEST_CC) $(GUEST_COMMON) -c -o $@ $<

$(GUEST_OUT)/kmig-guest.ld: guest/kmig-guest.ld.S guest/layout.h
	@mkdir -p $(GUEST_OUT)
	$(GUEST_CC) -E -P -x c -Iguest -o $@ $<

$(GUEST_ELF): $(GUEST_OBJS) $(GUEST_OUT)/kmig-guest.ld guest/check_r0.py
	$(GUEST_CC) $(GUEST_LDFLAGS) -T $(GUEST_OUT)/kmig-guest.ld -o $@.tmp $(GUEST_OBJS)
	python3 guest/check_r0.py $@.tmp
	mv $@.tmp $@

guest-clean:
	rm -rf $(GUEST_OUT)
