// Package tenantdbtest starts the servers that tenantdb's tests need —
// PostgreSQL, Redis, Jaeger and Prometheus — as containers with testcontainers-go, or
// points at servers that already run; StartReplica adds a streaming replica
// of a PostgreSQL container. PgBouncer (StartPgBouncer) runs on the
// host instead, from the distribution's package, in front of a Postgres;
// tests that need it are skipped where it is not installed.
//
// Each service has two entry points: StartX(t, ...) for tests, which fails
// the test when the server cannot be had and terminates the container when
// the test ends, and RunX(ctx, ...) for programs outside tests (the noisy
// neighbour demo, say), which returns an error and leaves the container's
// end to the caller's Terminate.
//
// # Images
//
// Each service picks its image from an environment variable; when it is
// unset, a local image built by testdata/build-images.sh in the tenantdb
// repository is preferred if the local Docker store has it, and the official
// image is used otherwise (and pulled if needed):
//
//	TENANTDB_POSTGRES_IMAGE  default tenantdb/postgres:15, else postgres:15
//	TENANTDB_REDIS_IMAGE     default tenantdb/redis:7, else redis:7
//	TENANTDB_JAEGER_IMAGE    default tenantdb/jaeger:1.75.0, else jaegertracing/jaeger:2.12.0
//	TENANTDB_PROMETHEUS_IMAGE default tenantdb/prometheus:2, else prom/prometheus:v2.42.0
//
// Both kinds of image behave the same for these helpers, so a machine with a
// registry needs no preparation and one without needs only the local build.
//
// # Existing servers
//
// When one of these is set, the helper starts no container and returns the
// server it names; Container is then nil and fault injection (Stop, Start,
// Pause) returns ErrNoContainer:
//
//	TENANTDB_POSTGRES_DSN               postgres://user:pass@host:5432/db?sslmode=disable
//	TENANTDB_REDIS_ADDR                 host:6379
//	TENANTDB_JAEGER_QUERY_URL           http://host:16686 (required to use an existing Jaeger)
//	TENANTDB_JAEGER_OTLP_GRPC_ENDPOINT  host:4317 (default: the query URL's host, port 4317)
//	TENANTDB_JAEGER_OTLP_HTTP_ENDPOINT  host:4318 (default: the query URL's host, port 4318)
//
// # Ryuk
//
// testcontainers-go normally starts a reaper container (Ryuk) that removes
// leftover containers when the test process dies. Where its image can be
// had neither from the local store nor from a registry (as in our CI), every
// container start would fail on it: when TESTCONTAINERS_RYUK_DISABLED is
// unset (and TESTCONTAINERS_HUB_IMAGE_NAME_PREFIX names no mirror), the
// first start asks the Docker daemon of DOCKER_HOST (or the default socket)
// and sets it to true there, so a plain `go test` works. Set it yourself to
// decide either way. Every container started here is terminated by
// t.Cleanup or by Terminate either way; with the reaper off, a test process
// killed before its cleanups run leaves its containers behind (they carry
// the label org.testcontainers=true).
package tenantdbtest
