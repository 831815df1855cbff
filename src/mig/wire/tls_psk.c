/* Pre-shared keys: QEMU's keys.psk, read once and served from memory. */
#include <errno.h>
#include <gnutls/gnutls.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "mig/wire/tls_impl.h"

#define TLS_PSK_FILE_MAX (64u << 10)

static int hexval(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 :
	       c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* One line NAME:HEXKEY into k; false if malformed. */
static bool tls_psk__line(const char *l, size_t len, struct tls_psk_key *k)
{
	const char *colon = memchr(l, ':', len);
	size_t ulen = colon ? (size_t)(colon - l) : 0, klen = colon ? len - ulen - 1 : 0;
	if (!colon || !ulen || ulen >= sizeof(k->name) || klen < 32 || klen > 128 || klen % 2)
		return false;
	for (size_t i = 0; i < klen; i += 2) {
		int hi = hexval(colon[1 + i]), lo = hexval(colon[2 + i]);
		if (hi < 0 || lo < 0)
			return false;
		k->key[i / 2] = (unsigned char)(hi << 4 | lo);
	}
	memcpy(k->name, l, ulen);
	k->name[ulen] = 0;
	k->len = (unsigned)(klen / 2);
	return true;
}

/* Every line of buf[0..n) (no NUL inside; "\r\n" allowed), each name once. */
static int tls_psk__parse(struct tls_creds *c, const char *path, const char *buf, size_t n,
			  char *err, size_t errlen)
{
	unsigned line = 0;
	if (memchr(buf, 0, n))
		return utf8__err(err, errlen, -EINVAL, "%s: contains a NUL byte", path);
	for (const char *p = buf, *e = buf + n; p < e;) {
		const char *nl = memchr(p, '\n', (size_t)(e - p));
		size_t len = (size_t)((nl ? nl : e) - p);
		const char *l = p;
		p += len + (nl != NULL);
		line++;
		if (len && l[len - 1] == '\r')
			len--;
		if (!len)
			continue;
		struct tls_psk_key k;
		if (c->psk_nkeys == TLS_PSK_MAX_KEYS)
			return utf8__err(err, errlen, -EINVAL, "%s: more than %d keys", path,
					 TLS_PSK_MAX_KEYS);
		if (!tls_psk__line(l, len, &k))
			return utf8__err(err, errlen, -EINVAL, "%s line %u: want NAME:HEXKEY (a name "
					 "of 1..%d bytes, a key of 16..64 bytes in hex)", path, line,
					 TLS_ID_MAX - 1);
		for (unsigned i = 0; i < c->psk_nkeys; i++)
			if (!strcmp(c->psk_keys[i].name, k.name))
				return utf8__err(err, errlen, -EINVAL, "%s line %u: '%s' has a key "
						 "already", path, line, k.name);
		c->psk_keys[c->psk_nkeys++] = k;
		explicit_bzero(&k, sizeof(k));
	}
	if (!c->psk_nkeys)
		return utf8__err(err, errlen, -EINVAL, "%s: no keys", path);
	return 0;
}

static int tls_psk__read(struct tls_creds *c, const char *path, char *err, size_t errlen)
{
	char *buf = malloc(TLS_PSK_FILE_MAX + 1);
	c->psk_keys = calloc(TLS_PSK_MAX_KEYS, sizeof(*c->psk_keys));
	if (!buf || !c->psk_keys) {
		free(buf);
		return utf8__err(err, errlen, -ENOMEM, "out of memory");
	}
	FILE *f = fopen(path, "re");
	int rc = 0;
	size_t n = 0;
	if (!f) {
		rc = utf8__err(err, errlen, -ENOENT, "%s: %s", path, strerror(errno));
	} else {
		n = fread(buf, 1, TLS_PSK_FILE_MAX + 1, f);
		fclose(f);
	}
	if (!rc && n > TLS_PSK_FILE_MAX)
		rc = utf8__err(err, errlen, -EINVAL, "%s: larger than %u bytes", path, TLS_PSK_FILE_MAX);
	if (!rc)
		rc = tls_psk__parse(c, path, buf, n, err, errlen);
	explicit_bzero(buf, TLS_PSK_FILE_MAX + 1);   /* keys do not linger in freed memory */
	free(buf);
	return rc;
}

/* GnuTLS asks for the key of a client's user name (session pointer: the
 * creds, set by tls_session.c). */
static int tls_psk__server_key(gnutls_session_t ses, const char *user, gnutls_datum_t *key)
{
	const struct tls_creds *c = gnutls_session_get_ptr(ses);
	for (unsigned i = 0; c && user && i < c->psk_nkeys; i++) {
		const struct tls_psk_key *k = &c->psk_keys[i];
		if (strcmp(k->name, user))
			continue;
		key->data = gnutls_malloc(k->len);
		if (!key->data)
			return -1;
		memcpy(key->data, k->key, k->len);
		key->size = k->len;
		return 0;
	}
	return -1;                      /* unknown user: the handshake fails */
}

int tls_psk__load(struct tls_creds *c, char *err, size_t errlen)
{
	char path[300];
	snprintf(path, sizeof(path), "%s/keys.psk", c->dir);
	int rc = tls_psk__read(c, path, err, errlen);
	if (rc)
		return rc;
	gnutls_psk_server_credentials_t sc;
	if (gnutls_psk_allocate_server_credentials(&sc) < 0)
		return utf8__err(err, errlen, -ENOMEM, "out of memory");
	c->server_creds = sc;
	gnutls_psk_set_server_credentials_function(sc, tls_psk__server_key);
	for (unsigned i = 0; i < c->psk_nkeys; i++) {
		const struct tls_psk_key *k = &c->psk_keys[i];
		if (strcmp(k->name, c->username))
			continue;
		gnutls_psk_client_credentials_t cc;
		if (gnutls_psk_allocate_client_credentials(&cc) < 0)
			return utf8__err(err, errlen, -ENOMEM, "out of memory");
		c->client_creds = cc;
		gnutls_datum_t key = { (unsigned char *)k->key, k->len };
		if (gnutls_psk_set_client_credentials(cc, c->username, &key, GNUTLS_PSK_KEY_RAW) < 0)
			return utf8__err(err, errlen, -EINVAL, "%s: GnuTLS refuses the key of '%s'",
					 path, c->username);
	}
	return 0;                       /* no key for username: a server only */
}

void tls_psk__free(struct tls_creds *c)
{
	if (c->server_creds)
		gnutls_psk_free_server_credentials(c->server_creds);
	if (c->client_creds)
		gnutls_psk_free_client_credentials(c->client_creds);
	if (c->psk_keys) {
		explicit_bzero(c->psk_keys, TLS_PSK_MAX_KEYS * sizeof(*c->psk_keys));
		free(c->psk_keys);
	}
	c->psk_keys = NULL;
	c->psk_nkeys = 0;
}
