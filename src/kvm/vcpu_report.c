/* Guest failure reports: registers and the bytes at RIP. */
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>

#include "kvm/vcpu.h"
#include "kvm/vm.h"

/* Translates a linear address through the guest's 4-level page tables
 * when long-mode paging is on; else linear = physical. */
static uint64_t vcpu__linear_to_gpa(struct vm *vm, const struct kvm_sregs *sr, uint64_t la)
{
	if (!(sr->cr0 & 0x80000000u) || !(sr->efer & 0x400))
		return la;
	uint64_t table = sr->cr3 & 0x000ffffffffff000ull;
	for (int level = 3; level >= 0; level--) {
		uint64_t *e = ram__gpa_to_host(&vm->ram, table + ((la >> (12 + 9 * level)) & 511) * 8, 8);
		if (!e || !(*e & 1))
			return UINT64_MAX;
		uint64_t addr = *e & 0x000ffffffffff000ull;
		if (level > 0 && level < 3 && (*e & 0x80)) {
			uint64_t span = 1ull << (12 + 9 * level);
			return (addr & ~(span - 1)) | (la & (span - 1));
		}
		table = addr;
	}
	return table | (la & 0xfff);
}

void vcpu__report(struct vcpu *v, const char *what)
{
	struct kvm_regs r;
	struct kvm_sregs sr;
	if (ioctl(v->fd, KVM_GET_REGS, &r) < 0 || ioctl(v->fd, KVM_GET_SREGS, &sr) < 0) {
		log_err("vcpu%u: %s (registers unavailable)", v->index, what);
		return;
	}
	log_err("vcpu%u: %s", v->index, what);
	/* kvm_amd INITs the vCPU on a shutdown intercept (the VMCB is undefined
	 * after one) before KVM_EXIT_SHUTDOWN reaches us: the state at the
	 * triple fault is gone.  kmig's guests never run at the reset vector
	 * (no firmware; PVH starts in protected mode), so this state means that. */
	if (r.rip == 0xfff0 && sr.cs.selector == 0xf000 && sr.cs.base == 0xffff0000ull &&
	    !(sr.cr0 & 1))
		log_err("vcpu%u: registers are the vCPU's INIT state: KVM reset it before "
			"returning (kvm_amd does on a triple fault), the state at the failure is lost",
			v->index);
	log_err("vcpu%u: rip=%016llx rsp=%016llx rflags=%08llx rax=%016llx rbx=%016llx",
		v->index, r.rip, r.rsp, r.rflags, r.rax, r.rbx);
	log_err("vcpu%u: rcx=%016llx rdx=%016llx rsi=%016llx rdi=%016llx rbp=%016llx",
		v->index, r.rcx, r.rdx, r.rsi, r.rdi, r.rbp);
	log_err("vcpu%u: cs=%04x(dpl%u l%u) ss=%04x cr0=%llx cr2=%llx cr3=%llx cr4=%llx efer=%llx",
		v->index, sr.cs.selector, sr.cs.dpl, sr.cs.l, sr.ss.selector, sr.cr0, sr.cr2,
		sr.cr3, sr.cr4, sr.efer);
	uint64_t gpa = vcpu__linear_to_gpa(v->vm, &sr, sr.cs.base + r.rip);
	const uint8_t *code = gpa == UINT64_MAX ? NULL : ram__gpa_to_host(&v->vm->ram, gpa, 16);
	if (!code) {
		log_err("vcpu%u: code at rip: not in guest RAM", v->index);
		return;
	}
	char hex[16 * 3 + 1];
	for (int i = 0; i < 16; i++)
		snprintf(hex + 3 * i, 4, "%02x ", code[i]);
	log_err("vcpu%u: code at rip (gpa %llx): %s", v->index, (unsigned long long)gpa, hex);
}
