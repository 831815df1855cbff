/* Logging to stderr, one line per call, prefixed with "kmig: ".
 * Thread-safe (a single write(2) per line).  die() and die_usage() are
 * only for start-up paths: they print and exit, die() with status 1 (a bad
 * value, options that cannot go together, a file that cannot be read),
 * die_usage() with status 2 (the command's form is wrong: an unknown
 * option, a missing option argument, a missing or stray operand, a
 * required option left out). */
#ifndef KMIG_BASE_LOG_H
#define KMIG_BASE_LOG_H

#define KMIG_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define KMIG_MUST_CHECK __attribute__((warn_unused_result))

enum log_level { LOG_ERROR, LOG_WARN, LOG_INFO, LOG_DEBUG };

/* Lines above this level are dropped; default LOG_INFO.  Set once at start. */
void log__set_level(enum log_level level);
void log__msg(enum log_level level, const char *fmt, ...) KMIG_PRINTF(2, 3);
__attribute__((noreturn)) void die(const char *fmt, ...) KMIG_PRINTF(1, 2);
__attribute__((noreturn)) void die_usage(const char *fmt, ...) KMIG_PRINTF(1, 2);

#define log_err(...)   log__msg(LOG_ERROR, __VA_ARGS__)
#define log_warn(...)  log__msg(LOG_WARN, __VA_ARGS__)
#define log_info(...)  log__msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log__msg(LOG_DEBUG, __VA_ARGS__)

#endif
