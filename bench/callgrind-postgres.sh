#!/usr/bin/env bash
# callgrind-postgres.sh starts a PostgreSQL server under valgrind's callgrind
# for BenchmarkHandoverServerInstructions, which counts the instructions the
# server runs per query: a measure that the machine's load does not change.
# Each server process writes its totals to DIR/out.<pid> when it exits.
#
# Needs Debian's postgresql-15 and valgrind (apt-get install postgresql-15
# valgrind); run as root or as the postgres user. Prints the two variables
# the benchmark reads; stop the server with: pkill -f "callgrind.*DIR"
#
# Usage: bench/callgrind-postgres.sh [DIR] [PORT]
set -euo pipefail
dir=${1:-/tmp/tenantdb-callgrind}
port=${2:-55999}
bin=/usr/lib/postgresql/15/bin
as_postgres() { if [ "$(id -u)" = 0 ]; then su postgres -c "$*"; else sh -c "$*"; fi; }

mkdir -p "$dir"
[ "$(id -u)" = 0 ] && chown postgres "$dir"
if [ ! -f "$dir/data/PG_VERSION" ]; then
	as_postgres "$bin/initdb -D $dir/data -A trust -U tenantdb >/dev/null"
fi
as_postgres "nohup valgrind --tool=callgrind --callgrind-out-file=$dir/out.%p \
	$bin/postgres -D $dir/data -p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off \
	>$dir/server.log 2>&1 &"
for _ in $(seq 120); do
	"$bin/pg_isready" -q -h 127.0.0.1 -p "$port" && break
	sleep 1
done
"$bin/pg_isready" -q -h 127.0.0.1 -p "$port" || { echo "the server did not start: $dir/server.log" >&2; exit 1; }
echo "export TENANTDB_CALLGRIND_DSN='postgres://tenantdb@127.0.0.1:$port/postgres?sslmode=disable'"
echo "export TENANTDB_CALLGRIND_OUT='$dir'"
