/* Unit tests of TLS on migration streams: objects, PSK and X.509
 * handshakes over socketpairs, failures on both sides, cancel. */
#include <errno.h>
#include <gnutls/gnutls.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/timeutil.h"
#include "harness.h"
#include "mig/wire/stream.h"
#include "mig/wire/tls.h"

static char g_dir[64], g_other[64];    /* two sets of credentials, two CAs */

static int make_certs(void)
{
	char cmd[256];
	snprintf(g_dir, sizeof(g_dir), "/tmp/kmig-tls-%d", (int)getpid());
	snprintf(g_other, sizeof(g_other), "/tmp/kmig-tls-%d-other", (int)getpid());
	snprintf(cmd, sizeof(cmd), "tests/lib/make-certs.sh %s && tests/lib/make-certs.sh %s intruder",
		 g_dir, g_other);
	return system(cmd);
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	if (f) {
		fputs(text, f);
		fclose(f);
	}
}

static int add(struct tls_objects *o, const char *fmt, const char *dir)
{
	char spec[512], err[256];
	snprintf(spec, sizeof(spec), fmt, dir);
	int rc = tls_objects__add(o, spec, err, sizeof(err));
	if (rc && getenv("KMIG_TEST_VERBOSE"))
		printf("#   %s: %s\n", spec, err);
	return rc;
}

/* Objects with the test's PSK credentials as "ok"; returns them. */
static const struct tls_creds *psk_ok(struct t *t, struct tls_objects *o)
{
	char dir[128];
	tls_objects__init(o);
	snprintf(dir, sizeof(dir), "%s/psk", g_dir);
	T_CHECK_EQ(t, add(o, "tls-creds-psk,id=ok,dir=%s", dir), 0);
	return tls_objects__creds(o, "ok");
}

static void t_objects(struct t *t)
{
	struct tls_objects o;
	char psk[128], bad[160];
	tls_objects__init(&o);
	snprintf(psk, sizeof(psk), "%s/psk", g_dir);
	T_CHECK_EQ(t, add(&o, "tls-creds-psk,id=p,dir=%s", psk), 0);
	T_CHECK_EQ(t, add(&o, "tls-creds-psk,id=p,dir=%s", psk), -EEXIST);
	T_CHECK_EQ(t, add(&o, "tls-creds-psk,dir=%s", psk), -EINVAL);         /* no id */
	T_CHECK_EQ(t, add(&o, "tls-creds-psk,id=q%s", ""), -EINVAL);          /* no dir */
	T_CHECK_EQ(t, add(&o, "tls-creds-psk,id=q,dir=%s,colour=red", psk), -EINVAL);
	T_CHECK_EQ(t, add(&o, "tls-creds-psk,id=q,dir=%s,verify-peer=on", psk), -EINVAL);
	T_CHECK_EQ(t, add(&o, "tls-creds-nope,id=q,dir=%s", psk), -EINVAL);
	T_CHECK_EQ(t, add(&o, "tls-creds-psk,id=q,dir=%s", "/nonexistent"), -ENOENT);
	T_CHECK_EQ(t, add(&o, "tls-creds-x509,id=x,dir=%s", psk), -ENOENT);   /* no ca-cert */
	T_CHECK_EQ(t, add(&o, "tls-creds-x509,id=x,dir=%s/x509,verify-peer=maybe", g_dir), -EINVAL);
	T_CHECK_EQ(t, add(&o, "tls-creds-x509,id=x,dir=%s/x509", g_dir), 0);
	T_CHECK_EQ(t, add(&o, "authz-simple,id=a,identity=%s", "CN=source,,O=kmig"), 0);
	T_CHECK_EQ(t, add(&o, "authz-simple,id=b%s", ""), -EINVAL);           /* no identity */
	T_CHECK(t, tls_objects__creds(&o, "p") && tls_objects__creds(&o, "x") &&
		   !tls_objects__creds(&o, "q") && tls_objects__authz(&o, "a"));
	/* malformed key files: each line is checked */
	snprintf(bad, sizeof(bad), "%s/bad", g_dir);
	char cmd[200];
	snprintf(cmd, sizeof(cmd), "mkdir -p %s", bad);
	T_CHECK_EQ(t, system(cmd), 0);
	snprintf(cmd, sizeof(cmd), "%s/keys.psk", bad);
	const char *lines[] = { "qemu\n", "qemu:zz\n", ":00112233445566778899aabbccddeeff\n",
				"qemu:0011\n", "", "qemu:00112233445566778899aabbccddeeffX\n" };
	for (unsigned i = 0; i < sizeof(lines) / sizeof(lines[0]); i++) {
		write_file(cmd, lines[i]);
		T_CHECK_EQ(t, add(&o, "tls-creds-psk,id=bad,dir=%s", bad), -EINVAL);
	}
	/* a file without the client's user name: a server only */
	write_file(cmd, "other:00112233445566778899aabbccddeeff\n");
	T_CHECK_EQ(t, add(&o, "tls-creds-psk,id=srv,dir=%s", bad), 0);
	struct tls_config cfg;
	char err[256];
	T_CHECK_EQ(t, tls_config__resolve(&o, false, "srv", NULL, NULL, "tcp:h:1", &cfg, err,
					  sizeof(err)), -ENOENT);
	T_CHECK_EQ(t, tls_config__resolve(&o, true, "srv", NULL, NULL, "tcp::1", &cfg, err,
					  sizeof(err)), 0);
	T_CHECK_EQ(t, tls_config__resolve(&o, false, "missing", NULL, NULL, "tcp:h:1", &cfg, err,
					  sizeof(err)), -ENOENT);
	T_CHECK_EQ(t, tls_config__resolve(&o, false, "", NULL, NULL, "tcp:h:1", &cfg, err,
					  sizeof(err)), 0);
	T_CHECK(t, cfg.creds == NULL);
	/* x509 over unix needs a host name; tcp takes the URI's */
	T_CHECK_EQ(t, tls_config__resolve(&o, false, "x", NULL, NULL, "unix:/s", &cfg, err,
					  sizeof(err)), -EINVAL);
	T_CHECK_EQ(t, tls_config__resolve(&o, false, "x", NULL, NULL, "tcp:localhost:4", &cfg, err,
					  sizeof(err)), 0);
	T_CHECK(t, !strcmp(cfg.hostname, "localhost"));
	T_CHECK_EQ(t, tls_config__resolve(&o, true, "x", NULL, "nope", "tcp::4", &cfg, err,
					  sizeof(err)), -ENOENT);
	T_CHECK_EQ(t, add(&o, "tls-creds-x509,id=nopeer,dir=%s/x509,verify-peer=off", g_dir), 0);
	T_CHECK_EQ(t, tls_config__resolve(&o, true, "nopeer", NULL, "a", "tcp::4", &cfg, err,
					  sizeof(err)), -EINVAL);
	T_CHECK(t, strstr(err, "verify-peer") != NULL);
	tls_objects__destroy(&o);
}

/* ---- handshakes over a socketpair ---- */

struct side {
	struct mig_stream s;
	struct tls_config cfg;
	bool server;
	int rc;
	char err[256];
};

static void *side__run(void *arg)
{
	struct side *d = arg;
	d->rc = d->server ? tls__server(&d->s, &d->cfg, d->err, sizeof(d->err))
			  : tls__client(&d->s, &d->cfg, d->err, sizeof(d->err));
	return NULL;
}

/* Handshakes client (creds c, host) against server (creds sv, authz);
 * returns both results; streams stay open for the caller (pair[0] is
 * the client). */
static void handshake(struct side pair[2], const struct tls_creds *c, const char *host,
		      const struct tls_creds *sv, const struct tls_authz *authz)
{
	int sv_fds[2];
	memset(pair, 0, 2 * sizeof(*pair));
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv_fds) || mig_stream__init(&pair[0].s, sv_fds[0]) ||
	    mig_stream__init(&pair[1].s, sv_fds[1]))
		abort();
	pair[0].cfg.creds = c;
	snprintf(pair[0].cfg.hostname, sizeof(pair[0].cfg.hostname), "%s", host);
	pair[1].cfg.creds = sv;
	pair[1].cfg.authz = authz;
	pair[1].server = true;
	pthread_t th;
	pthread_create(&th, NULL, side__run, &pair[1]);
	side__run(&pair[0]);
	if (pair[0].rc)                 /* the server may wait for more */
		mig_stream__shutdown(&pair[0].s);
	pthread_join(th, NULL);
	if (getenv("KMIG_TEST_VERBOSE"))
		printf("#   client %d '%s', server %d '%s'\n", pair[0].rc, pair[0].err, pair[1].rc,
		       pair[1].err);
}

static void pair__close(struct side pair[2])
{
	mig_stream__close(&pair[0].s);
	mig_stream__close(&pair[1].s);
}

struct pump {
	struct mig_stream *s;
	size_t len;
	int rc;
};

static void *pump__write(void *arg)
{
	struct pump *p = arg;
	uint8_t *buf = malloc(p->len);
	for (size_t i = 0; i < p->len; i++)
		buf[i] = (uint8_t)(i * 7 + i / 4096);
	p->rc = mig_stream__write(p->s, buf, p->len);
	if (!p->rc)
		p->rc = mig_stream__flush(p->s);
	free(buf);
	return NULL;
}

/* 3 MiB each way at once (one writer and one reader per stream). */
static void check_traffic(struct t *t, struct side pair[2])
{
	const size_t len = 3u << 20;
	struct pump a = { &pair[0].s, len, 0 }, b = { &pair[1].s, len, 0 };
	pthread_t ta, tb;
	pthread_create(&ta, NULL, pump__write, &a);
	pthread_create(&tb, NULL, pump__write, &b);
	uint8_t *in0 = malloc(len), *in1 = malloc(len);
	T_CHECK_EQ(t, mig_stream__read_full(&pair[1].s, in1, len), 0);
	T_CHECK_EQ(t, mig_stream__read_full(&pair[0].s, in0, len), 0);
	pthread_join(ta, NULL);
	pthread_join(tb, NULL);
	T_CHECK_EQ(t, a.rc, 0);
	T_CHECK_EQ(t, b.rc, 0);
	bool same = true;
	for (size_t i = 0; i < len; i++)
		same &= in0[i] == (uint8_t)(i * 7 + i / 4096) && in1[i] == in0[i];
	T_CHECK(t, same);
	T_CHECK_EQ(t, mig_stream__bytes_out(&pair[0].s), len);
	T_CHECK_EQ(t, mig_stream__bytes_in(&pair[1].s), len);
	free(in0);
	free(in1);
}

/* Writes a marker on `from` and reads the raw bytes at `to`'s socket:
 * true if the marker is seen in clear. */
static bool marker_in_clear(struct t *t, struct mig_stream *from, struct mig_stream *to)
{
	static const char marker[] = "kmig plaintext marker 0123456789";
	char raw[8192];
	for (int i = 0; i < 32; i++)
		T_CHECK_EQ(t, mig_stream__write(from, marker, sizeof(marker)), 0);
	T_CHECK_EQ(t, mig_stream__flush(from), 0);
	size_t got = 0;
	while (got < 32 * sizeof(marker)) {
		ssize_t r = recv(to->fd, raw + got, sizeof(raw) - got, 0);
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	return memmem(raw, got, marker, sizeof(marker)) != NULL;
}

static void t_psk(struct t *t)
{
	struct tls_objects o;
	struct side pair[2];
	char dir[128];
	tls_objects__init(&o);
	snprintf(dir, sizeof(dir), "%s/psk", g_dir);
	T_CHECK_EQ(t, add(&o, "tls-creds-psk,id=ok,dir=%s", dir), 0);
	snprintf(dir, sizeof(dir), "%s/psk", g_other);
	T_CHECK_EQ(t, add(&o, "tls-creds-psk,id=wrong,dir=%s", dir), 0);
	T_CHECK_EQ(t, add(&o, "authz-simple,id=qemu,identity=%s", "qemu"), 0);
	T_CHECK_EQ(t, add(&o, "authz-simple,id=other,identity=%s", "someone"), 0);
	const struct tls_creds *ok = tls_objects__creds(&o, "ok"), *wrong = tls_objects__creds(&o, "wrong");
	handshake(pair, ok, "", ok, tls_objects__authz(&o, "qemu"));
	T_CHECK_EQ(t, pair[0].rc, 0);
	T_CHECK_EQ(t, pair[1].rc, 0);
	if (!pair[0].rc && !pair[1].rc) {
		check_traffic(t, pair);
		T_CHECK(t, !marker_in_clear(t, &pair[0].s, &pair[1].s));
	}
	pair__close(pair);
	/* the check above sees a plain stream's bytes */
	int fds[2];
	T_CHECK_EQ(t, socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
	T_CHECK_EQ(t, mig_stream__init(&pair[0].s, fds[0]), 0);
	T_CHECK_EQ(t, mig_stream__init(&pair[1].s, fds[1]), 0);
	T_CHECK(t, marker_in_clear(t, &pair[0].s, &pair[1].s));
	pair__close(pair);
	/* same user name, another key: both sides fail, with a reason */
	handshake(pair, wrong, "", ok, NULL);
	T_CHECK(t, pair[0].rc < 0 && pair[1].rc < 0);
	T_CHECK(t, strstr(pair[0].err, "TLS") && strstr(pair[1].err, "TLS"));
	T_CHECK(t, mig_stream__error(&pair[0].s) < 0);
	pair__close(pair);
	/* the right key, a user tls-authz does not name */
	handshake(pair, ok, "", ok, tls_objects__authz(&o, "other"));
	T_CHECK_EQ(t, pair[1].rc, -EACCES);
	T_CHECK(t, strstr(pair[1].err, "not authorized"));
	T_CHECK_EQ(t, pair[0].rc, -ECONNABORTED);       /* the client hears why */
	T_CHECK(t, strstr(pair[0].err, "did not accept") && strstr(pair[0].err, "denied"));
	pair__close(pair);
	tls_objects__destroy(&o);
}

/* A TLS stream moved into another struct (mig_stream__move, as the
 * destination does with a connection it holds) goes on working: its
 * session's transport follows it.  The structs it left are poisoned, so
 * a session still pointing at one would fail. */
static void t_move(struct t *t)
{
	struct tls_objects o;
	struct side pair[2], moved[2];
	char dir[128];
	tls_objects__init(&o);
	snprintf(dir, sizeof(dir), "%s/psk", g_dir);
	T_CHECK_EQ(t, add(&o, "tls-creds-psk,id=ok,dir=%s", dir), 0);
	const struct tls_creds *ok = tls_objects__creds(&o, "ok");
	handshake(pair, ok, "", ok, NULL);
	T_CHECK(t, !pair[0].rc && !pair[1].rc);
	if (!pair[0].rc && !pair[1].rc) {
		memset(moved, 0, sizeof(moved));
		for (int i = 0; i < 2; i++) {
			mig_stream__move(&moved[i].s, &pair[i].s);
			T_CHECK_EQ(t, pair[i].s.fd, -1);
			memset(&pair[i].s, 0xa5, sizeof(pair[i].s));
		}
		check_traffic(t, moved);
		pair__close(moved);
	} else {
		pair__close(pair);
	}
	tls_objects__destroy(&o);
}

static void t_x509(struct t *t)
{
	struct tls_objects o;
	struct side pair[2];
	tls_objects__init(&o);
	T_CHECK_EQ(t, add(&o, "tls-creds-x509,id=ok,dir=%s/x509", g_dir), 0);
	T_CHECK_EQ(t, add(&o, "tls-creds-x509,id=intruder,dir=%s/x509", g_other), 0);
	T_CHECK_EQ(t, add(&o, "authz-simple,id=src,identity=%s", "CN=source,,O=kmig"), 0);
	T_CHECK_EQ(t, add(&o, "authz-simple,id=someone,identity=%s", "CN=someone,,O=kmig"), 0);
	const struct tls_creds *ok = tls_objects__creds(&o, "ok");
	const struct tls_creds *bad = tls_objects__creds(&o, "intruder");
	handshake(pair, ok, "localhost", ok, tls_objects__authz(&o, "src"));
	T_CHECK_EQ(t, pair[0].rc, 0);
	T_CHECK_EQ(t, pair[1].rc, 0);
	if (!pair[0].rc && !pair[1].rc)
		check_traffic(t, pair);
	pair__close(pair);
	handshake(pair, ok, "127.0.0.1", ok, NULL);     /* an IP address in the certificate */
	T_CHECK(t, !pair[0].rc && !pair[1].rc);
	pair__close(pair);
	/* the server's certificate does not carry this name */
	handshake(pair, ok, "elsewhere.example", ok, NULL);
	T_CHECK(t, pair[0].rc < 0 && strstr(pair[0].err, "certificate"));
	T_CHECK(t, pair[1].rc < 0);
	pair__close(pair);
	/* a server from another CA; a client from another CA */
	handshake(pair, ok, "localhost", bad, NULL);
	T_CHECK(t, pair[0].rc < 0 && pair[1].rc < 0);
	pair__close(pair);
	handshake(pair, bad, "localhost", ok, NULL);
	T_CHECK(t, pair[0].rc < 0 && pair[1].rc < 0);
	pair__close(pair);
	/* a client that trusts the server but whose own certificate is from
	 * another CA: the server refuses it, and the client hears so */
	char cmd[512];
	snprintf(cmd, sizeof(cmd), "mkdir -p %s/mixed && cp %s/x509/ca-cert.pem %s/mixed/ && "
		 "cp %s/x509/client-*.pem %s/mixed/", g_dir, g_dir, g_dir, g_other, g_dir);
	T_CHECK_EQ(t, system(cmd), 0);
	T_CHECK_EQ(t, add(&o, "tls-creds-x509,id=mixed,dir=%s/mixed,endpoint=client", g_dir), 0);
	handshake(pair, tls_objects__creds(&o, "mixed"), "localhost", ok, NULL);
	T_CHECK(t, pair[1].rc < 0 && strstr(pair[1].err, "certificate"));
	T_CHECK(t, pair[0].rc < 0 && strstr(pair[0].err, "did not accept"));
	pair__close(pair);
	/* a trusted client that tls-authz does not name */
	handshake(pair, ok, "localhost", ok, tls_objects__authz(&o, "someone"));
	T_CHECK_EQ(t, pair[1].rc, -EACCES);
	T_CHECK(t, strstr(pair[1].err, "'CN=source,O=kmig' is not authorized"));
	T_CHECK(t, pair[0].rc < 0 && strstr(pair[0].err, "denied"));
	pair__close(pair);
	tls_objects__destroy(&o);
}

/* A TLS client against a plain reader, and a server against a peer
 * that never speaks: clean errors, the second ended by a cancel. */
static void t_mismatch_and_cancel(struct t *t)
{
	struct tls_objects o;
	int fds[2];
	struct tls_config cfg = { .creds = psk_ok(t, &o) };
	struct mig_stream plain, tls;
	T_CHECK_EQ(t, socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
	T_CHECK_EQ(t, mig_stream__init(&plain, fds[0]), 0);
	T_CHECK_EQ(t, mig_stream__init(&tls, fds[1]), 0);
	struct side srv = { .cfg = cfg, .server = true };
	srv.s = tls;
	pthread_t th;
	pthread_create(&th, NULL, side__run, &srv);
	/* the plain peer sends a record, which is not a ClientHello */
	T_CHECK_EQ(t, mig_stream__put_record(&plain, PROTO_END, 0, NULL, 0), 0);
	T_CHECK_EQ(t, mig_stream__flush(&plain), 0);
	pthread_join(th, NULL);
	T_CHECK(t, srv.rc < 0 && strstr(srv.err, "TLS"));
	mig_stream__close(&srv.s);
	mig_stream__close(&plain);
	/* a silent peer: shutdown ends the handshake at once */
	T_CHECK_EQ(t, socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
	T_CHECK_EQ(t, mig_stream__init(&plain, fds[0]), 0);
	struct side cli = { .cfg = cfg };
	T_CHECK_EQ(t, mig_stream__init(&cli.s, fds[1]), 0);
	uint64_t t0 = time__now_ms();
	pthread_create(&th, NULL, side__run, &cli);
	time__sleep_ns(200000000ull);
	mig_stream__shutdown(&cli.s);
	pthread_join(th, NULL);
	T_CHECK_EQ(t, cli.rc, -ECANCELED);
	T_CHECK(t, time__now_ms() - t0 < 2000);
	mig_stream__close(&cli.s);
	/* a silent peer and the connect's cancel flag */
	atomic_bool cancel = false;
	T_CHECK_EQ(t, socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
	struct side cli2 = { .cfg = cfg };
	T_CHECK_EQ(t, mig_stream__init(&cli2.s, fds[1]), 0);
	cli2.s.cancel = &cancel;
	t0 = time__now_ms();
	pthread_create(&th, NULL, side__run, &cli2);
	time__sleep_ns(200000000ull);
	atomic_store(&cancel, true);
	pthread_join(th, NULL);
	T_CHECK_EQ(t, cli2.rc, -ECANCELED);
	T_CHECK(t, time__now_ms() - t0 < 2000);
	mig_stream__close(&cli2.s);
	mig_stream__close(&plain);
	close(fds[0]);
	tls_objects__destroy(&o);
}

/* With a rate limit the stream still sends at about that rate through
 * TLS (records are at most 16 KiB; the limiter is charged per chunk). */
static void t_rate_limit(struct t *t)
{
	struct tls_objects o;
	struct side pair[2];
	const struct tls_creds *ok = psk_ok(t, &o);
	handshake(pair, ok, "", ok, NULL);
	T_CHECK(t, !pair[0].rc && !pair[1].rc);
	mig_stream__set_rate(&pair[0].s, 10u << 20);
	uint64_t t0 = time__now_ms();
	struct pump a = { &pair[0].s, 2u << 20, 0 };
	pthread_t th;
	pthread_create(&th, NULL, pump__write, &a);
	uint8_t *in = malloc(a.len);
	T_CHECK_EQ(t, mig_stream__read_full(&pair[1].s, in, a.len), 0);
	pthread_join(th, NULL);
	uint64_t ms = time__now_ms() - t0;
	printf("# 2 MiB at 10 MiB/s through TLS took %llu ms\n", (unsigned long long)ms);
	T_CHECK(t, ms >= 120 && ms < 1500);   /* the limit holds, and is not far below */
	free(in);
	pair__close(pair);
	tls_objects__destroy(&o);
}

/* The source's look at the return path reads through TLS: a record the
 * destination sends is seen, also after a sticky write error; bytes
 * injected in clear into the connection are never taken as one. */
static void t_peek_answer(struct t *t)
{
	struct tls_objects o;
	struct side pair[2];
	uint8_t buf[4200];
	const uint8_t *payload;
	struct proto_hdr h;
	const struct tls_creds *ok = psk_ok(t, &o);
	handshake(pair, ok, "", ok, NULL);
	T_CHECK_EQ(t, mig_stream__peek_answer(&pair[0].s, 0, &h, &payload, buf, sizeof(buf)), 0);
	uint8_t rec[64];
	ssize_t n = proto__encode_rp_fail(rec, sizeof(rec), 71, "no");
	T_CHECK(t, n > 0);
	T_CHECK_EQ(t, mig_stream__write(&pair[1].s, rec, (size_t)n), 0);
	T_CHECK_EQ(t, mig_stream__flush(&pair[1].s), 0);
	mig_stream__fail(&pair[0].s, -EPIPE, "write: Broken pipe");  /* sticky */
	T_CHECK_EQ(t, mig_stream__peek_answer(&pair[0].s, 500, &h, &payload, buf, sizeof(buf)), 1);
	T_CHECK_EQ(t, h.type, PROTO_RP_FAIL);
	pair__close(pair);
	/* an RP_FAIL in clear, written past TLS onto the socket */
	handshake(pair, ok, "", ok, NULL);
	T_CHECK_EQ(t, send(pair[1].s.fd, rec, (size_t)n, 0), n);
	T_CHECK_EQ(t, mig_stream__peek_answer(&pair[0].s, 500, &h, &payload, buf, sizeof(buf)), 0);
	pair__close(pair);
	tls_objects__destroy(&o);
}

/* A key update from the peer (which GnuTLS would answer from inside the
 * read, racing the thread that writes) ends the session at the reader:
 * the read fails, nothing after the update is taken as data. */
static void t_key_update_refused(struct t *t)
{
	struct tls_objects o;
	struct side pair[2];
	const struct tls_creds *ok = psk_ok(t, &o);
	handshake(pair, ok, "", ok, NULL);
	T_CHECK_EQ(t, pair[0].rc, 0);
	T_CHECK_EQ(t, pair[1].rc, 0);
	uint8_t b = 0;
	T_CHECK_EQ(t, mig_stream__write(&pair[0].s, "a", 1), 0);
	T_CHECK_EQ(t, mig_stream__flush(&pair[0].s), 0);
	T_CHECK_EQ(t, mig_stream__read_full(&pair[1].s, &b, 1), 0);
	T_CHECK_EQ(t, b, 'a');
	gnutls_session_t ses = pair[0].s.tls;
	T_CHECK_EQ(t, gnutls_session_key_update(ses, GNUTLS_KU_PEER), 0);
	T_CHECK_EQ(t, mig_stream__write(&pair[0].s, "b", 1), 0);
	T_CHECK_EQ(t, mig_stream__flush(&pair[0].s), 0);
	mig_stream__set_read_deadline(&pair[1].s, time__now_ms() + 2000);
	int rc = mig_stream__read_full(&pair[1].s, &b, 1);
	T_CHECK_EQ(t, rc, -ECONNABORTED);
	T_CHECK(t, strstr(mig_stream__strerror(&pair[1].s), "TLS read"));
	pair__close(pair);
	/* both directions' traffic still works without one (the control) */
	handshake(pair, ok, "", ok, NULL);
	check_traffic(t, pair);
	pair__close(pair);
	tls_objects__destroy(&o);
}

/* keys.psk is read once: CRLF lines work, a name twice or a NUL byte is
 * refused, and a file changed afterwards changes nothing. */
static void t_psk_file(struct t *t)
{
	struct tls_objects o;
	struct side pair[2];
	char dir[160], path[200], cmd[400];
	const char *key = "00112233445566778899aabbccddeeff";
	tls_objects__init(&o);
	snprintf(dir, sizeof(dir), "%s/pskfile", g_dir);
	snprintf(path, sizeof(path), "%s/keys.psk", dir);
	snprintf(cmd, sizeof(cmd), "mkdir -p %s", dir);
	T_CHECK_EQ(t, system(cmd), 0);
	char text[200];
	snprintf(text, sizeof(text), "other:%s\r\nqemu:%s\r\n", key, key);
	write_file(path, text);
	T_CHECK_EQ(t, add(&o, "tls-creds-psk,id=crlf,dir=%s", dir), 0);
	const struct tls_creds *c = tls_objects__creds(&o, "crlf");
	T_CHECK(t, c && c->psk_nkeys == 2);
	write_file(path, "qemu:ffffffffffffffffffffffffffffffff\n");  /* changed afterwards */
	handshake(pair, c, "", c, NULL);
	T_CHECK(t, !pair[0].rc && !pair[1].rc);
	pair__close(pair);
	snprintf(text, sizeof(text), "qemu:%s\nqemu:%s\n", key, key);
	write_file(path, text);
	T_CHECK_EQ(t, add(&o, "tls-creds-psk,id=twice,dir=%s", dir), -EINVAL);
	FILE *f = fopen(path, "w");
	if (f) {
		fprintf(f, "qemu:%s\n", key);
		fputc(0, f);
		fprintf(f, "evil:%s\n", key);
		fclose(f);
	}
	T_CHECK_EQ(t, add(&o, "tls-creds-psk,id=nul,dir=%s", dir), -EINVAL);
	tls_objects__destroy(&o);
}

int main(void)
{
	struct t t = { 0 };
	if (make_certs()) {
		printf("not ok make_certs: tests/lib/make-certs.sh failed (certtool, psktool?)\n");
		return 1;
	}
	T_RUN(&t, t_objects);
	T_RUN(&t, t_psk);
	T_RUN(&t, t_move);
	T_RUN(&t, t_x509);
	T_RUN(&t, t_mismatch_and_cancel);
	T_RUN(&t, t_rate_limit);
	T_RUN(&t, t_peek_answer);
	T_RUN(&t, t_psk_file);
	T_RUN(&t, t_key_update_refused);
	char cmd[200];
	snprintf(cmd, sizeof(cmd), "rm -rf %s %s", g_dir, g_other);
	if (system(cmd))
		printf("# could not remove %s\n", g_dir);
	return T_DONE(&t);
}
