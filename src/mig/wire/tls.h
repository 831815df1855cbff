/* TLS for the migration channels (GnuTLS, TLS 1.3 only): credential and
 * authorization objects, and the handshake of a stream.
 *
 * Objects, with QEMU's type names, properties and directory layouts
 * (`kmig run --object SPEC`, SPEC = TYPE,key=value,...; a comma inside a
 * value is written twice, as in QEMU: identity=CN=source,,O=kmig):
 *   tls-creds-psk,id=ID,dir=DIR[,username=NAME][,endpoint=client|server]
 *       DIR/keys.psk holds lines NAME:HEXKEY (keys of 16 to 64 bytes, at
 *       most TLS_PSK_MAX_KEYS names, each once).  The client presents
 *       NAME (default "qemu") with its key; the server accepts any name in
 *       the file with its key.  Keys are read once, at creation.
 *   tls-creds-x509,id=ID,dir=DIR[,verify-peer=on|off][,endpoint=...]
 *       DIR/ca-cert.pem (required); server-cert.pem + server-key.pem to
 *       accept, client-cert.pem + client-key.pem to connect.  A client
 *       always checks the server's certificate against the CA and the
 *       host name; a server with verify-peer=on (the default) requires a
 *       client certificate signed by the CA.
 *   authz-simple,id=ID,identity=NAME
 *       a server with tls-authz=ID accepts only this client: a PSK user
 *       name, or the distinguished name of the client's certificate as
 *       GnuTLS prints it (e.g. "CN=source,O=kmig").
 * The migration source is the TLS client, the destination the server.
 * Files are read when the object is created, so a missing or malformed
 * file is reported at once.
 *
 * Threads: objects are created before any migration and never change;
 * lookups and handshakes may run on any thread. */
#ifndef KMIG_MIG_TLS_H
#define KMIG_MIG_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include "base/log.h"

struct mig_stream;

#define TLS_MAX_OBJECTS   8
#define TLS_ID_MAX        64
#define TLS_HANDSHAKE_MS  10000  /* a whole handshake, then -ETIMEDOUT */
#define TLS_PSK_MAX_KEYS  64

struct tls_psk_key {
	char name[TLS_ID_MAX];
	unsigned char key[64];
	unsigned len;
};

enum tls_kind { TLS_PSK, TLS_X509 };
enum tls_endpoint { TLS_ENDPOINT_ANY, TLS_ENDPOINT_CLIENT, TLS_ENDPOINT_SERVER };

struct tls_creds {
	char id[TLS_ID_MAX];
	enum tls_kind kind;
	enum tls_endpoint endpoint;
	char dir[256];
	char username[TLS_ID_MAX];   /* psk: the client's identity */
	struct tls_psk_key *psk_keys; /* psk: every key of keys.psk, as read at creation */
	unsigned psk_nkeys;
	bool verify_peer;            /* x509 server: require a client certificate */
	bool has_server, has_client; /* x509: certificate + key pairs found */
	void *server_creds;          /* gnutls credentials, NULL if not loaded */
	void *client_creds;
};

struct tls_authz {
	char id[TLS_ID_MAX];
	char identity[256];
};

struct tls_objects {
	struct tls_creds creds[TLS_MAX_OBJECTS];
	unsigned ncreds;
	struct tls_authz authz[TLS_MAX_OBJECTS];
	unsigned nauthz;
};

/* What one side of one migration uses; creds NULL = plain stream. */
struct tls_config {
	const struct tls_creds *creds;
	char hostname[256];          /* client, x509: the name the certificate must carry */
	const struct tls_authz *authz; /* server: the only client accepted, or NULL */
};

void tls_objects__init(struct tls_objects *o);
void tls_objects__destroy(struct tls_objects *o);
/* Creates an object from SPEC (see above).  0, or -EINVAL / -ENOENT /
 * -ENOSPC / -EEXIST with err filled. */
int tls_objects__add(struct tls_objects *o, const char *spec, char *err,
		     size_t errlen) KMIG_MUST_CHECK;
/* NULL if there is no such object. */
const struct tls_creds *tls_objects__creds(const struct tls_objects *o, const char *id);
const struct tls_authz *tls_objects__authz(const struct tls_objects *o, const char *id);

/* Fills *cfg for a migration: creds_id "" means plain (cfg->creds NULL).
 * The client takes the host name from tls_hostname, else from a tcp: URI;
 * x509 over unix: needs tls_hostname.  -EINVAL/-ENOENT with err filled. */
int tls_config__resolve(const struct tls_objects *o, bool server, const char *creds_id,
			const char *hostname, const char *authz_id, const char *uri,
			struct tls_config *cfg, char *err, size_t errlen) KMIG_MUST_CHECK;

/* TLS handshake on a connected stream (nothing read or written on it
 * yet); from then on the stream's reads and writes are encrypted.  The
 * server then checks the client (certificate, tls-authz) and answers with
 * one byte (or an alert), which the client waits for.  Each side's whole
 * wait is bounded by TLS_HANDSHAKE_MS and ends at mig_stream__shutdown
 * (and, on a connected stream, its connect's cancel flag); writes are a
 * few KiB that the socket buffer takes.  A refusal sends the peer an
 * alert.  The session never updates its keys, and a key update from the
 * peer ends it (so one thread may write while another reads; see
 * stream.h).  0, or a negative
 * errno with err filled (and the stream's sticky error set). */
int tls__client(struct mig_stream *s, const struct tls_config *cfg, char *err,
		size_t errlen) KMIG_MUST_CHECK;
int tls__server(struct mig_stream *s, const struct tls_config *cfg, char *err,
		size_t errlen) KMIG_MUST_CHECK;
/* Server, after tls__server: the client's identity, its PSK user name or
 * its certificate's distinguished name, into who (cut to len).  -ENOENT
 * if it has none (an X.509 server without verify-peer), -EINVAL without
 * TLS. */
int tls__peer(struct mig_stream *s, const struct tls_config *cfg, char *who,
	      size_t len) KMIG_MUST_CHECK;

#endif
