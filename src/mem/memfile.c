#include "mem/memfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "mig/wire/proto_le.h"

#define MEMFILE_HUGETLBFS_MAGIC 0x958458f6
#define MEMFILE_VERSION 1u
#define MEMFILE_TRAILER_LEN 32u   /* magic 8, version 4, state 4, token 8, ram bytes 8 */

static int memfile__setlk(int fd, short type, off_t byte)
{
	struct flock fl = { .l_type = type, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1 };
	return fcntl(fd, F_OFD_SETLK, &fl) ? -errno : 0;
}

static int memfile__write_trailer(struct memfile *f, enum memfile_state state, uint64_t token)
{
	uint8_t t[MEMFILE_TRAILER_LEN];
	memcpy(t, MEMFILE_MAGIC, 8);
	le__put32(t + 8, MEMFILE_VERSION);
	le__put32(t + 12, (uint32_t)state);
	le__put64(t + 16, token);
	le__put64(t + 24, f->size);
	ssize_t n = pwrite(f->fd, t, sizeof(t), (off_t)f->size);
	if (n < 0)
		return -errno;
	return n == (ssize_t)sizeof(t) ? 0 : -EIO;
}

int memfile__read_trailer(const struct memfile *f, enum memfile_state *state, uint64_t *token)
{
	uint8_t t[MEMFILE_TRAILER_LEN];
	ssize_t n = pread(f->fd, t, sizeof(t), (off_t)f->size);
	if (n < 0)
		return -errno;
	if (n != (ssize_t)sizeof(t) || memcmp(t, MEMFILE_MAGIC, 8) ||
	    le__get32(t + 8) != MEMFILE_VERSION || le__get64(t + 24) != f->size)
		return -EPROTO;
	uint32_t s = le__get32(t + 12);
	if (s != MEMFILE_RUNNING && s != MEMFILE_HANDED_OVER)
		return -EPROTO;
	*state = (enum memfile_state)s;
	*token = le__get64(t + 16);
	return 0;
}

/* A random token, never 0 (0 means "none"). */
static int memfile__new_token(uint64_t *token)
{
	do {
		if (getrandom(token, sizeof(*token), 0) != (ssize_t)sizeof(*token))
			return errno ? -errno : -EIO;
	} while (!*token);
	return 0;
}

/* Zero bytes of guest RAM and a RUNNING trailer: this VM's RAM from now. */
static int memfile__empty(struct memfile *f)
{
	uint64_t token;
	if (ftruncate(f->fd, 0) || ftruncate(f->fd, (off_t)(f->size + MEMFILE_TRAILER)))
		return -errno;
	int rc = memfile__new_token(&token);
	rc = rc ? rc : memfile__write_trailer(f, MEMFILE_RUNNING, token);
	f->fresh = !rc;
	return rc;
}

static int memfile__in_use(struct memfile *f, int rc, const char *what, char *err, size_t errlen)
{
	if (rc == -EAGAIN || rc == -EACCES) {
		snprintf(err, errlen, "memory file %s is in use by another VM (locked)%s", f->path,
			 what);
		return -EAGAIN;
	}
	snprintf(err, errlen, "memory file %s: cannot lock it: %s", f->path, strerror(-rc));
	return rc;
}

/* Opens and checks the file; f->fd set. */
static int memfile__open_fd(struct memfile *f, char *err, size_t errlen)
{
	struct stat st;
	struct statfs sfs;
	f->fd = open(f->path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (f->fd < 0) {
		int rc = -errno;
		snprintf(err, errlen, "memory file %s: %s", f->path, strerror(-rc));
		return rc;
	}
	if (fstat(f->fd, &st) || fstatfs(f->fd, &sfs)) {
		int rc = -errno;
		snprintf(err, errlen, "memory file %s: %s", f->path, strerror(-rc));
		return rc;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(err, errlen, "memory file %s is not a regular file", f->path);
		return -EINVAL;
	}
	if (sfs.f_type == MEMFILE_HUGETLBFS_MAGIC) {
		snprintf(err, errlen, "memory file %s: hugetlbfs is not supported (a file on "
			 "tmpfs, such as /dev/shm, is)", f->path);
		return -EOPNOTSUPP;
	}
	return 0;
}

/* Whether the file holds RAM handed over and not taken (a state-only
 * save waits for its restore): nothing may empty it then. */
static bool memfile__waits(struct memfile *f, char *err, size_t errlen)
{
	enum memfile_state st;
	uint64_t tok;
	if (memfile__read_trailer(f, &st, &tok) || st != MEMFILE_HANDED_OVER)
		return false;
	snprintf(err, errlen, "memory file %s holds RAM that was handed over and not taken (a "
		 "state-only save's?): restore that save, or remove the file", f->path);
	return true;
}

/* Boot: nobody else has the file open and it holds no RAM handed over;
 * it becomes this VM's, emptied. */
static int memfile__open_boot(struct memfile *f, char *err, size_t errlen)
{
	int rc = memfile__setlk(f->fd, F_WRLCK, MEMFILE_LOCK_USER);
	if (rc)
		return memfile__in_use(f, rc, "", err, errlen);
	rc = memfile__setlk(f->fd, F_WRLCK, MEMFILE_LOCK_OWNER);
	if (rc)
		return memfile__in_use(f, rc, "", err, errlen);
	f->owner = true;
	if (memfile__waits(f, err, errlen))
		return -EBUSY;
	rc = memfile__setlk(f->fd, F_RDLCK, MEMFILE_LOCK_USER);
	rc = rc ? rc : memfile__empty(f);
	if (rc)
		snprintf(err, errlen, "memory file %s: %s", f->path, strerror(-rc));
	return rc;
}

/* Incoming: byte 101 only; a new file sized, any other size refused. */
static int memfile__open_incoming(struct memfile *f, char *err, size_t errlen)
{
	struct stat st;
	int rc = memfile__setlk(f->fd, F_RDLCK, MEMFILE_LOCK_USER);
	if (rc)
		return memfile__in_use(f, rc, "", err, errlen);
	if (fstat(f->fd, &st)) {
		rc = -errno;
		snprintf(err, errlen, "memory file %s: %s", f->path, strerror(-rc));
		return rc;
	}
	uint64_t want = f->size + MEMFILE_TRAILER;
	if (st.st_size == 0 && ftruncate(f->fd, (off_t)want)) {
		rc = -errno;
		snprintf(err, errlen, "memory file %s: cannot size it: %s", f->path, strerror(-rc));
		return rc;
	}
	if (st.st_size != 0 && (uint64_t)st.st_size != want) {
		snprintf(err, errlen, "memory file %s holds %lld bytes, but %llu MiB of guest RAM "
			 "take %llu (the RAM and kmig's 4 KiB trailer): another VM's, or another "
			 "--memory", f->path, (long long)st.st_size,
			 (unsigned long long)(f->size >> 20), (unsigned long long)want);
		return -EINVAL;
	}
	return 0;
}

int memfile__open(struct memfile *f, const char *path, uint64_t size, bool boot, char *err,
		  size_t errlen)
{
	memset(f, 0, sizeof(*f));
	pthread_mutex_init(&f->lock, NULL);
	f->fd = -1;
	f->size = size;
	if (!path || strlen(path) >= sizeof(f->path)) {
		snprintf(err, errlen, "memory file path missing or too long");
		return -EINVAL;
	}
	strcpy(f->path, path);
	int rc = memfile__open_fd(f, err, errlen);
	if (!rc)
		rc = boot ? memfile__open_boot(f, err, errlen) : memfile__open_incoming(f, err, errlen);
	if (rc)
		memfile__close(f);
	return rc;
}

void memfile__close(struct memfile *f)
{
	if (f->fd >= 0)
		close(f->fd);   /* its locks go with it */
	f->fd = -1;
	f->owner = false;
	pthread_mutex_destroy(&f->lock);
}

static int memfile__claim_locked(struct memfile *f, char *err, size_t errlen)
{
	if (f->owner && f->fresh)
		return 0;
	/* nobody else may have it open: a source running on it, or one in
	 * postmigrate after a state-only save, still maps it */
	int rc = memfile__setlk(f->fd, F_WRLCK, MEMFILE_LOCK_USER);
	if (!rc && !f->owner)
		rc = memfile__setlk(f->fd, F_WRLCK, MEMFILE_LOCK_OWNER);
	if (rc) {
		(void)memfile__setlk(f->fd, F_RDLCK, MEMFILE_LOCK_USER);
		return memfile__in_use(f, rc, ": a migration between two VMs on one memory "
				       "file needs x-ignore-shared on the source", err, errlen);
	}
	f->owner = true;
	if (memfile__waits(f, err, errlen)) {
		(void)memfile__setlk(f->fd, F_UNLCK, MEMFILE_LOCK_OWNER);
		(void)memfile__setlk(f->fd, F_RDLCK, MEMFILE_LOCK_USER);
		f->owner = false;
		return -EBUSY;
	}
	rc = memfile__empty(f);
	if (!rc)
		rc = memfile__setlk(f->fd, F_RDLCK, MEMFILE_LOCK_USER);
	if (rc)
		snprintf(err, errlen, "memory file %s: %s", f->path, strerror(-rc));
	return rc;
}

int memfile__claim(struct memfile *f, char *err, size_t errlen)
{
	pthread_mutex_lock(&f->lock);
	int rc = memfile__claim_locked(f, err, errlen);
	pthread_mutex_unlock(&f->lock);
	return rc;
}

static int memfile__hand_over_locked(struct memfile *f, uint64_t *token)
{
	uint64_t again;
	if (!f->owner)
		return -EPERM;
	int rc = memfile__new_token(token);
	rc = rc ? rc : memfile__write_trailer(f, MEMFILE_HANDED_OVER, *token);
	if (rc)
		return rc;
	rc = memfile__setlk(f->fd, F_UNLCK, MEMFILE_LOCK_OWNER);
	if (rc) {       /* still ours: the trailer says so again */
		if (!memfile__new_token(&again))
			(void)memfile__write_trailer(f, MEMFILE_RUNNING, again);
		return rc;
	}
	f->owner = false;
	f->token = *token;
	return 0;
}

int memfile__hand_over(struct memfile *f, uint64_t *token)
{
	pthread_mutex_lock(&f->lock);
	int rc = memfile__hand_over_locked(f, token);
	pthread_mutex_unlock(&f->lock);
	return rc;
}

static const char *memfile__says(int rc, enum memfile_state st, uint64_t tok, uint64_t want)
{
	if (rc)
		return "no kmig trailer for this RAM size";
	if (st == MEMFILE_RUNNING)
		return "a VM has run the guest in it since";
	return tok == want ? "handed over with this token" : "handed over by another migration";
}

static int memfile__take_over_locked(struct memfile *f, uint64_t token, char *err,
				     size_t errlen)
{
	if (f->owner) {
		snprintf(err, errlen, "memory file %s is this VM's already", f->path);
		return -EINVAL;
	}
	int rc = memfile__setlk(f->fd, F_WRLCK, MEMFILE_LOCK_OWNER);
	if (rc)
		return memfile__in_use(f, rc, "", err, errlen);
	enum memfile_state st = 0;
	uint64_t tok = 0, mine;
	rc = memfile__read_trailer(f, &st, &tok);
	if (rc || st != MEMFILE_HANDED_OVER || tok != token || !token) {
		snprintf(err, errlen, "memory file %s does not hold the RAM that was handed over "
			 "(%s): it was restored already, or its VM ran on, or it is another file",
			 f->path, memfile__says(rc, st, tok, token));
		(void)memfile__setlk(f->fd, F_UNLCK, MEMFILE_LOCK_OWNER);
		return -ESTALE;
	}
	rc = memfile__new_token(&mine);
	rc = rc ? rc : memfile__write_trailer(f, MEMFILE_RUNNING, mine);
	if (rc) {
		snprintf(err, errlen, "memory file %s: %s", f->path, strerror(-rc));
		(void)memfile__setlk(f->fd, F_UNLCK, MEMFILE_LOCK_OWNER);
		return rc;
	}
	f->owner = true;
	f->token = 0;
	return 0;
}

int memfile__take_over(struct memfile *f, uint64_t token, char *err, size_t errlen)
{
	pthread_mutex_lock(&f->lock);
	int rc = memfile__take_over_locked(f, token, err, errlen);
	pthread_mutex_unlock(&f->lock);
	return rc;
}

int memfile__take_back(struct memfile *f, char *err, size_t errlen)
{
	pthread_mutex_lock(&f->lock);
	int rc = f->owner ? 0 : memfile__take_over_locked(f, f->token, err, errlen);
	pthread_mutex_unlock(&f->lock);
	return rc;
}

int memfile__give_back(struct memfile *f, uint64_t token)
{
	pthread_mutex_lock(&f->lock);
	int rc = f->owner ? 0 : -EPERM;
	rc = rc ? rc : memfile__write_trailer(f, MEMFILE_HANDED_OVER, token);
	rc = rc ? rc : memfile__setlk(f->fd, F_UNLCK, MEMFILE_LOCK_OWNER);
	if (!rc) {
		f->owner = false;
		f->token = token;
	}
	pthread_mutex_unlock(&f->lock);
	return rc;
}

bool memfile__owner(struct memfile *f)
{
	pthread_mutex_lock(&f->lock);
	bool own = f->owner;
	pthread_mutex_unlock(&f->lock);
	return own;
}
