# kmig build.  `make` builds build/kmig; `make guest` the test guest;
# `make test` installs missing packages and runs every test;
# `make SAN=1` builds with ASan + UBSan.
CC      ?= cc
BUILD   ?= build
CFLAGS  := -std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -Isrc -pthread
LDLIBS  := -ljansson -lzstd -llz4 -pthread -lm
ifeq ($(SAN),1)
BUILD   := build-san
CFLAGS  += -fsanitize=address,undefined -fno-omit-frame-pointer -O1
LDFLAGS += -fsanitize=address,undefined
endif

SRCS      := $(sort $(wildcard src/*/*.c))
LIB_SRCS  := $(filter-out src/main.c,$(SRCS))
OBJS      := $(patsubst src/%.c,$(BUILD)/obj/%.o,$(SRCS) src/main.c)
LIB_OBJS  := $(patsubst src/%.c,$(BUILD)/obj/%.o,$(LIB_SRCS))
UNIT_SRCS := $(sort $(wildcard tests/unit/test_*.c))
UNIT_BINS := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(UNIT_SRCS))
KVM_TEST_BINS := $(patsubst tests/kvm/%.c,$(BUILD)/tests/test_kvm_%,$(wildcard tests/kvm/*.c))

.PHONY: all guest test unit deps demo bench clean
all: $(BUILD)/kmig

$(BUILD)/kmig: $(OBJS)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/obj/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c -o $@ $<

$(BUILD)/tests/%: tests/unit/%.c $(LIB_OBJS) tests/unit/harness.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit $(LDFLAGS) -o $@ $< $(LIB_OBJS) $(LDLIBS)

$(BUILD)/tests/test_kvm_%: tests/kvm/%.c $(LIB_OBJS) tests/unit/harness.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit $(LDFLAGS) -o $@ $< $(LIB_OBJS) $(LDLIBS)

unit: $(UNIT_BINS) $(KVM_TEST_BINS)

deps:
	@scripts/setup-deps.sh

test: deps
	$(MAKE) all guest unit
	tests/run.sh $(BUILD)

demo: deps
	$(MAKE) all guest
	scripts/demo.sh

clean:
	rm -rf build build-san

-include guest/guest.mk
-include $(OBJS:.o=.d)
