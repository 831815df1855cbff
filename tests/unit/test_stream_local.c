/* Unit tests of the streams without a connection (exec:, file:, fd:) and
 * of getfd's table of named descriptors: real pipes, files and /bin/sh
 * commands, no KVM. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/timeutil.h"
#include "ctl/fdnames.h"
#include "harness.h"
#include "mig/wire/stream.h"

#define DATA_LEN (3u << 20)     /* more than a pipe and the stream's buffer hold */

static char tmpdir[64];

static void fill(uint8_t *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (uint8_t)((i * 131u + seed) ^ (i >> 12));
}

static int open_uri(struct mig_stream *s, const char *uri, bool out, int fd)
{
	struct mig_uri u;
	char err[256];
	int rc = mig_uri__parse(uri, &u, err, sizeof(err));
	if (!rc)
		rc = mig_stream__open_local(s, &u, out, fd, err, sizeof(err));
	if (rc)
		printf("#   %s: %s\n", uri, err);
	return rc;
}

/* Writes n bytes as records of PAGES-like sizes, then finishes. */
static int send_all(struct mig_stream *s, const uint8_t *b, size_t n, char *err, size_t len)
{
	for (size_t off = 0; off < n; off += 4096)
		if (mig_stream__write(s, b + off, n - off < 4096 ? n - off : 4096))
			break;
	int rc = mig_stream__flush(s);
	if (rc)
		return snprintf(err, len, "%s", mig_stream__strerror(s)), rc;
	return mig_stream__finish_local(s, 10000, NULL, err, len);
}

static int read_back(struct mig_stream *s, uint8_t *b, size_t n)
{
	int rc = mig_stream__read_full(s, b, n);
	uint8_t extra;
	/* and nothing after it: EOF */
	if (!rc && mig_stream__read_full(s, &extra, 1) != -ECONNRESET)
		rc = -EPROTO;
	return rc;
}

/* file: and exec: out, then file:, exec: and fd: back in: every byte. */
static void t_roundtrip(struct t *t)
{
	uint8_t *data = malloc(DATA_LEN), *back = malloc(DATA_LEN);
	char uri[256], err[256], path[128];
	struct mig_stream s;
	fill(data, DATA_LEN, 7);
	snprintf(path, sizeof(path), "%s/a.mig", tmpdir);
	snprintf(uri, sizeof(uri), "file:%s", path);
	T_CHECK_EQ(t, open_uri(&s, uri, true, -1), 0);
	T_CHECK(t, !mig_stream__two_way(&s));
	T_CHECK_EQ(t, send_all(&s, data, DATA_LEN, err, sizeof(err)), 0);
	mig_stream__close(&s);
	struct stat st;
	T_CHECK(t, stat(path, &st) == 0 && st.st_size == DATA_LEN && (st.st_mode & 0777) == 0600);
	memset(back, 0, DATA_LEN);
	T_CHECK_EQ(t, open_uri(&s, uri, false, -1), 0);
	T_CHECK_EQ(t, read_back(&s, back, DATA_LEN), 0);
	T_CHECK(t, !memcmp(data, back, DATA_LEN));
	mig_stream__close(&s);

	/* exec: out through a command into a second file, exec: back */
	snprintf(uri, sizeof(uri), "exec:cat > %s/b.mig", tmpdir);
	T_CHECK_EQ(t, open_uri(&s, uri, true, -1), 0);
	T_CHECK(t, s.child > 0 && s.is_pipe);
	T_CHECK_EQ(t, send_all(&s, data, DATA_LEN, err, sizeof(err)), 0);
	T_CHECK_EQ(t, s.child, 0);      /* waited for */
	mig_stream__close(&s);
	snprintf(uri, sizeof(uri), "exec:cat %s/b.mig", tmpdir);
	memset(back, 0, DATA_LEN);
	T_CHECK_EQ(t, open_uri(&s, uri, false, -1), 0);
	T_CHECK_EQ(t, read_back(&s, back, DATA_LEN), 0);
	T_CHECK(t, !memcmp(data, back, DATA_LEN));
	mig_stream__close(&s);

	/* fd: a descriptor the caller resolved */
	int fd = open(path, O_RDONLY);
	memset(back, 0, DATA_LEN);
	T_CHECK_EQ(t, open_uri(&s, "fd:mig", false, fd), 0);
	T_CHECK_EQ(t, read_back(&s, back, DATA_LEN), 0);
	T_CHECK(t, !memcmp(data, back, DATA_LEN));
	mig_stream__close(&s);
	free(data);
	free(back);
}

/* A command that fails is a failed end, whatever its stdin took; one that
 * cannot start (no such file) fails at its exit status too. */
static void t_exec_status(struct t *t)
{
	uint8_t buf[4096] = { 1 };
	char err[256] = "";
	struct mig_stream s;
	T_CHECK_EQ(t, open_uri(&s, "exec:cat > /dev/null; exit 3", true, -1), 0);
	T_CHECK_EQ(t, send_all(&s, buf, sizeof(buf), err, sizeof(err)), -EIO);
	T_CHECK(t, strstr(err, "status 3") != NULL);
	mig_stream__close(&s);
	T_CHECK_EQ(t, open_uri(&s, "exec:kill -9 $$", true, -1), 0);
	T_CHECK(t, send_all(&s, buf, sizeof(buf), err, sizeof(err)) < 0);
	mig_stream__close(&s);
	/* reading from a command that writes nothing: EOF, not a hang */
	T_CHECK_EQ(t, open_uri(&s, "exec:true", false, -1), 0);
	T_CHECK_EQ(t, mig_stream__read_full(&s, buf, 1), -ECONNRESET);
	mig_stream__close(&s);
	/* a file that cannot be created */
	struct mig_uri u;
	T_CHECK_EQ(t, mig_uri__parse("file:/nonexistent-dir/x", &u, err, sizeof(err)), 0);
	T_CHECK_EQ(t, mig_stream__open_local(&s, &u, true, -1, err, sizeof(err)), -ENOENT);
	T_CHECK(t, strstr(err, "/nonexistent-dir/x") != NULL);
}

/* The command sees none of our descriptors but its stdin/stdout/stderr. */
static void t_exec_no_leak(struct t *t)
{
	char uri[256], path[128], line[64] = "";
	int keep = open("/dev/null", O_RDONLY); /* not close-on-exec: must still not leak */
	snprintf(path, sizeof(path), "%s/fds", tmpdir);
	snprintf(uri, sizeof(uri), "exec:ls /proc/self/fd | wc -l > %s", path);
	struct mig_stream s;
	char err[256];
	T_CHECK_EQ(t, open_uri(&s, uri, true, -1), 0);
	T_CHECK_EQ(t, mig_stream__finish_local(&s, 10000, NULL, err, sizeof(err)), 0);
	mig_stream__close(&s);
	FILE *f = fopen(path, "r");
	T_CHECK(t, f && fgets(line, sizeof(line), f));
	if (f)
		fclose(f);
	/* 0, 1, 2 and ls's own directory descriptor */
	T_CHECK_EQ(t, atoi(line), 4);
	close(keep);
}

struct stalled {
	struct mig_stream *s;
	int rc;
	uint64_t done_ms;
};

static void *stalled_writer(void *arg)
{
	struct stalled *w = arg;
	static uint8_t buf[1 << 20];
	w->rc = 0;
	for (int i = 0; i < 64 && !w->rc; i++)
		w->rc = mig_stream__write(w->s, buf, sizeof(buf));
	if (!w->rc)
		w->rc = mig_stream__flush(w->s);
	w->done_ms = time__now_ms();
	return NULL;
}

/* A command that never reads: the write blocks until a shutdown (a
 * migrate_cancel), which ends it within the pipe's poll slice; the command
 * is then killed and reaped by close. */
static void t_exec_stall_cancel(struct t *t)
{
	struct mig_stream s;
	T_CHECK_EQ(t, open_uri(&s, "exec:sleep 60", true, -1), 0);
	struct stalled w = { .s = &s };
	pthread_t th;
	pthread_create(&th, NULL, stalled_writer, &w);
	usleep(300 * 1000);
	T_CHECK_EQ(t, w.done_ms, 0);    /* still blocked: nobody reads */
	uint64_t t0 = time__now_ms();
	mig_stream__shutdown(&s);
	pthread_join(th, NULL);
	T_CHECK_EQ(t, w.rc, -ECANCELED);
	T_CHECK(t, w.done_ms - t0 < 1000);
	pid_t child = s.child;
	t0 = time__now_ms();
	mig_stream__close(&s);
	T_CHECK(t, time__now_ms() - t0 < 2000);
	T_CHECK(t, child > 0 && kill(child, 0) < 0 && errno == ESRCH);  /* gone and reaped */
	/* a reader of a silent command ends on shutdown too, also under a
	 * read deadline (which must not outlast the shutdown) */
	T_CHECK_EQ(t, open_uri(&s, "exec:sleep 60", false, -1), 0);
	mig_stream__shutdown(&s);
	uint8_t b;
	T_CHECK_EQ(t, mig_stream__read_full(&s, &b, 1), -ECANCELED);
	mig_stream__close(&s);
	T_CHECK_EQ(t, open_uri(&s, "exec:sleep 60", false, -1), 0);
	mig_stream__set_read_deadline(&s, time__now_ms() + 5000);
	t0 = time__now_ms();
	atomic_store(&s.shut, true);    /* the flag alone, as a shutdown racing the read */
	T_CHECK_EQ(t, mig_stream__read_full(&s, &b, 1), -ECANCELED);
	T_CHECK(t, time__now_ms() - t0 < 2000);
	mig_stream__close(&s);
}

/* file: never opens a FIFO (its open would wait for a peer, beyond any
 * cancel): refused both ways, at once. */
static void t_file_fifo(struct t *t)
{
	char path[128], uri[160], err[256];
	struct mig_uri u;
	struct mig_stream s;
	snprintf(path, sizeof(path), "%s/fifo", tmpdir);
	snprintf(uri, sizeof(uri), "file:%s", path);
	T_CHECK_EQ(t, mkfifo(path, 0600), 0);
	T_CHECK_EQ(t, mig_uri__parse(uri, &u, err, sizeof(err)), 0);
	uint64_t t0 = time__now_ms();
	T_CHECK_EQ(t, mig_stream__open_local(&s, &u, true, -1, err, sizeof(err)), -ENXIO);
	T_CHECK(t, strstr(err, "FIFO") != NULL);
	T_CHECK_EQ(t, mig_stream__open_local(&s, &u, false, -1, err, sizeof(err)), -EINVAL);
	T_CHECK(t, strstr(err, "FIFO") != NULL);
	T_CHECK(t, time__now_ms() - t0 < 1000);
	/* a device is fine: a save into /dev/null */
	T_CHECK_EQ(t, mig_uri__parse("file:/dev/null", &u, err, sizeof(err)), 0);
	T_CHECK_EQ(t, mig_stream__open_local(&s, &u, true, -1, err, sizeof(err)), 0);
	T_CHECK_EQ(t, mig_stream__write(&s, "x", 1), 0);
	T_CHECK_EQ(t, mig_stream__flush(&s), 0);
	T_CHECK_EQ(t, mig_stream__finish_local(&s, 1000, NULL, err, sizeof(err)), 0);
	mig_stream__close(&s);
}

/* The finish's wait for the command ends on the cancel flag. */
static void t_exec_wait_cancel(struct t *t)
{
	struct mig_stream s;
	char err[256];
	atomic_bool cancel = true;
	T_CHECK_EQ(t, open_uri(&s, "exec:exec 0<&-; sleep 60", true, -1), 0);
	uint64_t t0 = time__now_ms();
	T_CHECK_EQ(t, mig_stream__finish_local(&s, 30000, &cancel, err, sizeof(err)), -ECANCELED);
	T_CHECK(t, time__now_ms() - t0 < 1000);
	T_CHECK_EQ(t, s.child, 0);
	mig_stream__close(&s);
}

/* A socket's fd: keeps its way back; nothing is answered on a pipe. */
static void t_two_way(struct t *t)
{
	int sv[2], p[2];
	struct mig_stream s;
	T_CHECK_EQ(t, socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	T_CHECK_EQ(t, open_uri(&s, "fd:sock", true, sv[0]), 0);
	T_CHECK(t, mig_stream__two_way(&s));
	mig_stream__close(&s);
	close(sv[1]);
	T_CHECK_EQ(t, pipe(p), 0);
	T_CHECK_EQ(t, open_uri(&s, "fd:pipe", true, p[1]), 0);
	T_CHECK(t, !mig_stream__two_way(&s));
	uint8_t buf[64];
	const uint8_t *payload;
	struct proto_hdr h;
	T_CHECK_EQ(t, mig_stream__peek_answer(&s, 100, &h, &payload, buf, sizeof(buf)), 0);
	mig_stream__close(&s);
	close(p[0]);
}

static void t_fd_names(struct t *t)
{
	struct fd_names n = { 0 };
	const char *why;
	int fds[FD_NAMES_MAX + 1];
	for (int i = 0; i <= FD_NAMES_MAX; i++)
		fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
	T_CHECK_EQ(t, fd_names__check("9lives", &why), -EINVAL);
	T_CHECK(t, why && strstr(why, "digit"));
	T_CHECK_EQ(t, fd_names__check("", &why), -EINVAL);
	T_CHECK_EQ(t, fd_names__check("a b", &why), -EINVAL);
	T_CHECK_EQ(t, fd_names__check("mig-0", &why), 0);
	T_CHECK_EQ(t, fd_names__put(&n, "1x", fds[0]), -EINVAL);
	char name[16];
	for (int i = 0; i < FD_NAMES_MAX; i++) {
		snprintf(name, sizeof(name), "f%d", i);
		T_CHECK_EQ(t, fd_names__put(&n, name, fds[i]), 0);
	}
	T_CHECK_EQ(t, fd_names__put(&n, "one-more", fds[FD_NAMES_MAX]), -ENOSPC);
	/* same name again: the old one is closed, the new kept */
	T_CHECK_EQ(t, fd_names__put(&n, "f0", fds[FD_NAMES_MAX]), 0);
	T_CHECK(t, fcntl(fds[0], F_GETFD) < 0 && errno == EBADF);
	T_CHECK_EQ(t, fd_names__take(&n, "f0"), fds[FD_NAMES_MAX]);
	T_CHECK_EQ(t, fd_names__take(&n, "f0"), -ENOENT);
	T_CHECK_EQ(t, fd_names__close(&n, "f1"), 0);
	T_CHECK(t, fcntl(fds[1], F_GETFD) < 0);
	T_CHECK_EQ(t, fd_names__close(&n, "f1"), -ENOENT);
	fd_names__destroy(&n);
	T_CHECK(t, fcntl(fds[2], F_GETFD) < 0);          /* closed by destroy */
	T_CHECK(t, fcntl(fds[FD_NAMES_MAX], F_GETFD) >= 0); /* taken: the caller's */
	close(fds[FD_NAMES_MAX]);
}

int main(void)
{
	struct t t = { 0 };
	/* as kmig (control__init): a write to a pipe nobody reads any more is
	 * EPIPE, not the end of the process */
	signal(SIGPIPE, SIG_IGN);
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/kmig-local-XXXXXX");
	if (!mkdtemp(tmpdir))
		return 1;
	T_RUN(&t, t_roundtrip);
	T_RUN(&t, t_exec_status);
	T_RUN(&t, t_exec_no_leak);
	T_RUN(&t, t_exec_stall_cancel);
	T_RUN(&t, t_exec_wait_cancel);
	T_RUN(&t, t_file_fifo);
	T_RUN(&t, t_two_way);
	T_RUN(&t, t_fd_names);
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
	if (system(cmd))
		printf("# could not remove %s\n", tmpdir);
	return T_DONE(&t);
}
