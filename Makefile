# kmig build.  `make` builds build/kmig; `make guest` the test guest;
# `make test` installs missing packages and runs every test;
# `make SAN=1` builds with ASan + UBSan and the test-only fault hooks
# (src/mig/send/fault.h) into build-san/.
CC      ?= cc
BUILD   ?= build
CFLAGS  := -std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -Isrc -pthread
LDLIBS  := -ljansson -lzstd -llz4 -lz -lgnutls -luuid -pthread -lm
ifeq ($(SAN),1)
BUILD   := build-san
CFLAGS  += -fsanitize=address,undefined -fno-omit-frame-pointer -O1 -DKMIG_FAULTS
LDFLAGS += -fsanitize=address,undefined
endif
# `make TSAN=1` builds with ThreadSanitizer into build-tsan/ (make test
# runs the unit tests and a cut of the migration tests with it)
ifeq ($(TSAN),1)
BUILD   := build-tsan
CFLAGS  += -fsanitize=thread -fno-omit-frame-pointer -O1
LDFLAGS += -fsanitize=thread
endif
# `make fuzz` builds the libFuzzer harnesses (tests/fuzz/) with clang,
# ASan and UBSan into build-fuzz/ and runs each (scripts/fuzz.sh)
ifeq ($(FUZZ),1)
CC      := clang
BUILD   := build-fuzz
CFLAGS  += -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -O1 \
           -Wno-gnu-variable-sized-type-not-at-end
LDFLAGS += -fsanitize=fuzzer,address,undefined
endif
FUZZ_SECONDS ?= 60

SRCS      := $(sort $(wildcard src/*/*.c src/*/*/*.c))
LIB_SRCS  := $(filter-out src/main.c,$(SRCS))
OBJS      := $(patsubst src/%.c,$(BUILD)/obj/%.o,$(SRCS) src/main.c)
LIB_OBJS  := $(patsubst src/%.c,$(BUILD)/obj/%.o,$(LIB_SRCS))
UNIT_SRCS := $(sort $(wildcard tests/unit/test_*.c))
UNIT_BINS := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(UNIT_SRCS))
KVM_TEST_BINS := $(patsubst tests/kvm/%.c,$(BUILD)/tests/test_kvm_%,$(wildcard tests/kvm/*.c))
FUZZ_BINS := $(patsubst tests/fuzz/%.c,$(BUILD)/fuzz/%,$(wildcard tests/fuzz/fuzz_*.c))
# the fake virtio-pci driver (tests/unit/vdrv.h), linked into every unit
# test and fuzz harness
VDRV_OBJ  := $(BUILD)/obj/tests/vdrv.o

.PHONY: all guest test test-full unit deps demo bench clean fuzz fuzz-bins soak chaos
all: $(BUILD)/kmig

$(BUILD)/kmig: $(OBJS)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/obj/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c -o $@ $<

$(VDRV_OBJ): tests/unit/vdrv.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c -o $@ $<

$(BUILD)/tests/%: tests/unit/%.c $(LIB_OBJS) $(VDRV_OBJ) $(wildcard tests/unit/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit $(LDFLAGS) -o $@ $< $(LIB_OBJS) $(VDRV_OBJ) $(LDLIBS)

$(BUILD)/tests/test_kvm_%: tests/kvm/%.c $(LIB_OBJS) tests/unit/harness.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit $(LDFLAGS) -o $@ $< $(LIB_OBJS) $(LDLIBS)

unit: $(UNIT_BINS) $(KVM_TEST_BINS)

$(BUILD)/fuzz/%: tests/fuzz/%.c $(LIB_OBJS) $(VDRV_OBJ) tests/unit/vdrv.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit $(LDFLAGS) -o $@ $< $(LIB_OBJS) $(VDRV_OBJ) $(LDLIBS)

fuzz-bins: $(FUZZ_BINS)

fuzz: deps
	$(MAKE) FUZZ=1 fuzz-bins
	scripts/fuzz.sh $(FUZZ_SECONDS)

deps:
	@scripts/setup-deps.sh

# the builds use every core (JOBS); the tests run after them
JOBS ?= $(shell nproc)
test: deps
	$(MAKE) -j$(JOBS) all guest linux-guest unit
	$(MAKE) -j$(JOBS) SAN=1 all unit
	$(MAKE) -j$(JOBS) TSAN=1 all unit
	$(MAKE) -j$(JOBS) FUZZ=1 fuzz-bins
	tests/run.sh $(BUILD)

# every case of the verification matrix (tests/e2e/test_matrix.py) and the
# tests marked slow, also under emulation
test-full:
	KMIG_TEST_FULL=1 KMIG_TEST_ALL=1 $(MAKE) test

# SOAK_N migrations of one verify guest with x-verify (scripts/soak.py);
# inside scripts/kvm-vm where /dev/kvm is missing
SOAK_N ?= 500
soak: deps
	$(MAKE) all guest
	if [ -c /dev/kvm ]; then scripts/soak.py -n $(SOAK_N); \
	else scripts/kvm-vm --timeout 86400 -- scripts/soak.py -n $(SOAK_N); fi

# CHAOS_N migrations of one guest, each broken by a random fault
# (scripts/chaos.py; CHAOS_SEED replays a run); inside scripts/kvm-vm
# where /dev/kvm is missing
CHAOS_N ?= 200
CHAOS_SEED ?=
chaos: deps
	$(MAKE) all guest
	if [ -c /dev/kvm ]; then scripts/chaos.py -n $(CHAOS_N) $(if $(CHAOS_SEED),--seed $(CHAOS_SEED)); \
	else scripts/kvm-vm --timeout 86400 -- scripts/chaos.py -n $(CHAOS_N) \
		$(if $(CHAOS_SEED),--seed $(CHAOS_SEED)); fi

demo: deps
	$(MAKE) all guest
	if [ -r /dev/kvm ] && [ -w /dev/kvm ]; then scripts/demo.sh; \
	else echo "== no /dev/kvm here: the demo runs inside scripts/kvm-vm, a VM whose KVM is a" \
		"real x86 one under emulation (slow: expect minutes, not seconds)"; \
		DEMO_IN_VM=1 scripts/kvm-vm --timeout 1200 --env DEMO_IN_VM -- scripts/demo.sh; fi

clean:
	rm -rf build build-san build-fuzz

-include guest/guest.mk
-include guest/linux/linux.mk
-include $(OBJS:.o=.d) $(VDRV_OBJ:.o=.d)
