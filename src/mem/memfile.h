/* Guest RAM kept in a file that is mapped shared (QEMU's
 * memory-backend-file with share=on), so a second kmig on the same host
 * can take the running guest over without its RAM being copied (the
 * capability x-ignore-shared): a new kmig binary, or a restart through
 * a state-only file, with the guest's memory left where it is.
 *
 * The file: `size` bytes of guest RAM, then one 4 KiB trailer page that
 * is never mapped into the guest.  The trailer says who owns the RAM:
 *
 *   magic "KMIGRAM1", u32 version 1, u32 state, u64 token, u64 ram bytes
 *
 * state RUNNING: a VM owns it (or did, until it was killed); HANDED_OVER:
 * a source stopped its guest and handed the RAM over with `token` (a
 * random number it also sent in its migration stream).  A destination
 * takes the RAM only if the trailer still says HANDED_OVER with the token
 * its stream carries, and then writes RUNNING with a token of its own.
 * So a stream whose RAM has changed since (a state file restored twice,
 * a source that ran on, another host's file of the same name) is
 * refused, and a source can take its RAM back only if nobody took it.
 *
 * Locks (open file description locks, as for disk images, dev/blkfile.h):
 * byte 101 shared by every opener while it has the file open; byte 100
 * exclusive while a VM owns the RAM (runs it, boots it, or receives it
 * page by page).  A fresh boot, and a destination that receives the RAM
 * page by page, need nobody else to have the file open at all (they zero
 * the file); a destination waiting for a hand-over holds only byte 101
 * until the switchover.
 *
 * What this does not stop: a copy of the file made after a hand-over
 * holds the same trailer, so a state saved with that token can be
 * restored once on each copy (as a copy of a disk image boots twice).
 *
 * Threads: every function but open and close takes the file's own lock
 * (the migration thread and the QMP loop's `cont` may both call them). */
#ifndef KMIG_MEM_MEMFILE_H
#define KMIG_MEM_MEMFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/log.h"

#define MEMFILE_TRAILER 4096u
#define MEMFILE_LOCK_OWNER 100
#define MEMFILE_LOCK_USER 101
#define MEMFILE_MAGIC "KMIGRAM1"

enum memfile_state { MEMFILE_RUNNING = 1, MEMFILE_HANDED_OVER = 2 };

#include <pthread.h>

struct memfile {
	pthread_mutex_t lock;   /* the fields below, and the trailer's I/O */
	int fd;
	char path[1024];
	uint64_t size;      /* guest RAM bytes (the file is size + MEMFILE_TRAILER) */
	bool owner;         /* holds byte 100: this VM's RAM */
	bool fresh;         /* zeroed by this VM (a boot, or a page-by-page migration) */
	uint64_t token;     /* HANDED_OVER: the token this VM handed over with */
};

/* Opens (creating it if absent) and checks path: a regular file outside
 * hugetlbfs.  boot: this VM boots a guest in it: nobody else may have it
 * open, and it may not hold RAM handed over and not taken (-EBUSY: a
 * state-only save waits for its restore); it is emptied to size +
 * trailer zero bytes and owned (RUNNING).
 * !boot (--incoming): only byte 101 is held; a new or empty file is sized
 * (zeros), any other size than size + trailer is refused.  -errno with
 * err set ("memory file X is in use by another VM (locked)"). */
int memfile__open(struct memfile *f, const char *path, uint64_t size, bool boot, char *err,
		  size_t errlen) KMIG_MUST_CHECK;
void memfile__close(struct memfile *f);

/* A destination whose RAM comes page by page: it must have the file to
 * itself and start from zeros, as with anonymous memory.  -EAGAIN with
 * err set when another process has it open (the source, if it is the
 * same file: that needs x-ignore-shared), -EBUSY when the trailer says
 * HANDED_OVER (RAM a state-only save left there, not taken yet).
 * Idempotent. */
int memfile__claim(struct memfile *f, char *err, size_t errlen) KMIG_MUST_CHECK;

/* The source at the switchover, its guest stopped: writes HANDED_OVER
 * with a new random token (returned) and gives up byte 100. */
int memfile__hand_over(struct memfile *f, uint64_t *token) KMIG_MUST_CHECK;
/* The destination at the switchover: takes byte 100 and checks the
 * trailer says HANDED_OVER with token, then writes RUNNING with a token
 * of its own.  -EAGAIN (another VM owns it) or -ESTALE (the RAM is not
 * the one handed over with token) with err set. */
int memfile__take_over(struct memfile *f, uint64_t token, char *err,
		       size_t errlen) KMIG_MUST_CHECK;
/* The source after a failed or cancelled hand-over, or `cont` after one
 * completed: takes its RAM back if nobody took it: memfile__take_over
 * with the token it handed over with.  0 at once if it never handed over. */
int memfile__take_back(struct memfile *f, char *err, size_t errlen) KMIG_MUST_CHECK;
/* The destination whose guest did not run after all: undoes its
 * memfile__take_over(token): HANDED_OVER with that token again, the
 * owner lock given up, so the source can take the RAM back. */
int memfile__give_back(struct memfile *f, uint64_t token) KMIG_MUST_CHECK;
/* Whether this VM owns the RAM now (false once handed over). */
bool memfile__owner(struct memfile *f);

/* Reads the trailer: 0 with *state and *token, -EPROTO when it is not a
 * kmig trailer for this size. */
int memfile__read_trailer(const struct memfile *f, enum memfile_state *state,
			  uint64_t *token) KMIG_MUST_CHECK;

#endif
