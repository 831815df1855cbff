/* Inside the TLS module (tls.c, tls_psk.c, tls_session.c). */
#ifndef KMIG_MIG_TLS_IMPL_H
#define KMIG_MIG_TLS_IMPL_H

#include <stddef.h>

#include "mig/wire/tls.h"

/* Reads c->dir/keys.psk into c->psk_keys and makes the GnuTLS
 * credentials: a server's that answers from those keys, and a client's
 * when c->username has a key.  -errno with err filled. */
int tls_psk__load(struct tls_creds *c, char *err, size_t errlen);
/* Frees what tls_psk__load made, keys wiped. */
void tls_psk__free(struct tls_creds *c);

#endif
