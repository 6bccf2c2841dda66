#!/usr/bin/env bash
# Mints a development CA, a server certificate and a client certificate for trying egressd's
# TLS modes locally. NOT for production: keys are unencrypted and the CA lives next to them.
#
#   certs/mint.sh [OUT_DIR] [SERVER_NAME...]
#
# OUT_DIR defaults to certs/dev (git-ignored). SERVER_NAMEs become DNS SANs of the server
# certificate (default: localhost, api.local.test); 127.0.0.1 and ::1 are always added as IP
# SANs, and spiffe://egressd.dev/dev/server as a URI SAN (to try subjectAltNames type URI).
#
# Files written:
#   ca.pem, ca.key            the CA (trust it with validation.caCertificateFiles: [ca.pem])
#   server.pem, server.key    server chain + key (for a test upstream, or an HTTPS listener)
#   client.pem, client.key    client chain + key (tls.mode Mutual: clientCertificate)
set -euo pipefail
command -v openssl >/dev/null || { echo "mint.sh needs openssl (apt-get install openssl)" >&2; exit 1; }

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${1:-$HERE/dev}
shift || true
NAMES=("$@")
[[ ${#NAMES[@]} -gt 0 ]] || NAMES=(localhost api.local.test)
DAYS=${DAYS:-365}
mkdir -p "$OUT"
cd "$OUT"

# EC P-256 keys: small, fast, accepted everywhere rustls is.
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; chmod 600 "$1"; }

key ca.key
openssl req -x509 -new -key ca.key -sha256 -days "$DAYS" -subj "/CN=egressd dev CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out ca.pem

sans="IP:127.0.0.1,IP:::1,URI:spiffe://egressd.dev/dev/server"
for n in "${NAMES[@]}"; do sans="DNS:$n,$sans"; done

key server.key
openssl req -new -key server.key -subj "/CN=${NAMES[0]}" -out server.csr
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -sha256 -days "$DAYS" \
  -extfile <(printf "subjectAltName=%s\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n" "$sans") \
  -out server.pem 2>/dev/null

key client.key
openssl req -new -key client.key -subj "/CN=egressd-dev-client" -out client.csr
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -sha256 -days "$DAYS" \
  -extfile <(printf "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature\n") \
  -out client.pem 2>/dev/null

rm -f server.csr client.csr ca.srl
echo "wrote $OUT: ca.pem ca.key server.pem server.key client.pem client.key (server SANs: $sans)"
