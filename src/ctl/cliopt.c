#include "ctl/cliopt.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* How many of longopts begin with the name's first n characters; *exact:
 * one of them is the name itself; *noarg_val: the val of a match that
 * takes no argument (0 if none). */
static int cliopt__matches(const struct option *longopts, const char *name, size_t n,
			   bool *exact, int *noarg_val)
{
	int count = 0;
	*exact = false;
	*noarg_val = 0;
	for (const struct option *o = longopts; o && o->name; o++) {
		if (strncmp(o->name, name, n))
			continue;
		count++;
		*exact |= strlen(o->name) == n;
		if (o->has_arg == no_argument)
			*noarg_val = o->val;
	}
	return count;
}

const char *cliopt__why(int c, int argc, char *const argv[], const struct option *longopts,
			char *buf, size_t len)
{
	const char *prev = optind >= 1 && optind <= argc ? argv[optind - 1] : "";
	bool is_long = !strncmp(prev, "--", 2) && prev[2];
	int n = is_long ? (int)strcspn(prev, "=") : 0;  /* "--name" without "=value" */
	bool exact;
	int noarg_val;
	int matches = is_long ? cliopt__matches(longopts, prev + 2, (size_t)n - 2, &exact,
						&noarg_val) : 0;
	if (!optopt) {          /* a long option that is none of them, or several */
		if (matches > 1 && !exact)
			snprintf(buf, len, "ambiguous option: %.*s (the start of %d options' names)",
				 n, prev, matches);
		else
			snprintf(buf, len, "unknown option: %.*s", n, prev);
	} else if (c == ':') {
		if (is_long)
			snprintf(buf, len, "%.*s: missing argument", n, prev);
		else
			snprintf(buf, len, "-%c: missing argument", optopt);
	} else if (is_long && prev[n] == '=' && noarg_val == optopt) {
		snprintf(buf, len, "%.*s takes no argument", n, prev);
	} else {                /* a letter of a group of short options */
		snprintf(buf, len, "unknown option: -%c", optopt);
	}
	return buf;
}
