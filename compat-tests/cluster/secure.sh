#!/usr/bin/env bash
# Secured peer listeners for a local cluster of ours (start.sh with CLUSTER_SECURE=1):
#   secure.sh pki <datadir> <n>          makes a throwaway PKI in <datadir>/pki (an openssl CA,
#                                        node<i>.pem = key + certificate, CN=node<i>, SAN IP 127.0.0.i)
#   secure.sh properties <datadir> <i>   prints node i's listener properties
# Clients keep the PLAINTEXT listener on PORT. Brokers replicate and send transaction markers
# over INTERNAL (PORT+3, SASL_SSL with PLAIN, user "broker"); voters talk over CONTROLLER
# (CONTROLLER_PORT, SSL with a required client certificate); super.users names the nodes'
# certificates and the broker user, the principals the controller listener admits.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

[[ $# -eq 3 ]] || { echo "usage: secure.sh <pki|properties> <datadir> <n|i>" >&2; exit 2; }
dir=$(cd "$2" && pwd)
pki="$dir/pki"

case "$1" in
  pki)
    command -v openssl >/dev/null || die "openssl not found"
    n=$3
    mkdir -p "$pki"
    (
      cd "$pki"
      exec 2>"$pki/openssl.log"
      openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 \
        -subj "/CN=faults test ca" >/dev/null
      for ((i = 1; i <= n; i++)); do
        openssl req -newkey rsa:2048 -nodes -keyout "node$i.key" -out "node$i.csr" \
          -subj "/CN=node$i" >/dev/null
        openssl x509 -req -in "node$i.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
          -extfile <(printf 'subjectAltName=IP:%s\nbasicConstraints=CA:FALSE\n' "$(node_addr "$i")") \
          -out "node$i.crt" >/dev/null
        cat "node$i.key" "node$i.crt" >"node$i.pem"
      done
      head -c 18 /dev/urandom | base64 | tr -d '/+=' >broker.password
    ) || { cat "$pki/openssl.log" >&2; die "making the PKI failed"; }
    ;;
  properties)
    i=$3
    load_cluster "$dir"
    addr=$(node_addr "$i")
    password=$(cat "$pki/broker.password")
    users="User:broker"
    for ((j = 1; j <= N; j++)); do users+=";User:CN=node$j"; done
    cat <<PROPS
listeners=PLAINTEXT://$addr:$PORT,INTERNAL://$addr:$INTERNAL_PORT,CONTROLLER://$addr:$CONTROLLER_PORT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,INTERNAL:SASL_SSL,CONTROLLER:SSL
inter.broker.listener.name=INTERNAL
ssl.keystore.type=PEM
ssl.keystore.location=$pki/node$i.pem
ssl.truststore.type=PEM
ssl.truststore.location=$pki/ca.pem
listener.name.controller.ssl.client.auth=required
listener.name.internal.sasl.enabled.mechanisms=PLAIN
sasl.mechanism.inter.broker.protocol=PLAIN
listener.name.internal.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="broker" password="$password" user_broker="$password";
super.users=$users
PROPS
    ;;
  *) die "unknown command $1" ;;
esac
