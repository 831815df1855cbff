/* cliopt__why: getopt_long's refusals named as the user wrote them. */
#include <getopt.h>
#include <string.h>

#include "ctl/cliopt.h"
#include "harness.h"

static const struct option opts[] = {
	{ "bandwidth", required_argument, 0, 'b' }, { "downtime", required_argument, 0, 'd' },
	{ "dirty-limit", required_argument, 0, 'L' }, { "json", no_argument, 0, 'j' },
	{ "verify", no_argument, 0, 'V' }, { "xbzrle", required_argument, 0, 'x' },
	{ 0, 0, 0, 0 },
};

/* Parses args (NULL-ended, after the program's name) with ":S" as
 * kmig's loops do; the reason of the first refusal, or "" if none. */
static const char *first_refusal(const char *const *args, char *buf, size_t len)
{
	char *argv[16] = { "kmig" };
	int argc = 1;
	while (*args && argc < 15)
		argv[argc++] = (char *)*args++;
	argv[argc] = NULL;
	optind = 0;     /* glibc: start again from scratch */
	int c;
	buf[0] = 0;
	while ((c = getopt_long(argc, argv, ":S", opts, NULL)) != -1)
		if (c == '?' || c == ':')
			return cliopt__why(c, argc, argv, opts, buf, len);
	return buf;
}

static void t_names(struct t *t)
{
	static const struct { const char *args[6]; const char *why; } tab[] = {
		{ { "--frob", "uri" }, "unknown option: --frob" },
		{ { "--frob=3", "uri" }, "unknown option: --frob" },
		{ { "--d", "5" }, "ambiguous option: --d (the start of 2 options' names)" },
		{ { "--json=1" }, "--json takes no argument" },
		{ { "--js=1" }, "--js takes no argument" },
		{ { "uri", "--bandwidth" }, "--bandwidth: missing argument" },
		{ { "-xy", "uri" }, "unknown option: -x" },
		{ { "--verify", "-xy" }, "unknown option: -x" },
		{ { "--xbzrle=64", "-Sq" }, "unknown option: -q" },
		{ { "uri", "-S", "-Sx" }, "unknown option: -x" },
		{ { "--band", "5", "uri" }, "" },
		{ { "--", "--frob" }, "" },
	};
	char buf[160];
	for (size_t i = 0; i < sizeof(tab) / sizeof(tab[0]); i++) {
		const char *got = first_refusal(tab[i].args, buf, sizeof(buf));
		if (strcmp(got, tab[i].why))
			printf("#   case %zu: got \"%s\", want \"%s\"\n", i, got, tab[i].why);
		T_CHECK(t, !strcmp(got, tab[i].why));
	}
}

static void t_short_buffer(struct t *t)
{
	const char *args[] = { "--a-very-long-unknown-option-name", NULL };
	char buf[8];
	T_CHECK(t, strlen(first_refusal(args, buf, sizeof(buf))) == sizeof(buf) - 1);
}

int main(void)
{
	struct t t = { 0 };
	T_RUN(&t, t_names);
	T_RUN(&t, t_short_buffer);
	return T_DONE(&t);
}
