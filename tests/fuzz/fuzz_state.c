/* libFuzzer harness: the destination's state-section loaders (state__load:
 * vCPU registers, MSRs, XSAVE, irqchip, PIT, clock, serial, RTC, TSC, run state,
 * the balloon) on a VM skeleton whose KVM descriptors are closed: every
 * size, count and range check runs, and what would reach KVM fails there
 * cleanly (EBADF).  Input: sections (u32 id, u8 instance, u16 length,
 * bytes), the version always STATE_VERSION except when id's top bit is set. */
#include <stdlib.h>
#include <string.h>

#include "dev/balloon.h"
#include "kvm/vcpu.h"
#include "kvm/vm.h"
#include "state/state.h"

#define NVCPUS 2

static struct vm *skeleton(void)
{
	static struct vcpu vcpus[NVCPUS];
	struct vm *vm = calloc(1, sizeof(*vm));
	if (!vm || ram__create(&vm->ram, -1, RAM_MIN_SIZE))
		abort();
	vm->kvm_fd = vm->vm_fd = -1;
	vm->nr_vcpus = NVCPUS;
	vm->vcpus = vcpus;
	for (unsigned i = 0; i < NVCPUS; i++) {
		vcpus[i].fd = -1;
		vcpus[i].index = i;
	}
	serial__init(&vm->serial, -1);
	rtc__init(&vm->rtc);
	struct balloon_conf c = { .ram = &vm->ram, .irq_line = BALLOON_IRQ,
				  .bar_gpa = BALLOON_BAR_GPA };
	if (balloon__create(&vm->balloon, &c))
		abort();
	log__set_level(LOG_ERROR);      /* refused MSRs are logged one by one */
	return vm;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct vm *vm;
	if (!vm)
		vm = skeleton();
	vm->tsc_in.valid = false;       /* each input starts a new stream */
	size_t off = 0;
	while (size - off >= 7) {
		uint32_t id;
		uint16_t len;
		memcpy(&id, data + off, 4);
		uint8_t inst = data[off + 4];
		memcpy(&len, data + off + 5, 2);
		off += 7;
		if (len > size - off)
			len = (uint16_t)(size - off);
		uint32_t ver = id & 0x80000000u ? id >> 24 : STATE_VERSION;
		char why[256] = "";
		int rc = state__load(vm, id & 0x7fffffffu, ver, inst, data + off, len, why,
				     sizeof(why));
		if (rc > 0 || (rc && !why[0]))
			abort();        /* 0 or -errno, and a refusal says why */
		off += len;
	}
	return 0;
}
