/* Minimal unit-test harness.  Each test binary prints one line per check
 * group: "ok <name>" or "not ok <name>: <why>"; tests/run.sh counts them.
 * Usage:
 *   static void t_foo(struct t *t) { T_CHECK(t, 1 + 1 == 2); }
 *   int main(void) { struct t t = {0}; T_RUN(&t, t_foo); return T_DONE(&t); }
 */
#ifndef KMIG_TEST_HARNESS_H
#define KMIG_TEST_HARNESS_H
#include <stdio.h>

struct t {
	int failed_checks;      /* failed checks in the current test */
	int passed, failed;     /* tests */
};

#define T_CHECK(t, cond) do { \
	if (!(cond)) { \
		if ((t)->failed_checks++ < 5) \
			fprintf(stdout, "#   %s:%d: check failed: %s\n", \
				__FILE__, __LINE__, #cond); \
	} \
} while (0)

#define T_CHECK_EQ(t, a, b) do { \
	long long _a = (long long)(a), _b = (long long)(b); \
	if (_a != _b) { \
		if ((t)->failed_checks++ < 5) \
			fprintf(stdout, "#   %s:%d: %s == %lld, expected %s == %lld\n", \
				__FILE__, __LINE__, #a, _a, #b, _b); \
	} \
} while (0)

#define T_RUN(t, fn) do { \
	(t)->failed_checks = 0; \
	fn(t); \
	if ((t)->failed_checks) { \
		(t)->failed++; \
		printf("not ok %s: %d check(s) failed\n", #fn, (t)->failed_checks); \
	} else { \
		(t)->passed++; \
		printf("ok %s\n", #fn); \
	} \
	fflush(stdout); \
} while (0)

#define T_DONE(t) ((t)->failed ? 1 : 0)

/* xorshift64: the same numbers every run, from any non-zero *state. */
static inline unsigned t_xorshift(unsigned long long *state)
{
	*state ^= *state << 13;
	*state ^= *state >> 7;
	*state ^= *state << 17;
	return (unsigned)*state;
}

#endif
