#!/usr/bin/env bash
# build-images.sh builds the container images that tenantdb's tests use, for
# machines that reach no container registry but do reach Debian's apt
# repositories and the Go module proxy:
#
#   tenantdb/postgres:15     Debian bookworm's postgresql-15, with an
#                            entrypoint that honours the official image's
#                            contract (images/postgres/docker-entrypoint.sh)
#   tenantdb/redis:7         Debian bookworm's redis-server (7.0)
#   tenantdb/jaeger:1.75.0   github.com/jaegertracing/jaeger/cmd/jaeger
#                            v1.75.0 (Jaeger v2), built with CGO_ENABLED=0 in
#                            its own module (images/jaeger/go.mod), in-memory
#                            storage, config images/jaeger/config.yaml
#   tenantdb/prometheus:2    Debian bookworm's prometheus (2.42) and
#                            promtool; tests give it a configuration
#                            (tenantdbtest.StartPrometheus)
#
# PostgreSQL, Redis and Prometheus root filesystems come from mmdebstrap (minbase, no
# docs, man pages or translations), the Jaeger one is just the static binary
# and its config; each is turned into an image with "docker import", so
# neither a registry nor a base image nor BuildKit is needed.
#
# The script is idempotent: an image is skipped when the local store already
# has it built from the same recipe (the recipe's hash is kept in the
# image's org.tenantdb.recipe label), so a second run takes a few seconds.
#
# Usage: testdata/build-images.sh [--force | --if-needed] [postgres] [redis] [jaeger] [prometheus]
#   --force      rebuild even when an up-to-date image exists
#   --if-needed  what `make test` and `make demo` run first: build only where
#                the tests would otherwise fail, that is a local image built
#                from an older recipe, or none while the official image is
#                neither in the local store nor pulled from a registry (one
#                `docker pull` tells); silent when nothing is to be done
#   no names     all four
#
# Needs: docker, and for what is missing: mmdebstrap (apt-get install
# mmdebstrap; run as root, or as a user for whom mmdebstrap's unshare mode
# works) and Go 1.26 for Jaeger.

# The mmdebstrap hooks below are single-quoted on purpose: "$1" is the
# chroot directory, expanded by mmdebstrap when it runs the hook.
# shellcheck disable=SC2016
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
recipes="$here/images"

POSTGRES_TAG=tenantdb/postgres:15
REDIS_TAG=tenantdb/redis:7
JAEGER_TAG=tenantdb/jaeger:1.75.0
PROMETHEUS_TAG=tenantdb/prometheus:2
JAEGER_VERSION=v1.75.0 # v1.76.0 is not an approved release for this project
SUITE=bookworm
LABEL=org.tenantdb.recipe

force=0
if_needed=0
want=()
for arg in "$@"; do
	case "$arg" in
	--force) force=1 ;;
	--if-needed) if_needed=1 ;;
	postgres | redis | jaeger | prometheus) want+=("$arg") ;;
	-h | --help)
		sed -n '2,/^$/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "build-images: unknown argument $arg (want --force, --if-needed, postgres, redis, jaeger, prometheus)" >&2
		exit 2
		;;
	esac
done
[ ${#want[@]} -gt 0 ] || want=(postgres redis jaeger prometheus)

log() { printf 'build-images: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

[ $force -eq 0 ] || [ $if_needed -eq 0 ] || die "--force and --if-needed exclude each other"
command -v docker >/dev/null || die "docker not found: the tests and the demo start PostgreSQL in Docker; install Docker Engine (Debian: apt-get install docker.io)"
docker info >/dev/null 2>&1 || die "cannot reach the Docker daemon (is it running, and may this user use it?)"

work="$(mktemp -d "${TMPDIR:-/tmp}/tenantdb-images.XXXXXX")"
pids=()
cleanup() {
	local p
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	rm -rf "$work"
}
trap cleanup EXIT

# recipe_hash NAME prints a short hash of everything an image is made from:
# the shell function that builds it and the files under images/NAME.
recipe_hash() {
	local name="$1"
	{
		declare -f "build_$name" mmdebstrap_rootfs
		echo "$SUITE $JAEGER_VERSION"
		(cd "$recipes/$name" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
	} | sha256sum | cut -c1-16
}

# up_to_date TAG HASH succeeds when TAG exists locally and was built from HASH.
up_to_date() {
	local have
	have="$(docker image inspect -f "{{ index .Config.Labels \"$LABEL\" }}" "$1" 2>/dev/null)" || return 1
	[ "$have" = "$2" ]
}

# mmdebstrap_rootfs OUT.tar PACKAGES [extra mmdebstrap options...] makes a
# minimal bookworm root filesystem. Given no mirror, mmdebstrap uses
# deb.debian.org with the bookworm-updates and bookworm-security suites,
# which is what our machines' apt sources name too. Docs, man pages and
# translations are not unpacked; copyright files are kept.
mmdebstrap_rootfs() {
	local out="$1" pkgs="$2"
	shift 2
	command -v mmdebstrap >/dev/null || die "mmdebstrap not found; install it (apt-get install mmdebstrap)"
	mmdebstrap --variant=minbase --include="$pkgs" \
		--aptopt='APT::Install-Recommends "false"' \
		--dpkgopt='path-exclude=/usr/share/doc/*' \
		--dpkgopt='path-include=/usr/share/doc/*/copyright' \
		--dpkgopt='path-exclude=/usr/share/man/*' \
		--dpkgopt='path-exclude=/usr/share/info/*' \
		--dpkgopt='path-exclude=/usr/share/locale/*' \
		--dpkgopt='path-exclude=/usr/share/lintian/*' \
		--customize-hook='rm -rf "$1"/var/cache/apt/*.bin "$1"/var/cache/debconf/*-old "$1"/var/log/apt/* "$1"/var/log/dpkg.log "$1"/var/log/alternatives.log' \
		"$@" "$SUITE" "$out" </dev/null
}

build_postgres() {
	local tag="$1" hash="$2" dir="$work/postgres"
	mkdir -p "$dir"
	install -m 0755 "$recipes/postgres/docker-entrypoint.sh" "$dir/docker-entrypoint.sh"
	# No "main" cluster at install time: the entrypoint runs initdb itself.
	# JIT is dropped to save about 160 MB (LLVM, Z3, bitcode): without
	# llvmjit.so PostgreSQL simply runs without JIT, which tests never need.
	# /run is kept, since /run/postgresql is where the server puts its
	# socket and the postgres user cannot create it at run time.
	mmdebstrap_rootfs "$dir/rootfs.tar" postgresql-15 \
		--skip=cleanup/run \
		--essential-hook='mkdir -p "$1/etc/postgresql-common/createcluster.d" && echo "create_main_cluster = false" >"$1/etc/postgresql-common/createcluster.d/00-tenantdb.conf"' \
		--customize-hook="upload $dir/docker-entrypoint.sh /usr/local/bin/docker-entrypoint.sh" \
		--customize-hook='chroot "$1" sh -euc "dpkg --purge --force-depends libllvm14 libz3-4 >/dev/null; rm -rf /usr/lib/postgresql/15/lib/llvmjit* /usr/lib/postgresql/15/lib/bitcode"' \
		--customize-hook='chroot "$1" sh -euc "chmod 0755 /usr/local/bin/docker-entrypoint.sh; install -d -o postgres -g postgres -m 0700 /var/lib/postgresql/data; find /run -mindepth 1 -maxdepth 1 ! -name lock -exec rm -rf {} +; install -d -o postgres -g postgres -m 2775 /run/postgresql; install -d -m 0755 /docker-entrypoint-initdb.d"'
	docker import \
		--change 'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]' \
		--change 'CMD ["postgres"]' \
		--change 'ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		--change 'ENV PGDATA=/var/lib/postgresql/data' \
		--change 'ENV LANG=C.UTF-8' \
		--change 'EXPOSE 5432' \
		--change 'WORKDIR /var/lib/postgresql' \
		--change 'USER postgres' \
		--change "LABEL $LABEL=$hash" \
		--message "tenantdb: PostgreSQL 15 from Debian $SUITE" \
		"$dir/rootfs.tar" "$tag" >/dev/null
}

build_redis() {
	local tag="$1" hash="$2" dir="$work/redis"
	mkdir -p "$dir"
	install -m 0755 "$recipes/redis/docker-entrypoint.sh" "$dir/docker-entrypoint.sh"
	mmdebstrap_rootfs "$dir/rootfs.tar" redis-server \
		--customize-hook="upload $dir/docker-entrypoint.sh /usr/local/bin/docker-entrypoint.sh" \
		--customize-hook='chroot "$1" sh -euc "chmod 0755 /usr/local/bin/docker-entrypoint.sh; install -d -o redis -g redis -m 0755 /data"'
	docker import \
		--change 'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]' \
		--change 'CMD ["redis-server"]' \
		--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		--change 'ENV LANG=C.UTF-8' \
		--change 'EXPOSE 6379' \
		--change 'WORKDIR /data' \
		--change 'USER redis' \
		--change "LABEL $LABEL=$hash" \
		--message "tenantdb: Redis 7 from Debian $SUITE" \
		"$dir/rootfs.tar" "$tag" >/dev/null
}

build_jaeger() {
	local tag="$1" hash="$2" dir="$work/jaeger" gobin
	gobin="$(command -v go || true)"
	[ -n "$gobin" ] || gobin=/usr/local/go/bin/go
	[ -x "$gobin" ] || die "go not found; Jaeger is built from the Go module proxy with Go 1.26"
	mkdir -p "$dir/root/cmd/jaeger" "$dir/root/etc/jaeger" "$dir/root/tmp"
	chmod 1777 "$dir/root/tmp"
	# The module in images/jaeger pins Jaeger and all its dependencies
	# (go.mod, go.sum), so none of them enter tenantdb's own go.mod.
	(cd "$recipes/jaeger" &&
		GOWORK=off GOFLAGS='-mod=readonly -buildvcs=false' CGO_ENABLED=0 \
			"$gobin" build -trimpath \
			-ldflags "-s -w -X github.com/jaegertracing/jaeger/internal/version.latestVersion=$JAEGER_VERSION" \
			-o "$dir/root/cmd/jaeger/jaeger-linux" github.com/jaegertracing/jaeger/cmd/jaeger)
	install -m 0644 "$recipes/jaeger/config.yaml" "$dir/root/etc/jaeger/config.yaml"
	tar --numeric-owner --owner=0 --group=0 -C "$dir/root" -cf "$dir/rootfs.tar" .
	# JAEGER_LISTEN_HOST makes Jaeger's built-in all-in-one config (used when
	# the command is overridden without --config) bind 0.0.0.0 too, as in the
	# official image.
	docker import \
		--change 'ENTRYPOINT ["/cmd/jaeger/jaeger-linux"]' \
		--change 'CMD ["--config", "/etc/jaeger/config.yaml"]' \
		--change 'ENV JAEGER_LISTEN_HOST=0.0.0.0' \
		--change 'EXPOSE 4317 4318 13133 16685 16686' \
		--change 'USER 10001' \
		--change "LABEL $LABEL=$hash" \
		--message "tenantdb: Jaeger $JAEGER_VERSION (v2 binary) with in-memory storage" \
		"$dir/rootfs.tar" "$tag" >/dev/null
}

build_prometheus() {
	local tag="$1" hash="$2" dir="$work/prometheus"
	mkdir -p "$dir"
	# The package's own configuration scrapes a node exporter that is not
	# there: images/prometheus/prometheus.yml replaces it, and tests write
	# theirs over it. The storage directory belongs to the prometheus user
	# that the package creates. moment-timezone's data (214 MB of
	# JavaScript for the web console's time zones) is dropped: the API, which
	# is all the tests use, does not need it.
	mmdebstrap_rootfs "$dir/rootfs.tar" prometheus \
		--customize-hook="upload $recipes/prometheus/prometheus.yml /etc/prometheus/prometheus.yml" \
		--customize-hook='chroot "$1" sh -euc "chmod 0644 /etc/prometheus/prometheus.yml; install -d -o prometheus -g prometheus -m 0755 /prometheus; rm -rf /usr/share/javascript/moment-timezone/*"'
	docker import \
		--change 'ENTRYPOINT ["/usr/bin/prometheus"]' \
		--change 'CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]' \
		--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		--change 'ENV LANG=C.UTF-8' \
		--change 'EXPOSE 9090' \
		--change 'WORKDIR /prometheus' \
		--change 'USER prometheus' \
		--change "LABEL $LABEL=$hash" \
		--message "tenantdb: Prometheus 2 from Debian $SUITE" \
		"$dir/rootfs.tar" "$tag" >/dev/null
}

tag_of() {
	case "$1" in
	postgres) echo "$POSTGRES_TAG" ;;
	redis) echo "$REDIS_TAG" ;;
	jaeger) echo "$JAEGER_TAG" ;;
	prometheus) echo "$PROMETHEUS_TAG" ;;
	esac
}

# official_of NAME is the image the tests use where the local one is missing
# (tenantdb/tenantdbtest/images.go).
official_of() {
	case "$1" in
	postgres) echo postgres:15 ;;
	redis) echo redis:7 ;;
	jaeger) echo jaegertracing/jaeger:2.12.0 ;;
	prometheus) echo prom/prometheus:v2.42.0 ;;
	esac
}

# run_build NAME builds one image, logging to $work/NAME.log, and prints the
# log's tail when the build fails.
run_build() {
	local name="$1" tag hash start old rc=0
	tag="$(tag_of "$name")"
	hash="$(recipe_hash "$name")"
	old="$(docker image inspect -f '{{.Id}}' "$tag" 2>/dev/null || true)"
	start=$SECONDS
	# A subshell outside any "||" context, so that set -e stops the build at
	# its first failing step.
	set +e
	(
		set -e
		"build_$name" "$tag" "$hash"
	) >"$work/$name.log" 2>&1
	rc=$?
	set -e
	if [ $rc -ne 0 ]; then
		log "$tag: build failed (exit $rc); last lines of its log:"
		tail -n 40 "$work/$name.log" >&2
		return $rc
	fi
	log "$tag: built in $((SECONDS - start))s ($(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}'))"
	# The image this one replaced is left untagged: remove it unless a
	# container still uses it or it has other tags (then rm refuses).
	if [ -n "$old" ] && [ "$old" != "$(docker image inspect -f '{{.Id}}' "$tag")" ]; then
		docker image rm "$old" >/dev/null 2>&1 || true
	fi
}

start=$SECONDS
todo=()
unserved=() # --if-needed: no local image, official one not in the store
for name in "${want[@]}"; do
	tag="$(tag_of "$name")"
	if [ $force -eq 0 ] && up_to_date "$tag" "$(recipe_hash "$name")"; then
		[ $if_needed -eq 1 ] || log "$tag: up to date"
		continue
	fi
	if [ $if_needed -eq 1 ] && ! docker image inspect "$tag" >/dev/null 2>&1; then
		# The tests take the official image where the local one is missing.
		docker image inspect "$(official_of "$name")" >/dev/null 2>&1 || unserved+=("$name")
		continue
	fi
	[ $if_needed -eq 0 ] || log "$tag: built from an older recipe, rebuilding"
	todo+=("$name")
done

# One pull of the first missing official image says whether a registry
# serves them; the tests pull the others themselves. Where none answers,
# build the local images instead.
if [ ${#unserved[@]} -gt 0 ]; then
	official="$(official_of "${unserved[0]}")"
	if pull_err="$(timeout 120 docker pull -q "$official" 2>&1 >/dev/null)"; then
		log "$official: pulled from a registry; the tests pull the other official images themselves"
	else
		[ -n "$pull_err" ] || pull_err="no answer in 120 s"
		log "no container registry serves the official images (docker pull $official: ${pull_err//$'\n'/ }):"
		log "building the local ones the tests use instead: ${unserved[*]} (once; later runs find them)"
		todo+=("${unserved[@]}")
	fi
fi
[ $if_needed -eq 0 ] || [ ${#todo[@]} -gt 0 ] || exit 0

# Jaeger's build is CPU-bound, the Debian ones mostly wait for downloads and
# dpkg: run Jaeger's in the background while the others run one by one.
failed=0
jaeger_pid=
for name in "${todo[@]}"; do
	if [ "$name" = jaeger ]; then
		log "$JAEGER_TAG: building from the Go module proxy"
		run_build jaeger &
		jaeger_pid=$!
		pids+=("$jaeger_pid")
	fi
done
for name in "${todo[@]}"; do
	[ "$name" != jaeger ] || continue
	log "$(tag_of "$name"): building from Debian $SUITE packages"
	run_build "$name" || failed=1
done
if [ -n "$jaeger_pid" ]; then
	wait "$jaeger_pid" || failed=1
	pids=()
fi

[ $failed -eq 0 ] || die "some images failed to build"
log "done in $((SECONDS - start))s"
