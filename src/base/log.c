#include "base/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static _Atomic int log_level = LOG_INFO; /* process-wide verbosity setting */

void log__set_level(enum log_level level)
{
	log_level = level;
}

static void log__vmsg(const char *prefix, const char *fmt, va_list ap)
{
	char line[1024];
	int n = snprintf(line, sizeof(line), "kmig: %s", prefix);
	if (n < 0 || n >= (int)sizeof(line))
		return;
	int m = vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
	if (m < 0)
		return;
	n += m;
	if (n > (int)sizeof(line) - 2)
		n = sizeof(line) - 2;
	line[n++] = '\n';
	ssize_t w = write(STDERR_FILENO, line, n);
	(void)w;
}

void log__msg(enum log_level level, const char *fmt, ...)
{
	static const char *const prefix[] = { "error: ", "warning: ", "", "debug: " };
	if ((int)level > log_level)
		return;
	va_list ap;
	va_start(ap, fmt);
	log__vmsg(prefix[level], fmt, ap);
	va_end(ap);
}

__attribute__((noreturn)) static void log__vdie(int status, const char *fmt, va_list ap)
{
	log__vmsg("error: ", fmt, ap);
	exit(status);
}

void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log__vdie(1, fmt, ap);
}

void die_usage(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log__vdie(2, fmt, ap);
}
