/* The kmig migration wire protocol: record encoding and decoding.
 *
 * Pure functions over memory buffers: no I/O, no KVM, no allocation except
 * in struct proto_codec.  docs/protocol.md is the normative description;
 * this header is its C form.
 *
 * Every record is a 16-byte little-endian header (u32 type, u32 flags,
 * u64 length) followed by `length` payload bytes.  Encoders write a whole
 * record (header + payload) into buf[0..cap) and return its total size in
 * bytes, or -ENOSPC if cap is too small, -EINVAL on bad arguments.
 * Decoders take the payload of a record whose header was already decoded,
 * never read outside [p, p + len), and on a malformed payload return
 * -EPROTO and point *why at a static string saying what is wrong.
 * Decoded structures point into the payload buffer (no copies).
 *
 * All functions may be called from any thread; only struct proto_codec
 * carries state and must not be shared between threads.
 */
#ifndef KMIG_MIG_PROTO_H
#define KMIG_MIG_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/bitmap.h"
#include "base/log.h"

#define PROTO_MAGIC          "KMIGSTRM"     /* 8 bytes, no NUL on the wire */
#define PROTO_MAGIC_LEN      8
#define PROTO_VERSION        2u             /* 2: CHANNEL carries the session */
#define PROTO_PAGE_SIZE      4096u
#define PROTO_HDR_SIZE       16u
#define PROTO_MAX_PAYLOAD    (16u << 20)    /* larger length = protocol error */
#define PROTO_MAX_BLOCKS     32u            /* RAM blocks in a START record */
#define PROTO_MAX_PAGES      1024u          /* pages per PAGES record */
#define PROTO_MAX_ZERO       65536u         /* offsets per ZERO record */
#define PROTO_MAX_MSG        4096u          /* bytes of an ERROR/RP_FAIL text */
#define PROTO_HASH_LEN       32u
#define PROTO_MAX_CHANNELS   16u            /* extra multifd channels */
#define PROTO_SESSION_LEN    16u            /* CHANNEL: the migration's random session */

/* Record types.  Source -> destination: 1..0xff; return path
 * (destination -> source): 0x100..0x1ff. */
enum proto_type {
	PROTO_START   = 1,
	PROTO_PAGES   = 2,
	PROTO_ZERO    = 3,
	PROTO_STATE   = 4,
	PROTO_SYNC    = 5,
	PROTO_END     = 6,
	PROTO_ERROR   = 7,
	PROTO_CHANNEL = 8,      /* multifd: u32 channel index, u32 extra channels, session */
	PROTO_DISCARD = 9,      /* post-copy: pages whose copy at the destination is stale */
	PROTO_POSTCOPY = 10,    /* post-copy: state complete, the destination runs now */
	PROTO_RESUME  = 11,     /* post-copy recovery: START's payload, on a new connection */
	PROTO_DISK    = 12,     /* x-block-migration: the disk image, beside RAM */
	PROTO_PREEMPT = 13,     /* postcopy-preempt: session, u32 multifd channels that
				 * follow; announces / opens the channel of the pages
				 * the destination asks for */
	PROTO_XBZRLE  = 14,     /* xbzrle: pages as deltas against the destination's
				 * copies (mig/wire/xbzrle.h) */
	PROTO_SHARED  = 15,     /* x-ignore-shared: u64 token the RAM's file was handed
				 * over with (mem/memfile.h), before END */
	PROTO_RP_OK   = 0x101,
	PROTO_RP_FAIL = 0x102,
	PROTO_RP_PING = 0x103,
	PROTO_RP_REQ  = 0x104,  /* post-copy: u32 block, u32 0, u64 offset of a page wanted */
	PROTO_RP_RUNNING = 0x105, /* post-copy: the destination's guest runs */
	PROTO_RP_BITMAP = 0x106, /* post-copy recovery: words of the pages the destination holds */
	PROTO_RP_ACK  = 0x107,  /* post-copy: u64 bytes of the stream read and applied */
};

/* Header flag bits.  Each type allows only the bits listed in
 * docs/protocol.md; any other bit set is a protocol error. */
#define PROTO_F_COMPRESSED_ZSTD  (1u << 0)   /* PAGES */
#define PROTO_F_COMPRESSED_LZ4   (1u << 1)   /* PAGES */
#define PROTO_F_HAS_CHECKSUM     (1u << 2)   /* END, POSTCOPY, DISK INFO */
#define PROTO_F_COMPRESSED_ZLIB  (1u << 3)   /* PAGES */
#define PROTO_F_PAGE_SUM         (1u << 4)   /* END with HAS_CHECKSUM: the checksum is
					      * the page sum (background-snapshot) */
#define PROTO_F_RAM_SHARED       (1u << 5)   /* START: RAM is not sent, it is handed
					      * over in a shared file (SHARED) */
#define PROTO_F_UUID             (1u << 6)   /* START: the source VM's UUID (16 bytes)
						* follows the blocks (validate-uuid) */
#define PROTO_UUID_LEN           16
#define PROTO_F_COMPRESSED_ANY   (PROTO_F_COMPRESSED_ZSTD | PROTO_F_COMPRESSED_LZ4 | \
				  PROTO_F_COMPRESSED_ZLIB)

struct proto_hdr {
	uint32_t type;
	uint32_t flags;
	uint64_t length;        /* payload bytes after the header */
};

/* Guest RAM as plain memory.  Blocks are in guest-physical order; sizes
 * are multiples of PROTO_PAGE_SIZE.  The caller owns the memory. */
struct proto_ram_block {
	uint64_t gpa;
	uint64_t size;
	uint8_t *host;
};
struct proto_ram {
	unsigned nr_blocks;     /* <= PROTO_MAX_BLOCKS */
	struct proto_ram_block blocks[PROTO_MAX_BLOCKS];
};

struct proto_start {
	uint32_t version;
	uint32_t page_size;
	uint32_t nr_blocks;
	struct { uint64_t gpa, size; } blocks[PROTO_MAX_BLOCKS];
	bool ram_shared;        /* START's flag RAM_SHARED (not in RESUME) */
	bool has_uuid;          /* START's flag UUID (not in RESUME): uuid is the source VM's */
	uint8_t uuid[PROTO_UUID_LEN];
};

/* A decoded PAGES or ZERO payload.  offsets points at count little-endian
 * u64 values (possibly unaligned): read them with proto__offset().  For
 * PAGES, data/data_len is the page data: count * PROTO_PAGE_SIZE raw
 * bytes, or (comp != PROTO_COMP_NONE) one compressed blob that must
 * decompress to exactly raw_len == count * PROTO_PAGE_SIZE bytes. */
enum proto_comp {
	PROTO_COMP_NONE = 0, PROTO_COMP_ZSTD = 1, PROTO_COMP_LZ4 = 2, PROTO_COMP_ZLIB = 3
};
struct proto_pages {
	uint32_t block;
	uint32_t count;
	const uint8_t *offsets;
	enum proto_comp comp;
	uint32_t raw_len;
	const uint8_t *data;
	size_t data_len;
};

struct proto_state {
	uint32_t id, version, instance;
	const uint8_t *data;
	size_t len;
};

/* ERROR and RP_FAIL: a positive errno-style code and a UTF-8 text (not
 * NUL-terminated, at most PROTO_MAX_MSG bytes). */
struct proto_error {
	uint32_t code;
	const char *msg;
	size_t msg_len;
};

static inline uint64_t proto__offset(const struct proto_pages *p, uint32_t i)
{
	const uint8_t *b = p->offsets + (size_t)i * 8;
	uint64_t v = 0;
	for (int k = 7; k >= 0; k--)
		v = (v << 8) | b[k];
	return v;
}

/* Name of a record type for messages ("PAGES", "RP_OK", ...); "unknown"
 * for any other value. */
const char *proto__type_name(uint32_t type);

/* ---- header ---- */
/* Writes the 16 header bytes into buf (cap >= PROTO_HDR_SIZE). */
int proto__encode_header(void *buf, size_t cap, uint32_t type, uint32_t flags,
			 uint64_t length) KMIG_MUST_CHECK;
/* Parses a header.  -EINVAL if len < PROTO_HDR_SIZE; -EPROTO if the header
 * is invalid (see proto__header_problem); *hdr is filled in either case
 * when len suffices. */
int proto__decode_header(const void *buf, size_t len, struct proto_hdr *hdr) KMIG_MUST_CHECK;
/* NULL if hdr is acceptable: known type, only allowed flag bits, length
 * <= PROTO_MAX_PAYLOAD and, for fixed-size records, the exact length.
 * Otherwise a static description of the problem. */
const char *proto__header_problem(const struct proto_hdr *hdr);

/* ---- encoders: return record size (> 0) or -errno ---- */
void proto_start__from_ram(struct proto_start *st, const struct proto_ram *ram);
ssize_t proto__encode_start(void *buf, size_t cap, const struct proto_start *st) KMIG_MUST_CHECK;
/* Uncompressed PAGES: copies each page from block_host + offsets[i]. */
ssize_t proto__encode_pages(void *buf, size_t cap, uint32_t block, uint32_t count,
			    const uint64_t *offsets, const uint8_t *block_host) KMIG_MUST_CHECK;
/* Header, block, count and offsets of a PAGES record whose data part
 * (data_len bytes, written by the caller right after) follows; flags may
 * carry a compression bit, in which case the data part must start with
 * the u32 raw length.  Lets a sender write page data straight from RAM. */
ssize_t proto__encode_pages_head(void *buf, size_t cap, uint32_t flags, uint32_t block,
				 uint32_t count, const uint64_t *offsets,
				 uint64_t data_len) KMIG_MUST_CHECK;
ssize_t proto__encode_zero(void *buf, size_t cap, uint32_t block, uint32_t count,
			   const uint64_t *offsets) KMIG_MUST_CHECK;
ssize_t proto__encode_state(void *buf, size_t cap, uint32_t id, uint32_t version,
			    uint32_t instance, const void *data, size_t len) KMIG_MUST_CHECK;
ssize_t proto__encode_sync(void *buf, size_t cap, uint64_t round) KMIG_MUST_CHECK;
/* SHARED: the token (not 0) the source handed its RAM's file over with. */
ssize_t proto__encode_shared(void *buf, size_t cap, uint64_t token) KMIG_MUST_CHECK;
/* CHANNEL: on the main stream (index 0) it announces `count` extra
 * channels and the migration's session (PROTO_SESSION_LEN random bytes);
 * each extra connection starts with one naming its index and the same
 * session. */
ssize_t proto__encode_channel(void *buf, size_t cap, uint32_t index, uint32_t count,
			      const uint8_t session[PROTO_SESSION_LEN]) KMIG_MUST_CHECK;
/* PREEMPT: on the main stream it announces the postcopy-preempt channel,
 * and that connection starts with one; both carry the session and the
 * number of multifd channels the source opens after it (0..16). */
#define PROTO_PREEMPT_LEN (PROTO_SESSION_LEN + 4)
ssize_t proto__encode_preempt(void *buf, size_t cap, const uint8_t session[PROTO_SESSION_LEN],
			      uint32_t channels) KMIG_MUST_CHECK;
/* hash may be NULL: END without checksum. */
ssize_t proto__encode_end(void *buf, size_t cap, const uint8_t *hash) KMIG_MUST_CHECK;
/* END whose checksum is the page sum of all RAM (flag PAGE_SUM). */
ssize_t proto__encode_end_sum(void *buf, size_t cap, const uint8_t *sum) KMIG_MUST_CHECK;
/* msg is truncated to PROTO_MAX_MSG bytes. */
ssize_t proto__encode_error(void *buf, size_t cap, uint32_t code, const char *msg) KMIG_MUST_CHECK;
ssize_t proto__encode_rp_ok(void *buf, size_t cap) KMIG_MUST_CHECK;
ssize_t proto__encode_rp_fail(void *buf, size_t cap, uint32_t code, const char *msg) KMIG_MUST_CHECK;
ssize_t proto__encode_rp_ping(void *buf, size_t cap, uint64_t cookie) KMIG_MUST_CHECK;
/* Post-copy.  DISCARD has ZERO's payload (at most PROTO_MAX_ZERO offsets);
 * POSTCOPY and RP_RUNNING are empty; RP_REQ names one page. */
ssize_t proto__encode_discard(void *buf, size_t cap, uint32_t block, uint32_t count,
			      const uint64_t *offsets) KMIG_MUST_CHECK;
ssize_t proto__encode_empty(void *buf, size_t cap, uint32_t type) KMIG_MUST_CHECK;
/* POSTCOPY; verify: END will carry the post-copy checksum (flag
 * HAS_CHECKSUM), so the destination sums pages from the switch on. */
ssize_t proto__encode_postcopy(void *buf, size_t cap, bool verify) KMIG_MUST_CHECK;
ssize_t proto__encode_rp_req(void *buf, size_t cap, uint32_t block, uint64_t offset) KMIG_MUST_CHECK;
/* RP_ACK: the destination has read and applied the stream's first `bytes`
 * bytes (counted from the connection's first byte, as both ends count
 * mig_stream__bytes_out / __consumed); the pace of the push. */
ssize_t proto__encode_rp_ack(void *buf, size_t cap, uint64_t bytes) KMIG_MUST_CHECK;

/* Post-copy recovery.  RESUME carries START's payload (the source's RAM
 * layout).  RP_BITMAP: u64 first word, u64 bits in the whole bitmap, then
 * words (u64 each, at most PROTO_MAX_BITMAP_WORDS) of the destination's
 * bitmap of pages it holds, bit i of word w = page 64 w + i. */
#define PROTO_MAX_BITMAP_WORDS 8192u
ssize_t proto__encode_resume(void *buf, size_t cap, const struct proto_start *st) KMIG_MUST_CHECK;
ssize_t proto__encode_rp_bitmap(void *buf, size_t cap, const struct bitmap *b,
				uint64_t first_word, uint32_t nwords) KMIG_MUST_CHECK;
/* Copies the words into b, which must have exactly the record's bit count
 * (else -EPROTO, as for words past its end); *next_word: the word after
 * the record's last. */
int proto__decode_rp_bitmap(const void *p, size_t len, struct bitmap *b, uint64_t *next_word,
			    const char **why) KMIG_MUST_CHECK;
/* Upper bound of an uncompressed PAGES record of count pages. */
static inline size_t proto__pages_record_size(uint32_t count)
{
	return PROTO_HDR_SIZE + 8 + (size_t)count * (8 + PROTO_PAGE_SIZE);
}

/* ---- payload decoders: 0 or -EPROTO with *why set ---- */
/* START or RESUME; flags: the header's (RAM_SHARED, UUID: START only). */
int proto__decode_start(const void *p, size_t len, uint32_t flags, struct proto_start *st,
			const char **why) KMIG_MUST_CHECK;
/* flags: the header flags (selects compression). */
int proto__decode_pages(const void *p, size_t len, uint32_t flags,
			struct proto_pages *pg, const char **why) KMIG_MUST_CHECK;
int proto__decode_zero(const void *p, size_t len, struct proto_pages *pg,
		       const char **why) KMIG_MUST_CHECK;
int proto__decode_state(const void *p, size_t len, struct proto_state *st,
			const char **why) KMIG_MUST_CHECK;
int proto__decode_sync(const void *p, size_t len, uint64_t *round,
		       const char **why) KMIG_MUST_CHECK;
/* The token, not 0. */
int proto__decode_shared(const void *p, size_t len, uint64_t *token,
			 const char **why) KMIG_MUST_CHECK;
/* Index 0..PROTO_MAX_CHANNELS, count 1..PROTO_MAX_CHANNELS, index <= count;
 * session receives PROTO_SESSION_LEN bytes. */
int proto__decode_channel(const void *p, size_t len, uint32_t *index, uint32_t *count,
			  uint8_t session[PROTO_SESSION_LEN], const char **why) KMIG_MUST_CHECK;
/* session receives PROTO_SESSION_LEN bytes; channels at most
 * PROTO_MAX_CHANNELS. */
int proto__decode_preempt(const void *p, size_t len, uint8_t session[PROTO_SESSION_LEN],
			  uint32_t *channels, const char **why) KMIG_MUST_CHECK;
/* Whether two sessions are equal, in a time that does not depend on where
 * they differ. */
bool proto__same_session(const uint8_t a[PROTO_SESSION_LEN], const uint8_t b[PROTO_SESSION_LEN]);
/* hash receives PROTO_HASH_LEN bytes when flags has HAS_CHECKSUM. */
int proto__decode_end(const void *p, size_t len, uint32_t flags, uint8_t *hash,
		      bool *has_hash, const char **why) KMIG_MUST_CHECK;
/* ERROR and RP_FAIL payloads. */
int proto__decode_error(const void *p, size_t len, struct proto_error *e,
			const char **why) KMIG_MUST_CHECK;
int proto__decode_rp_ping(const void *p, size_t len, uint64_t *cookie,
			  const char **why) KMIG_MUST_CHECK;
int proto__decode_rp_ack(const void *p, size_t len, uint64_t *bytes,
			 const char **why) KMIG_MUST_CHECK;
int proto__decode_discard(const void *p, size_t len, struct proto_pages *pg,
			  const char **why) KMIG_MUST_CHECK;
/* The offset is not checked here (the receiver checks it against RAM). */
int proto__decode_rp_req(const void *p, size_t len, uint32_t *block, uint64_t *offset,
			 const char **why) KMIG_MUST_CHECK;

/* ---- the disk in the stream (x-block-migration; docs/protocol.md "DISK") ----
 * Payload: u32 kind, u32 drive (0: the only one), u64 offset, u64 length,
 * then, for DATA, length bytes of the image from offset.  INFO (offset 0,
 * length = the image's size) comes first; ZERO: the range reads as zero
 * (a hole on the source, or zeros).  Offsets and lengths are multiples of
 * PROTO_DISK_SECTOR; DATA carries 1..PROTO_DISK_MAX_DATA bytes. */
#define PROTO_DISK_SECTOR   512u
#define PROTO_DISK_MAX_DATA (1u << 20)
#define PROTO_DISK_HDR      24u
enum proto_disk_kind { PROTO_DISK_INFO = 0, PROTO_DISK_DATA = 1, PROTO_DISK_ZERO = 2,
		       PROTO_DISK_SUM = 3 };
#define PROTO_DISK_SUM_LEN 8u
struct proto_disk {
	enum proto_disk_kind kind;
	uint32_t drive;
	uint64_t offset, length;
	const uint8_t *data;      /* DATA: length bytes in the payload; SUM: 8 */
	bool sum_follows;         /* INFO with HAS_CHECKSUM: a SUM comes before END */
};
/* Header and the 24 payload bytes; for DATA the caller writes the length
 * data bytes right after, for SUM the 8 bytes of the sum (the record's
 * size counts them: the return value is the header's part,
 * PROTO_HDR_SIZE + PROTO_DISK_HDR). */
ssize_t proto__encode_disk_head(void *buf, size_t cap, enum proto_disk_kind kind,
				uint64_t offset, uint64_t length) KMIG_MUST_CHECK;
/* INFO (whole, no data); sum: flag HAS_CHECKSUM, a SUM will follow. */
ssize_t proto__encode_disk_info(void *buf, size_t cap, uint64_t size, bool sum) KMIG_MUST_CHECK;
/* x-verify with the disk: SUM (offset 0, length = the image's size, 8
 * bytes of data: the sum) comes after the last DATA.  The sum is, mod
 * 2^64, the sum over every sector i of proto__sector_digest(i, its 512
 * bytes), so either side can keep it up to date sector by sector. */
uint64_t proto__sector_digest(uint64_t sector, const void *data);
/* proto__sector_digest of a sector of zeros, without hashing it. */
uint64_t proto__zero_sector_digest(uint64_t sector);
/* Structure only (the receiver checks the range against its image). */
int proto__decode_disk(const void *p, size_t len, uint32_t flags, struct proto_disk *d,
		       const char **why) KMIG_MUST_CHECK;

/* ---- RAM layout and checksum ---- */
/* NULL if the START layout equals ram exactly (same block count, and each
 * block the same gpa and size, same page size); otherwise a description
 * written into msg[0..msglen) and msg is returned. */
const char *proto__layout_mismatch(const struct proto_start *st, const struct proto_ram *ram,
				   char *msg, size_t msglen);
/* The kmig RAM hash (docs/protocol.md "Checksum") over all blocks in
 * order.  Reads the memory; the caller keeps it stable meanwhile. */
void proto__ram_hash(const struct proto_ram *ram, uint8_t out[PROTO_HASH_LEN]);
/* The same hash, with each page whose bit is set in zero (VM-wide page
 * numbering: the blocks' pages in order) counted as a zero page whatever
 * it holds: the hash of a copy of RAM in which those pages were never
 * written.  zero may be NULL or shorter than RAM (pages past it count as
 * they are). */
void proto__ram_hash_as_zero(const struct proto_ram *ram, const struct bitmap *zero,
			     uint8_t out[PROTO_HASH_LEN]);
/* The post-copy checksum (docs/protocol.md "Checksum"): a sum, lane by
 * lane mod 2^64, of one digest per page with its VM-wide number mixed in,
 * so a destination can add each page as it is placed, in any order.
 * acc starts as four zeros; proto__ram_page_sum is the sum of all RAM. */
void proto__page_sum_add(uint64_t acc[4], uint64_t page, const void *data);
void proto__page_sum_out(const uint64_t acc[4], uint8_t out[PROTO_HASH_LEN]);
void proto__ram_page_sum(const struct proto_ram *ram, uint8_t out[PROTO_HASH_LEN]);
/* The same sum with each page whose bit is set in zero counted as a zero
 * page (as proto__ram_hash_as_zero; zero may be NULL or short). */
void proto__ram_page_sum_as_zero(const struct proto_ram *ram, const struct bitmap *zero,
				 uint8_t out[PROTO_HASH_LEN]);
/* The same hash over one buffer, as if it were a single block. */
void proto__hash_buf(const void *buf, size_t len, uint8_t out[PROTO_HASH_LEN]);

/* ---- compression: zstd and zlib at a level, lz4 at its default ----
 * A codec keeps the compressors' contexts and a staging buffer between
 * calls.  Zero-initialised struct proto_codec is valid; free it with
 * proto_codec__free.  Not thread-safe. */
#define PROTO_LEVEL_DEFAULT   1     /* zstd and zlib: fastest but one (QEMU's default) */
#define PROTO_ZSTD_LEVEL_MAX  20    /* 0 is zstd's own default (3) */
#define PROTO_ZLIB_LEVEL_MAX  9     /* 0 stores: such records go plain */
struct proto_codec {
	void *zc, *zd;                 /* ZSTD_CCtx, ZSTD_DCtx, lazily created */
	void *zlc, *zld;               /* zlib's deflate and inflate streams, lazily */
	int zlc_level;                 /* the level zlc was set up for */
	uint8_t *stage;                /* PROTO_MAX_PAGES pages, lazily allocated */
};
void proto_codec__free(struct proto_codec *c);
/* Worst-case compressed size of len bytes (0 for an unknown kind). */
size_t proto__compress_bound(enum proto_comp kind, size_t len);
/* Is level valid for kind?  (lz4 takes only 0: it has no level.) */
bool proto__comp_level_ok(enum proto_comp kind, int level);
/* Compresses src into dst at level (proto__comp_level_ok); returns the
 * compressed size or -ENOSPC/-EINVAL/-ENOMEM.  c may be NULL (one-shot
 * contexts). */
ssize_t proto__compress(struct proto_codec *c, enum proto_comp kind, int level, const void *src,
			size_t len, void *dst, size_t cap) KMIG_MUST_CHECK;
/* Decompresses exactly `expected` bytes into dst (capacity expected);
 * -EPROTO if the blob is corrupt or yields any other size. */
int proto__decompress(struct proto_codec *c, enum proto_comp kind, const void *src,
		      size_t len, void *dst, size_t expected) KMIG_MUST_CHECK;
/* Compressed PAGES record.  The pages are first copied to the codec's
 * staging buffer (a snapshot: the guest may write them concurrently, and a
 * compressor must see stable input), then compressed into buf after the
 * header and offsets.  If compression does not shrink the data, an
 * uncompressed record is written instead.  Returns the record size. */
ssize_t proto__encode_pages_comp(struct proto_codec *c, enum proto_comp kind, int level,
				 void *buf, size_t cap, uint32_t block, uint32_t count,
				 const uint64_t *offsets, const uint8_t *block_host) KMIG_MUST_CHECK;

/* What compression saved on a PAGES record of `count` pages that came out
 * rec_len bytes long: their PROTO_PAGE_SIZE bytes each less the record,
 * or 0 when the record is not smaller (a plain one never is). */
static inline uint64_t proto__comp_saved(uint32_t count, size_t rec_len)
{
	uint64_t raw = (uint64_t)count * PROTO_PAGE_SIZE;
	return raw > rec_len ? raw - rec_len : 0;
}

#endif
