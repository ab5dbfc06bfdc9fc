#!/usr/bin/env bash
# Join three (or more) CouchDB 3 nodes into one cluster with the standard /_cluster_setup API
# (docs.couchdb.org/en/stable/setup/cluster.html, "The Cluster Setup API"), then create ASO's
# files database with more shards than the default (deploy/couchdb/cluster.ini explains q).
#
#   COUCHDB_USER=admin COUCHDB_PASSWORD=... \
#     deploy/couchdb/setup-cluster.sh couch1.example.org couch2.example.org couch3.example.org
#
# Before: every node runs with local.ini + cluster.ini and its vm.args edited, with the same
# admin name and password. The first host coordinates the setup (nothing special afterwards).
# Environment: COUCHDB_PORT (5984), BIND_ADDRESS (0.0.0.0: the address each node listens on),
# ASO_FILES_DB (asynctransfer: store.files_db), ASO_FILES_Q (8), SCHEME (http).
# Passwords travel in request bodies and a curl config read from stdin, never on the command
# line (where `ps` would show them). Idempotent enough to run again: a node already enabled or
# added answers an error that is reported and skipped.
set -euo pipefail

PORT=${COUCHDB_PORT:-5984}
BIND=${BIND_ADDRESS:-0.0.0.0}
FILES_DB=${ASO_FILES_DB:-asynctransfer}
FILES_Q=${ASO_FILES_Q:-8}
SCHEME=${SCHEME:-http}
: "${COUCHDB_USER:?set COUCHDB_USER (the admin of every node)}"
: "${COUCHDB_PASSWORD:?set COUCHDB_PASSWORD}"

if [ "$#" -lt 2 ]; then
    echo "usage: $0 COORDINATOR-HOST OTHER-HOST..." >&2
    exit 2
fi
case "$COUCHDB_USER$COUCHDB_PASSWORD" in
    *'"'* | *'\'*) echo "$0: the admin name and password may not hold \" or \\" >&2; exit 2 ;;
esac

COORDINATOR=$1
NODE_COUNT=$#
BASE="$SCHEME://$COORDINATOR:$PORT"

# One request to the coordinator: METHOD PATH [JSON body on stdin]; prints the answer.
couch() {
    local method=$1 path=$2
    curl --silent --show-error --fail-with-body \
        --config <(printf 'user = "%s:%s"\n' "$COUCHDB_USER" "$COUCHDB_PASSWORD") \
        -X "$method" -H "Content-Type: application/json" \
        "$BASE$path" "${@:3}"
    echo
}

setup() {  # one /_cluster_setup action; the body comes on stdin
    couch POST /_cluster_setup --data-binary @- || echo "(reported above; going on)" >&2
}

echo "== enable_cluster on the coordinator $COORDINATOR"
setup <<JSON
{"action": "enable_cluster", "bind_address": "$BIND", "port": $PORT,
 "username": "$COUCHDB_USER", "password": "$COUCHDB_PASSWORD", "node_count": "$NODE_COUNT"}
JSON

for host in "${@:2}"; do
    echo "== enable_cluster on $host, then add_node $host"
    setup <<JSON
{"action": "enable_cluster", "bind_address": "$BIND", "port": $PORT,
 "username": "$COUCHDB_USER", "password": "$COUCHDB_PASSWORD", "node_count": "$NODE_COUNT",
 "remote_node": "$host", "remote_current_user": "$COUCHDB_USER",
 "remote_current_password": "$COUCHDB_PASSWORD"}
JSON
    setup <<JSON
{"action": "add_node", "host": "$host", "port": $PORT,
 "username": "$COUCHDB_USER", "password": "$COUCHDB_PASSWORD"}
JSON
done

echo "== finish_cluster (system databases, the same uuid and secret on every node)"
setup <<<'{"action": "finish_cluster"}'

echo "== state (want cluster_finished) and membership (want every node in both lists)"
couch GET /_cluster_setup
couch GET /_membership

echo "== the files database $FILES_DB with q=$FILES_Q (before \`aso db init\`, which keeps it)"
couch PUT "/$FILES_DB?q=$FILES_Q" || echo "(exists already: its q stays; /_reshard can split)" >&2

echo "== next: aso db init, then aso store check (both with the admin account of aso.toml)"
