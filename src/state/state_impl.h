/* Internals of the state module. */
#ifndef KMIG_STATE_STATE_IMPL_H
#define KMIG_STATE_STATE_IMPL_H

#include <stdbool.h>

#include "state/state.h"

struct vcpu;

#define STATE_MAX_MSRS 256

bool state__has(struct vm *vm, int cap);
int state__save_xsave(struct vm *vm, struct vcpu *v, state_put_fn put, void *ctx);
int state__save_msrs(struct vm *vm, struct vcpu *v, state_put_fn put, void *ctx);
int state__load_msrs(struct vcpu *v, const void *data, size_t len, char *why, size_t whylen);

#endif
