/* Named descriptors (QMP getfd); see fdnames.h. */
#include "ctl/fdnames.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

int fd_names__check(const char *name, const char **why)
{
	size_t len = strlen(name);
	*why = NULL;
	if (!len)
		*why = "an empty name";
	else if (len >= FD_NAMES_NAME_MAX)
		*why = "a name too long (max 63 bytes)";
	else if (name[0] >= '0' && name[0] <= '9')
		*why = "a name not starting with a digit";
	for (size_t i = 0; !*why && i < len; i++)
		if ((unsigned char)name[i] <= ' ' || (unsigned char)name[i] >= 0x7f)
			*why = "a name of printable ASCII without spaces";
	return *why ? -EINVAL : 0;
}

static int fd_names__find(const struct fd_names *t, const char *name)
{
	for (int i = 0; i < FD_NAMES_MAX; i++)
		if (t->slot[i].used && !strcmp(t->slot[i].name, name))
			return i;
	return -ENOENT;
}

int fd_names__put(struct fd_names *t, const char *name, int fd)
{
	const char *why;
	if (fd_names__check(name, &why))
		return -EINVAL;
	int i = fd_names__find(t, name);
	if (i >= 0) {
		close(t->slot[i].fd);
		t->slot[i].fd = fd;
		return 0;
	}
	for (i = 0; i < FD_NAMES_MAX && t->slot[i].used; i++)
		;
	if (i == FD_NAMES_MAX)
		return -ENOSPC;
	t->slot[i].used = true;
	t->slot[i].fd = fd;
	strcpy(t->slot[i].name, name);
	return 0;
}

int fd_names__take(struct fd_names *t, const char *name)
{
	int i = fd_names__find(t, name);
	if (i < 0)
		return i;
	t->slot[i].used = false;
	return t->slot[i].fd;
}

int fd_names__close(struct fd_names *t, const char *name)
{
	int fd = fd_names__take(t, name);
	if (fd < 0)
		return fd;
	close(fd);
	return 0;
}

void fd_names__destroy(struct fd_names *t)
{
	for (int i = 0; i < FD_NAMES_MAX; i++)
		if (t->slot[i].used)
			close(t->slot[i].fd);
	memset(t, 0, sizeof(*t));
}
