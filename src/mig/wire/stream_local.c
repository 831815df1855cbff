/* Streams without a connection: exec:, file: and fd: URIs; see stream.h. */
#include "mig/wire/stream.h"
#include "base/timeutil.h"
#include "base/utf8.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define LOCAL_WAIT_SLICE_MS 20

/* The command's standard streams: ours (the pipe's end) on `into`, the
 * other one /dev/null (stdin) or our stderr (stdout), and nothing else of
 * kmig's: no image, tap or KVM descriptor may outlive kmig in it. */
static int local__actions(posix_spawn_file_actions_t *fa, int end, bool out)
{
	int into = out ? 0 : 1;
	int rc = posix_spawn_file_actions_init(fa);
	if (rc)
		return -rc;
	rc = posix_spawn_file_actions_adddup2(fa, end, into);
	if (!rc && out)
		rc = posix_spawn_file_actions_adddup2(fa, 2, 1);
	if (!rc && !out)
		rc = posix_spawn_file_actions_addopen(fa, 0, "/dev/null", O_RDONLY, 0);
	if (!rc)
		rc = posix_spawn_file_actions_addclosefrom_np(fa, 3);
	if (rc)
		posix_spawn_file_actions_destroy(fa);
	return -rc;
}

/* Runs cmd with /bin/sh -c; *fd is our end of the pipe (close-on-exec). */
static int local__spawn(const char *cmd, bool out, int *fd, pid_t *pid, char *err,
			size_t errlen)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC))
		return utf8__err(err, errlen, -errno, "exec: pipe: %s", strerror(errno));
	int ours = out ? p[1] : p[0], theirs = out ? p[0] : p[1];
	posix_spawn_file_actions_t fa;
	int rc = local__actions(&fa, theirs, out);
	/* a process group of its own: a cancel ends the whole pipeline; and
	 * SIGPIPE as a shell expects it (kmig ignores it), no signal blocked */
	posix_spawnattr_t at;
	sigset_t def, none;
	sigemptyset(&def);
	sigaddset(&def, SIGPIPE);
	sigemptyset(&none);
	if (!rc && (rc = -posix_spawnattr_init(&at)))
		posix_spawn_file_actions_destroy(&fa);
	if (!rc) {
		char *argv[] = { "sh", "-c", (char *)cmd, NULL };
		rc = -posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF |
						    POSIX_SPAWN_SETSIGMASK);
		if (!rc)
			rc = -posix_spawnattr_setpgroup(&at, 0);
		if (!rc)
			rc = -posix_spawnattr_setsigdefault(&at, &def);
		if (!rc)
			rc = -posix_spawnattr_setsigmask(&at, &none);
		if (!rc)
			rc = -posix_spawn(pid, "/bin/sh", &fa, &at, argv, environ);
		posix_spawnattr_destroy(&at);
		posix_spawn_file_actions_destroy(&fa);
	}
	close(theirs);
	if (rc) {
		close(ours);
		return utf8__err(err, errlen, rc, "exec: cannot run '%s': %s", cmd, strerror(-rc));
	}
	*fd = ours;
	return 0;
}

/* A file, or a device; not a FIFO or socket, whose open would wait for a
 * peer where no cancel reaches it (exec: and fd: take pipes). */
static int local__open_file(const char *path, bool out, char *err, size_t errlen)
{
	struct stat st;
	int fl = O_CLOEXEC | O_NONBLOCK;
	int fd = out ? open(path, O_WRONLY | O_CREAT | O_TRUNC | fl, 0600) : open(path, O_RDONLY | fl);
	if (fd < 0)
		return utf8__err(err, errlen, -errno, "file: cannot open '%s' for %s: %s", path,
				out ? "writing" : "reading", errno == ENXIO ?
				"a FIFO nobody reads (use exec: or fd: for pipes)" : strerror(errno));
	int rc = fstat(fd, &st) ? -errno : 0;
	if (!rc && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)))
		rc = utf8__err(err, errlen, -EINVAL, "file: '%s' is a FIFO or socket (use exec: "
			       "or fd: for pipes)", path);
	else if (rc || fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) < 0)
		rc = utf8__err(err, errlen, rc ? rc : -errno, "file: '%s': %s", path,
			       strerror(rc ? -rc : errno));
	if (rc) {
		close(fd);
		return rc;
	}
	return fd;
}

int mig_stream__open_local(struct mig_stream *s, const struct mig_uri *u, bool out, int fd,
			   char *err, size_t errlen)
{
	pid_t pid = 0;
	int rc = 0;
	if (u->kind == MIG_URI_EXEC) {
		if (fd >= 0)
			close(fd);
		rc = local__spawn(u->arg, out, &fd, &pid, err, errlen);
	} else if (u->kind == MIG_URI_FILE) {
		if (fd >= 0)
			close(fd);
		fd = local__open_file(u->arg, out, err, errlen);
		rc = fd < 0 ? fd : 0;
	} else if (u->kind != MIG_URI_FD || fd < 0) {
		if (fd >= 0)
			close(fd);
		rc = utf8__err(err, errlen, -EINVAL, "not an exec:, file: or fd: URI");
	}
	if (rc)
		return rc;
	rc = mig_stream__init(s, fd);
	s->child = pid;
	if (rc) {
		mig_stream__reap(s);
		return utf8__err(err, errlen, rc, "out of memory");
	}
	return 0;
}

void mig_stream__reap(struct mig_stream *s)
{
	if (s->child <= 0)
		return;
	int st;
	if (waitpid(s->child, &st, WNOHANG) == 0) {
		kill(-s->child, SIGKILL);       /* its process group */
		while (waitpid(s->child, &st, 0) < 0 && errno == EINTR)
			;
	}
	s->child = 0;
}

/* Waits for exec:'s command to exit: 0 if it exited with status 0. */
static int local__wait_child(struct mig_stream *s, int timeout_ms, const atomic_bool *cancel,
			     char *err, size_t errlen)
{
	uint64_t end = time__now_ms() + (uint64_t)timeout_ms;
	int st = 0;
	pid_t r;
	while ((r = waitpid(s->child, &st, WNOHANG)) == 0) {
		if (cancel && atomic_load(cancel)) {
			mig_stream__reap(s);
			return utf8__err(err, errlen, -ECANCELED, "cancelled");
		}
		if (time__now_ms() >= end) {
			mig_stream__reap(s);
			return utf8__err(err, errlen, -ETIMEDOUT, "exec: the command did not exit "
					"within %d s of the stream's end; killed", timeout_ms / 1000);
		}
		usleep(LOCAL_WAIT_SLICE_MS * 1000);
	}
	if (r < 0 && errno == EINTR)
		return local__wait_child(s, (int)(end - time__now_ms()), cancel, err, errlen);
	s->child = 0;
	if (r < 0)
		return utf8__err(err, errlen, -ECHILD, "exec: waitpid: %s", strerror(errno));
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
		return 0;
	if (WIFEXITED(st))
		return utf8__err(err, errlen, -EIO, "exec: the command exited with status %d",
				WEXITSTATUS(st));
	return utf8__err(err, errlen, -EIO, "exec: the command was killed by signal %d",
			WTERMSIG(st));
}

int mig_stream__finish_local(struct mig_stream *s, int timeout_ms, const atomic_bool *cancel,
			     char *err, size_t errlen)
{
	struct stat st;
	int rc = mig_stream__error(s);
	if (rc)
		return utf8__err(err, errlen, rc, "%s", mig_stream__strerror(s));
	if (s->fd >= 0 && !fstat(s->fd, &st) && S_ISREG(st.st_mode) && fdatasync(s->fd))
		rc = utf8__err(err, errlen, -errno, "file: fdatasync: %s", strerror(errno));
	if (s->fd >= 0 && close(s->fd) && !rc)
		rc = utf8__err(err, errlen, -errno, "close: %s", strerror(errno));
	s->fd = -1;
	if (rc || s->child <= 0)
		return rc;
	return local__wait_child(s, timeout_ms, cancel, err, errlen);
}
