#!/bin/sh
# make-certs.sh DIR [CN]: test credentials in QEMU's directory layouts.
#   DIR/x509: ca-cert.pem, server-cert.pem + server-key.pem (localhost,
#             127.0.0.1, ::1), client-cert.pem + client-key.pem
#             (distinguished name "CN=CN,O=kmig", CN default "source")
#   DIR/psk:  keys.psk with a random 32-byte key for user "qemu"
# Each call makes a new CA and new keys.  Uses certtool and psktool
# (Debian's gnutls-bin).
set -eu
dir=$1
cn=${2:-source}
mkdir -p "$dir/x509" "$dir/psk"
cd "$dir/x509"
umask 077
key() { certtool --generate-privkey --key-type=ecdsa --outfile "$1" 2>/dev/null; }
printf 'cn = kmig test CA\nca\ncert_signing_key\nexpiration_days = 3650\n' >ca.info
printf 'organization = kmig\ncn = localhost\ndns_name = localhost\nip_address = 127.0.0.1\nip_address = ::1\ntls_www_server\nsigning_key\nencryption_key\nexpiration_days = 3650\n' >server.info
printf 'organization = kmig\ncn = %s\ntls_www_client\nsigning_key\nexpiration_days = 3650\n' "$cn" >client.info
key ca-key.pem
certtool --generate-self-signed --load-privkey ca-key.pem --template ca.info \
	--outfile ca-cert.pem 2>/dev/null
for who in server client; do
	key "$who-key.pem"
	certtool --generate-certificate --load-privkey "$who-key.pem" --load-ca-certificate ca-cert.pem \
		--load-ca-privkey ca-key.pem --template "$who.info" --outfile "$who-cert.pem" 2>/dev/null
done
rm -f ca.info server.info client.info
psktool -u qemu -p "$dir/psk/keys.psk" >/dev/null
