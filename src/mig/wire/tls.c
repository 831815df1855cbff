/* TLS credential and authorization objects; see tls.h. */
#include "mig/wire/tls.h"

#include <errno.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/utf8.h"
#include "mig/wire/tls_impl.h"
#include "mig/wire/stream.h"

void tls_objects__init(struct tls_objects *o)
{
	memset(o, 0, sizeof(*o));
}

static void tls_creds__free(struct tls_creds *c)
{
	if (c->kind == TLS_PSK) {
		tls_psk__free(c);
	} else {
		if (c->server_creds)
			gnutls_certificate_free_credentials(c->server_creds);
		if (c->client_creds)
			gnutls_certificate_free_credentials(c->client_creds);
	}
	c->server_creds = c->client_creds = NULL;
}

void tls_objects__destroy(struct tls_objects *o)
{
	for (unsigned i = 0; i < o->ncreds; i++)
		tls_creds__free(&o->creds[i]);
	explicit_bzero(o, sizeof(*o));
}

const struct tls_creds *tls_objects__creds(const struct tls_objects *o, const char *id)
{
	for (unsigned i = 0; i < o->ncreds; i++)
		if (!strcmp(o->creds[i].id, id))
			return &o->creds[i];
	return NULL;
}

const struct tls_authz *tls_objects__authz(const struct tls_objects *o, const char *id)
{
	for (unsigned i = 0; i < o->nauthz; i++)
		if (!strcmp(o->authz[i].id, id))
			return &o->authz[i];
	return NULL;
}

/* ---- X.509 ---- */

static bool tls__file_exists(const char *dir, const char *name, char *path, size_t len)
{
	snprintf(path, len, "%s/%s", dir, name);
	return access(path, R_OK) == 0;
}

/* One credentials structure: the CA, and our own pair if `who` has one. */
static int tls_x509__creds(struct tls_creds *c, const char *who, void **out, bool *has,
			   char *err, size_t errlen)
{
	char ca[300], cert[300], key[300], name[32];
	gnutls_certificate_credentials_t xc;
	if (!tls__file_exists(c->dir, "ca-cert.pem", ca, sizeof(ca)))
		return utf8__err(err, errlen, -ENOENT, "%s: %s", ca, strerror(errno));
	if (gnutls_certificate_allocate_credentials(&xc) < 0)
		return utf8__err(err, errlen, -ENOMEM, "out of memory");
	*out = xc;
	int r = gnutls_certificate_set_x509_trust_file(xc, ca, GNUTLS_X509_FMT_PEM);
	if (r <= 0)
		return utf8__err(err, errlen, -EINVAL, "%s: no CA certificate (%s)", ca,
				r < 0 ? gnutls_strerror(r) : "empty");
	snprintf(name, sizeof(name), "%s-cert.pem", who);
	bool have_cert = tls__file_exists(c->dir, name, cert, sizeof(cert));
	snprintf(name, sizeof(name), "%s-key.pem", who);
	bool have_key = tls__file_exists(c->dir, name, key, sizeof(key));
	if (have_cert != have_key)
		return utf8__err(err, errlen, -ENOENT, "%s: %s without %s", c->dir,
				have_cert ? cert : key, have_cert ? key : cert);
	*has = have_cert;
	char crl[300];                  /* revoked certificates, as QEMU reads them */
	if (tls__file_exists(c->dir, "ca-crl.pem", crl, sizeof(crl)) &&
	    (r = gnutls_certificate_set_x509_crl_file(xc, crl, GNUTLS_X509_FMT_PEM)) < 0)
		return utf8__err(err, errlen, -EINVAL, "%s: %s", crl, gnutls_strerror(r));
	if (have_cert && (r = gnutls_certificate_set_x509_key_file(xc, cert, key,
								   GNUTLS_X509_FMT_PEM)) < 0)
		return utf8__err(err, errlen, -EINVAL, "%s, %s: %s", cert, key, gnutls_strerror(r));
	return 0;
}

static int tls_x509__load(struct tls_creds *c, char *err, size_t errlen)
{
	int rc = 0;
	if (c->endpoint != TLS_ENDPOINT_CLIENT)
		rc = tls_x509__creds(c, "server", &c->server_creds, &c->has_server, err, errlen);
	if (!rc && c->endpoint != TLS_ENDPOINT_SERVER)
		rc = tls_x509__creds(c, "client", &c->client_creds, &c->has_client, err, errlen);
	if (!rc && c->endpoint == TLS_ENDPOINT_SERVER && !c->has_server)
		rc = utf8__err(err, errlen, -ENOENT, "%s: no server-cert.pem and server-key.pem", c->dir);
	return rc;
}

/* ---- object specs ---- */

static int tls__bool(const char *v, bool *out)
{
	if (!strcmp(v, "on") || !strcmp(v, "yes") || !strcmp(v, "true"))
		*out = true;
	else if (!strcmp(v, "off") || !strcmp(v, "no") || !strcmp(v, "false"))
		*out = false;
	else
		return -EINVAL;
	return 0;
}

static int tls__copy(char *dst, size_t cap, const char *v)
{
	if (!*v || strlen(v) >= cap)
		return -EINVAL;
	memcpy(dst, v, strlen(v) + 1);
	return 0;
}

/* One key=value of a creds object. */
static int tls_creds__prop(struct tls_creds *c, const char *k, const char *v)
{
	if (!strcmp(k, "id"))
		return tls__copy(c->id, sizeof(c->id), v);
	if (!strcmp(k, "dir"))
		return tls__copy(c->dir, sizeof(c->dir), v);
	if (!strcmp(k, "username") && c->kind == TLS_PSK)
		return tls__copy(c->username, sizeof(c->username), v);
	if (!strcmp(k, "verify-peer") && c->kind == TLS_X509)
		return tls__bool(v, &c->verify_peer);
	if (!strcmp(k, "endpoint")) {
		if (strcmp(v, "client") && strcmp(v, "server"))
			return -EINVAL;
		c->endpoint = !strcmp(v, "client") ? TLS_ENDPOINT_CLIENT : TLS_ENDPOINT_SERVER;
		return 0;
	}
	return -ENOENT;
}

static int tls_authz__prop(struct tls_authz *a, const char *k, const char *v)
{
	if (!strcmp(k, "id"))
		return tls__copy(a->id, sizeof(a->id), v);
	if (!strcmp(k, "identity"))
		return tls__copy(a->identity, sizeof(a->identity), v);
	return -ENOENT;
}

/* The next key=value of *p, ",," standing for a comma; NULL at the end. */
static char *tls__next_prop(char **p)
{
	char *start = *p, *w = *p, *r = *p;
	if (!*start)
		return NULL;
	while (*r) {
		if (*r == ',' && r[1] == ',') {
			*w++ = ',';
			r += 2;
		} else if (*r == ',') {
			r++;
			break;
		} else {
			*w++ = *r++;
		}
	}
	*p = r;
	*w = 0;
	return start;
}

static int tls__parse(char *props, struct tls_creds *c, struct tls_authz *a,
		      char *err, size_t errlen)
{
	for (char *kv; (kv = tls__next_prop(&props));) {
		char *eq = strchr(kv, '=');
		if (!eq)
			return utf8__err(err, errlen, -EINVAL, "'%s': want key=value", kv);
		*eq = 0;
		int r = c ? tls_creds__prop(c, kv, eq + 1) : tls_authz__prop(a, kv, eq + 1);
		if (r == -ENOENT)
			return utf8__err(err, errlen, -EINVAL, "unknown property '%s'", kv);
		if (r)
			return utf8__err(err, errlen, -EINVAL, "bad value for '%s': '%s'", kv, eq + 1);
	}
	const char *id = c ? c->id : a->id;
	if (!id[0])
		return utf8__err(err, errlen, -EINVAL, "an id=... is required");
	for (const char *p = id; *p; p++)
		if (*p <= ' ' || *p >= 0x7f)
			return utf8__err(err, errlen, -EINVAL, "id '%s': printable ASCII only", id);
	if (c && !c->dir[0])
		return utf8__err(err, errlen, -EINVAL, "a dir=... is required");
	if (a && !a->identity[0])
		return utf8__err(err, errlen, -EINVAL, "an identity=... is required");
	return 0;
}

static int tls_objects__add_creds(struct tls_objects *o, enum tls_kind kind, char *props,
				  char *err, size_t errlen)
{
	struct tls_creds *c = &o->creds[o->ncreds];
	memset(c, 0, sizeof(*c));
	c->kind = kind;
	c->verify_peer = true;
	snprintf(c->username, sizeof(c->username), "qemu");
	int rc = tls__parse(props, c, NULL, err, errlen);
	if (!rc && tls_objects__creds(o, c->id))
		rc = utf8__err(err, errlen, -EEXIST, "an object '%s' exists already", c->id);
	if (!rc)
		rc = kind == TLS_PSK ? tls_psk__load(c, err, errlen) : tls_x509__load(c, err, errlen);
	if (rc) {
		tls_creds__free(c);
		explicit_bzero(c, sizeof(*c));
		return rc;
	}
	o->ncreds++;
	return 0;
}

int tls_objects__add(struct tls_objects *o, const char *spec, char *err, size_t errlen)
{
	char buf[1024];
	if (strlen(spec) >= sizeof(buf))
		return utf8__err(err, errlen, -EINVAL, "object description too long");
	snprintf(buf, sizeof(buf), "%s", spec);
	char *comma = strchr(buf, ',');
	char *props = comma ? comma + 1 : buf + strlen(buf);
	if (comma)
		*comma = 0;
	bool creds = !strcmp(buf, "tls-creds-psk") || !strcmp(buf, "tls-creds-x509");
	if (!creds && strcmp(buf, "authz-simple"))
		return utf8__err(err, errlen, -EINVAL, "unknown object type '%s' (want tls-creds-psk, "
				"tls-creds-x509 or authz-simple)", buf);
	if ((creds ? o->ncreds : o->nauthz) >= TLS_MAX_OBJECTS)
		return utf8__err(err, errlen, -ENOSPC, "at most %d objects of a kind", TLS_MAX_OBJECTS);
	if (creds)
		return tls_objects__add_creds(o, !strcmp(buf, "tls-creds-psk") ? TLS_PSK : TLS_X509,
					      props, err, errlen);
	struct tls_authz *a = &o->authz[o->nauthz];
	memset(a, 0, sizeof(*a));
	int rc = tls__parse(props, NULL, a, err, errlen);
	if (!rc && tls_objects__authz(o, a->id))
		rc = utf8__err(err, errlen, -EEXIST, "an object '%s' exists already", a->id);
	if (!rc)
		o->nauthz++;
	return rc;
}

/* ---- per-migration configuration ---- */

static int tls_config__client(const struct tls_creds *c, const char *hostname, const char *uri,
			      struct tls_config *cfg, char *err, size_t errlen)
{
	struct mig_uri u;
	if (c->endpoint == TLS_ENDPOINT_SERVER)
		return utf8__err(err, errlen, -EINVAL, "tls-creds '%s' is for a server (endpoint=server)",
				c->id);
	if (!c->client_creds)
		return utf8__err(err, errlen, -ENOENT, "tls-creds '%s' has no key for user '%s'",
				c->id, c->username);
	if (hostname && hostname[0])
		snprintf(cfg->hostname, sizeof(cfg->hostname), "%s", hostname);
	else if (!mig_uri__parse(uri, &u, NULL, 0) && u.kind == MIG_URI_TCP)
		snprintf(cfg->hostname, sizeof(cfg->hostname), "%s", u.host);
	if (c->kind == TLS_X509 && !cfg->hostname[0])
		return utf8__err(err, errlen, -EINVAL, "tls-hostname is needed to check the "
				"destination's certificate when the URI is not tcp: (unix:, fd:)");
	return 0;
}

int tls_config__resolve(const struct tls_objects *o, bool server, const char *creds_id,
			const char *hostname, const char *authz_id, const char *uri,
			struct tls_config *cfg, char *err, size_t errlen)
{
	memset(cfg, 0, sizeof(*cfg));
	if (!creds_id || !creds_id[0])
		return 0;
	const struct tls_creds *c = tls_objects__creds(o, creds_id);
	if (!c)
		return utf8__err(err, errlen, -ENOENT, "No TLS credentials with id '%s'", creds_id);
	if (server) {
		if (c->endpoint == TLS_ENDPOINT_CLIENT)
			return utf8__err(err, errlen, -EINVAL, "tls-creds '%s' is for a client "
					"(endpoint=client)", c->id);
		if (c->kind == TLS_X509 && !c->has_server)
			return utf8__err(err, errlen, -ENOENT, "tls-creds '%s': no server-cert.pem and "
					"server-key.pem in %s", c->id, c->dir);
		if (authz_id && authz_id[0] && !(cfg->authz = tls_objects__authz(o, authz_id)))
			return utf8__err(err, errlen, -ENOENT, "No authorization object with id '%s'",
					authz_id);
		if (cfg->authz && c->kind == TLS_X509 && !c->verify_peer)
			return utf8__err(err, errlen, -EINVAL, "tls-authz '%s' needs client "
					 "certificates, but tls-creds '%s' has verify-peer=off",
					 authz_id, c->id);
	} else {
		int rc = tls_config__client(c, hostname, uri, cfg, err, errlen);
		if (rc)
			return rc;
	}
	cfg->creds = c;
	return 0;
}
