/* TLS handshakes of migration streams; see tls.h. */
#include "mig/wire/tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <stdio.h>
#include <string.h>

#include "base/timeutil.h"
#include "base/utf8.h"
#include "mig/wire/stream.h"

/* TLS 1.3 only; PSK with an (EC)DHE exchange preferred, for forward secrecy. */
#define TLS_PRIO_X509 "NORMAL:-VERS-ALL:+VERS-TLS1.3"
#define TLS_PRIO_PSK  "NORMAL:-VERS-ALL:+VERS-TLS1.3:+ECDHE-PSK:+DHE-PSK:+PSK"

static bool tls__is_ip(const char *h)
{
	unsigned char a[16];
	return inet_pton(AF_INET, h, a) == 1 || inet_pton(AF_INET6, h, a) == 1;
}

/* A failed handshake: the stream's own error (cancel, deadline, EOF)
 * where there is one, else GnuTLS's reason. */
static int tls__fail(struct mig_stream *s, gnutls_session_t ses, int r, char *err, size_t errlen)
{
	char detail[160] = "";
	if (!mig_stream__error(s))      /* tell the peer why, unless the link is gone */
		(void)gnutls_alert_send_appropriate(ses, r);
	if (r == GNUTLS_E_FATAL_ALERT_RECEIVED) {
		snprintf(detail, sizeof(detail), " (the peer says: %s)",
			 gnutls_alert_get_name(gnutls_alert_get(ses)));
	} else if (r == GNUTLS_E_CERTIFICATE_VERIFICATION_ERROR) {
		gnutls_datum_t out = { 0 };
		unsigned status = gnutls_session_get_verify_cert_status(ses);
		if (!gnutls_certificate_verification_status_print(status, GNUTLS_CRT_X509, &out, 0)) {
			snprintf(detail, sizeof(detail), "%s", (const char *)out.data);
			gnutls_free(out.data);
			size_t n = strlen(detail);
			while (n && detail[n - 1] == ' ')
				detail[--n] = 0;
		}
	}
	int e = mig_stream__error(s);
	if (!e && atomic_load(&s->shut))        /* shutdown wins, as in stream.c */
		e = mig_stream__fail(s, -ECANCELED, "stream shut down (cancelled)");
	if (!e)
		e = mig_stream__fail(s, -ECONNABORTED, "TLS handshake failed: %s%s",
				     gnutls_strerror(r), detail);
	if (e == -ECONNABORTED && r == GNUTLS_E_CERTIFICATE_VERIFICATION_ERROR && detail[0])
		snprintf(err, errlen, "TLS handshake failed: certificate check: %s", detail);
	else if (e == -ECONNABORTED)
		snprintf(err, errlen, "TLS handshake failed: %s%s", gnutls_strerror(r), detail);
	else
		snprintf(err, errlen, "TLS handshake failed: %s", mig_stream__strerror(s));
	utf8__sanitize(err);
	return e;
}

/* A key update from the peer is refused (the session ends): taking one,
 * GnuTLS rotates key state the writing thread uses too (and marks an
 * answer for the next send), while post-copy has one thread writing and
 * another reading each stream.  kmig never sends one: its sessions are
 * made with GNUTLS_NO_AUTO_REKEY (GnuTLS would otherwise update its keys
 * by itself after 2^24 records sent).  So one key serves a whole stream:
 * TLS 1.3 counsels a new AES-GCM key after about 2^24.5 full records
 * (some 380 GiB on one connection), which kmig does not enforce. */
static int tls__no_key_update(gnutls_session_t ses, unsigned htype, unsigned when,
			      unsigned incoming, const gnutls_datum_t *msg)
{
	(void)ses, (void)htype, (void)when, (void)msg;
	return incoming ? GNUTLS_E_UNEXPECTED_HANDSHAKE_PACKET : 0;
}

static int tls__session(struct mig_stream *s, const struct tls_creds *c, bool server,
			gnutls_session_t *out, char *err, size_t errlen)
{
	gnutls_session_t ses;
	int r = gnutls_init(&ses, (server ? GNUTLS_SERVER : GNUTLS_CLIENT) | GNUTLS_NO_TICKETS |
			    GNUTLS_NO_AUTO_REKEY);
	if (r < 0) {
		snprintf(err, errlen, "TLS: %s", gnutls_strerror(r));
		return mig_stream__fail(s, -ENOMEM, "%s", err);
	}
	mig_stream__attach_tls(s, ses);     /* the stream frees it from now on */
	gnutls_session_set_ptr(ses, (void *)c); /* for the PSK key lookup (tls_psk.c) */
	gnutls_handshake_set_hook_function(ses, GNUTLS_HANDSHAKE_KEY_UPDATE, GNUTLS_HOOK_PRE,
					   tls__no_key_update);
	const char *errpos = NULL;
	r = gnutls_priority_set_direct(ses, c->kind == TLS_PSK ? TLS_PRIO_PSK : TLS_PRIO_X509,
				       &errpos);
	if (r >= 0) {
		void *cred = server ? c->server_creds : c->client_creds;
		r = gnutls_credentials_set(ses, c->kind == TLS_PSK ? GNUTLS_CRD_PSK :
					   GNUTLS_CRD_CERTIFICATE, cred);
	}
	if (r < 0) {
		snprintf(err, errlen, "TLS setup: %s", gnutls_strerror(r));
		return mig_stream__fail(s, -EINVAL, "%s", err);
	}
	*out = ses;
	return 0;
}

/* The handshake, under the read deadline the caller has set. */
static int tls__handshake(struct mig_stream *s, gnutls_session_t ses, char *err, size_t errlen)
{
	int r;
	do
		r = gnutls_handshake(ses);
	while (r < 0 && !gnutls_error_is_fatal(r) && !mig_stream__error(s));
	return r < 0 ? tls__fail(s, ses, r, err, errlen) : 0;
}

/* In TLS 1.3 the client's handshake ends before the server has checked
 * the client (its certificate, tls-authz): the server then sends one
 * byte, TLS_ACCEPT, or an alert, and the client waits for it, so a
 * refused source says why instead of failing later on a broken pipe. */
#define TLS_ACCEPT 0x01

static int tls__wait_accept(struct mig_stream *s, char *err, size_t errlen)
{
	uint8_t b = 0;
	int rc = mig_stream__read_full(s, &b, 1);
	if (!rc && b != TLS_ACCEPT)
		rc = mig_stream__fail(s, -EPROTO, "not a TLS acceptance byte (0x%02x)", b);
	if (rc) {
		snprintf(err, errlen, "TLS: the destination did not accept the session: %s",
			 mig_stream__strerror(s));
		utf8__sanitize(err);
	}
	return rc;
}

static int tls__accept(struct mig_stream *s, char *err, size_t errlen)
{
	static const uint8_t ok = TLS_ACCEPT;
	int rc = mig_stream__write(s, &ok, 1);
	if (!rc)
		rc = mig_stream__flush(s);
	if (rc)
		snprintf(err, errlen, "TLS: %s", mig_stream__strerror(s));
	return rc;
}

int tls__client(struct mig_stream *s, const struct tls_config *cfg, char *err, size_t errlen)
{
	const struct tls_creds *c = cfg->creds;
	gnutls_session_t ses;
	int rc = tls__session(s, c, false, &ses, err, errlen);
	if (rc)
		return rc;
	if (c->kind == TLS_X509) {
		if (!tls__is_ip(cfg->hostname))
			(void)gnutls_server_name_set(ses, GNUTLS_NAME_DNS, cfg->hostname,
						     strlen(cfg->hostname));
		gnutls_session_set_verify_cert(ses, cfg->hostname, 0);
	}
	/* one deadline for the handshake and the destination's answer */
	mig_stream__set_read_deadline(s, time__now_ms() + TLS_HANDSHAKE_MS);
	rc = tls__handshake(s, ses, err, errlen);
	if (!rc)
		rc = tls__wait_accept(s, err, errlen);
	mig_stream__set_read_deadline(s, 0);
	return rc;
}

/* The client's identity: its PSK user name or certificate DN (cut to
 * len); false if it has none. */
static bool tls__peer_name(gnutls_session_t ses, const struct tls_creds *c, char *who, size_t len)
{
	who[0] = 0;
	if (c->kind == TLS_PSK) {
		const char *u = gnutls_psk_server_get_username(ses);
		snprintf(who, len, "%s", u ? u : "");
		return u != NULL;
	}
	unsigned n = 0;
	const gnutls_datum_t *certs = gnutls_certificate_get_peers(ses, &n);
	gnutls_x509_crt_t crt;
	gnutls_datum_t dn = { 0 };
	if (!certs || !n || gnutls_x509_crt_init(&crt) < 0)
		return false;
	int r = gnutls_x509_crt_import(crt, &certs[0], GNUTLS_X509_FMT_DER);
	if (r >= 0)
		r = gnutls_x509_crt_get_dn3(crt, &dn, 0);
	if (r >= 0)
		snprintf(who, len, "%.*s", (int)dn.size, (const char *)dn.data);
	gnutls_free(dn.data);
	gnutls_x509_crt_deinit(crt);
	return r >= 0 && strlen(who) == dn.size;
}

/* Whether the client is the one authz-simple names (its PSK user name or
 * certificate DN, compared whole); *who gets it for messages (cut). */
static bool tls__authorized(gnutls_session_t ses, const struct tls_creds *c,
			    const char *identity, char *who, size_t len)
{
	return tls__peer_name(ses, c, who, len) && !strcmp(who, identity);
}

int tls__peer(struct mig_stream *s, const struct tls_config *cfg, char *who, size_t len)
{
	if (!s->tls || !cfg->creds || !len)
		return -EINVAL;
	return tls__peer_name(s->tls, cfg->creds, who, len) ? 0 : -ENOENT;
}

int tls__server(struct mig_stream *s, const struct tls_config *cfg, char *err, size_t errlen)
{
	const struct tls_creds *c = cfg->creds;
	gnutls_session_t ses;
	int rc = tls__session(s, c, true, &ses, err, errlen);
	if (rc)
		return rc;
	if (c->kind == TLS_X509 && c->verify_peer) {
		gnutls_certificate_server_set_request(ses, GNUTLS_CERT_REQUIRE);
		gnutls_session_set_verify_cert(ses, NULL, 0);
	}
	mig_stream__set_read_deadline(s, time__now_ms() + TLS_HANDSHAKE_MS);
	rc = tls__handshake(s, ses, err, errlen);
	mig_stream__set_read_deadline(s, 0);
	if (rc)
		return rc;
	if (!cfg->authz)
		return tls__accept(s, err, errlen);
	char who[256] = "";
	if (!tls__authorized(ses, c, cfg->authz->identity, who, sizeof(who))) {
		(void)gnutls_alert_send(ses, GNUTLS_AL_FATAL, GNUTLS_A_ACCESS_DENIED);
		snprintf(err, errlen, "TLS: client '%s' is not authorized by '%s'", who, cfg->authz->id);
		utf8__sanitize(err);
		return mig_stream__fail(s, -EACCES, "%s", err);
	}
	return tls__accept(s, err, errlen);
}
