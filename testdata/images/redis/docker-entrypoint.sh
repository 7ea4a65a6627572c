#!/bin/sh
# Entrypoint of the locally built tenantdb/redis:7 image (Debian's
# redis-server package, 7.0). Like the official redis image it accepts
# "redis-server [config file] [--option value ...]", or just the options
# ("--loglevel verbose" means "redis-server --loglevel verbose"), and runs any
# other command as is.
#
# The official image is compiled with protected mode off by default; Debian's
# binary is not, and with protected mode on a server without a password
# refuses clients that do not come from loopback, which is every client of a
# container. So protected mode is turned off here, after the optional config
# file and before the caller's own options, which still win.
set -eu

case "${1:-}" in
-* | *.conf) set -- redis-server "$@" ;;
esac

if [ "${1:-}" != 'redis-server' ]; then
	exec "$@"
fi
shift

if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
	conf="$1"
	shift
	set -- "$conf" --protected-mode no "$@"
else
	set -- --protected-mode no "$@"
fi

if [ "$(id -u)" = '0' ]; then
	mkdir -p /data
	chown redis:redis /data
	exec setpriv --reuid=redis --regid=redis --init-groups redis-server "$@"
fi
exec redis-server "$@"
