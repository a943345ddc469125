#!/bin/sh
# Regenerates the development TLS files the mesh overlays build their Secrets from: one CA
# (its key is thrown away), the etcd/gRPC server certificate and the `remote` client
# certificate shared by every cluster (components/dev-tls/), and per cluster the
# `admin-<cluster>` and `local-<cluster>` client certificates (overlays/<cluster>/tls/).
# The CNs are the etcd users `meshwork-apiserver etcd-init` creates. For development only:
# a real mesh needs its own CA and keys, never these.
set -eu
cd "$(dirname "$0")"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
days=3650

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

# cert NAME CN EXTENSIONS: NAME.key and NAME.crt in $work, signed by the CA.
cert() {
    key "$work/$1.key"
    openssl req -new -key "$work/$1.key" -subj "/CN=$2" -out "$work/$1.csr"
    printf '%s\n' "$3" > "$work/$1.ext"
    openssl x509 -req -in "$work/$1.csr" -CA "$work/ca.crt" -CAkey "$work/ca.key" \
        -CAcreateserial -days "$days" -sha256 -extfile "$work/$1.ext" -out "$work/$1.crt" 2>/dev/null
}

key "$work/ca.key"
openssl req -x509 -new -key "$work/ca.key" -subj "/CN=meshwork-dev-ca" -days "$days" \
    -sha256 -out "$work/ca.crt"

client='basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth'
cert server clustermesh-apiserver "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=DNS:clustermesh-apiserver.meshwork-system.svc,DNS:meshwork-apiserver.meshwork-system.svc,DNS:*.mesh.meshwork.io,DNS:localhost,IP:127.0.0.1"
cert remote remote "$client"

mkdir -p components/dev-tls
cp "$work/ca.crt" components/dev-tls/ca.crt
for name in server remote; do
    cp "$work/$name.crt" "components/dev-tls/$name.crt"
    cp "$work/$name.key" "components/dev-tls/$name.key"
done

for cluster in mesh-1 mesh-2; do
    cert "admin-$cluster" "admin-$cluster" "$client"
    cert "local-$cluster" "local-$cluster" "$client"
    mkdir -p "overlays/$cluster/tls"
    cp "$work/ca.crt" "overlays/$cluster/tls/ca.crt"
    for user in admin local; do
        cp "$work/$user-$cluster.crt" "overlays/$cluster/tls/$user.crt"
        cp "$work/$user-$cluster.key" "overlays/$cluster/tls/$user.key"
    done
done
chmod 0644 components/dev-tls/*.key overlays/*/tls/*.key
echo "development TLS files written under components/dev-tls and overlays/*/tls"
