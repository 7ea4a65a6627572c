#!/bin/bash
# Entrypoint of the locally built tenantdb/postgres:15 image (Debian's
# postgresql-15 package). It follows the contract of the official postgres
# image's entrypoint, so that testcontainers-go's postgres module and our own
# helpers work unchanged with either image:
#
#   - POSTGRES_PASSWORD (required unless POSTGRES_HOST_AUTH_METHOD=trust),
#     POSTGRES_USER (default postgres), POSTGRES_DB (default $POSTGRES_USER),
#     POSTGRES_INITDB_ARGS, POSTGRES_HOST_AUTH_METHOD (default scram-sha-256);
#   - initdb only when $PGDATA holds no cluster yet, so stopping and starting
#     the same container keeps its data;
#   - on first start a temporary server (Unix socket only) creates the
#     database and runs /docker-entrypoint-initdb.d/* (*.sh, *.sql, *.sql.gz,
#     *.sql.xz), then stops; like the official image, the line "database
#     system is ready to accept connections" is therefore logged twice on
#     first start and once on every later start;
#   - the command is "postgres [-c key=value ...]" (or just "-c ..."); any
#     other command is executed as is;
#   - the server listens on 0.0.0.0:5432 with password authentication from
#     any host and runs as the postgres user.
set -Eeuo pipefail

: "${PGDATA:=/var/lib/postgresql/data}"
export PGDATA

# "docker run image -c fsync=off" means "postgres -c fsync=off".
if [ "${1:0:1}" = '-' ]; then
	set -- postgres "$@"
fi

if [ "$1" != 'postgres' ]; then
	exec "$@"
fi

# Started as root (docker run --user root, or a derived image): prepare the
# directories, then run this script again as postgres.
if [ "$(id -u)" = '0' ]; then
	mkdir -p "$PGDATA" /run/postgresql
	chown postgres:postgres "$PGDATA" /run/postgresql
	chmod 700 "$PGDATA"
	chmod 2775 /run/postgresql
	exec setpriv --reuid=postgres --regid=postgres --init-groups "${BASH_SOURCE[0]}" "$@"
fi

log() { printf '%s\n' "$*"; }

# psql against the temporary server, which listens on the Unix socket only.
initdb_psql() {
	psql -v ON_ERROR_STOP=1 --no-psqlrc --username "$POSTGRES_USER" --no-password "$@"
}

run_init_files() {
	local f
	shopt -s nullglob
	for f in /docker-entrypoint-initdb.d/*; do
		case "$f" in
		*.sh)
			if [ -x "$f" ]; then
				log "$0: running $f"
				"$f"
			else
				log "$0: sourcing $f"
				# shellcheck disable=SC1090
				. "$f"
			fi
			;;
		*.sql) log "$0: running $f"; initdb_psql --dbname "$POSTGRES_DB" -f "$f" ;;
		*.sql.gz) log "$0: running $f"; gunzip -c "$f" | initdb_psql --dbname "$POSTGRES_DB" ;;
		*.sql.xz) log "$0: running $f"; xzcat "$f" | initdb_psql --dbname "$POSTGRES_DB" ;;
		*) log "$0: ignoring $f" ;;
		esac
	done
	shopt -u nullglob
}

if [ ! -s "$PGDATA/PG_VERSION" ]; then
	: "${POSTGRES_USER:=postgres}"
	: "${POSTGRES_DB:=$POSTGRES_USER}"
	: "${POSTGRES_HOST_AUTH_METHOD:=scram-sha-256}"
	export POSTGRES_USER POSTGRES_DB

	if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "$POSTGRES_HOST_AUTH_METHOD" != 'trust' ]; then
		log "$0: error: database is uninitialized and POSTGRES_PASSWORD is not set" >&2
		log "$0: set POSTGRES_PASSWORD, or POSTGRES_HOST_AUTH_METHOD=trust to allow connections without a password" >&2
		exit 1
	fi

	mkdir -p "$PGDATA"
	chmod 700 "$PGDATA"

	pwfile="$(mktemp)"
	printf '%s\n' "${POSTGRES_PASSWORD:-}" >"$pwfile"
	# Unix-socket connections inside the container are trusted, as in the
	# official image; TCP needs the password, from loopback too.
	# shellcheck disable=SC2086
	initdb --username="$POSTGRES_USER" --pwfile="$pwfile" \
		--auth-local=trust --auth-host="$POSTGRES_HOST_AUTH_METHOD" \
		${POSTGRES_INITDB_ARGS:-}
	rm -f "$pwfile"

	{
		echo
		echo "# Added by the tenantdb image entrypoint."
		echo "listen_addresses = '*'"
	} >>"$PGDATA/postgresql.conf"
	if [ "$POSTGRES_HOST_AUTH_METHOD" = 'md5' ]; then
		echo "password_encryption = 'md5'" >>"$PGDATA/postgresql.conf"
	fi
	printf 'host all all all %s\n' "$POSTGRES_HOST_AUTH_METHOD" >>"$PGDATA/pg_hba.conf"

	# Temporary server for setup: no TCP listener, so nothing outside the
	# container mistakes it for the real one.
	pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -p 5432" -w start

	if [ "$POSTGRES_DB" != 'postgres' ]; then
		initdb_psql --dbname postgres --set db="$POSTGRES_DB" <<-'EOSQL'
			CREATE DATABASE :"db";
		EOSQL
	fi
	run_init_files

	pg_ctl -D "$PGDATA" -m fast -w stop
	log
	log 'PostgreSQL init process complete; ready for start up.'
	log
fi

exec "$@"
