/* Why getopt_long refused an argument, as one line for die_usage().
 * For a getopt_long loop whose optstring begins with ':' (so getopt
 * itself prints nothing), called right after it returned c ('?' or ':'),
 * with optind and optopt as getopt left them and the loop's longopts.
 * Names the option as the user wrote it ("-x", "--frob", "--json" given
 * a value it does not take, "--d" that abbreviates several options) and
 * never another argument: glibc's getopt permutes argv and moves optind
 * on only at the end of a group of short options, so the argument before
 * optind is the refused one only for a long option. */
#ifndef KMIG_CTL_CLIOPT_H
#define KMIG_CTL_CLIOPT_H

#include <getopt.h>
#include <stddef.h>

/* Writes the reason into buf (len > 0) and returns buf. */
const char *cliopt__why(int c, int argc, char *const argv[], const struct option *longopts,
			char *buf, size_t len);

#endif
