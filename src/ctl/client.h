/* A small blocking QMP client for `kmig migrate`: connects to a VM's
 * control socket, negotiates, runs commands.  Single-threaded. */
#ifndef KMIG_CTL_CLIENT_H
#define KMIG_CTL_CLIENT_H

#include <jansson.h>
#include <stddef.h>

#include "base/log.h"

struct qmp_client {
	int fd;
	char buf[65536];
	size_t len;
};

/* path: the socket path (without "unix:").  err gets a reason. */
int qmp_client__connect(struct qmp_client *c, const char *path, char *err, size_t errlen) KMIG_MUST_CHECK;
void qmp_client__close(struct qmp_client *c);
/* Runs one command (args may be NULL; stolen).  Returns the "return"
 * value (new reference) or NULL with err set to the QMP error. */
json_t *qmp_client__call(struct qmp_client *c, const char *cmd, json_t *args, char *err, size_t errlen);

/* `kmig migrate` (argv without the program name). */
int client__migrate_main(int argc, char **argv);

#endif
