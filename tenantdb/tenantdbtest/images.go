package tenantdbtest

import (
	"context"
	"fmt"
	"os"
)

// images names a service's images: the environment variable that chooses
// one, the image testdata/build-images.sh builds where no registry is
// reachable, and the official one.
type images struct {
	env, local, official string
}

// The images of each service.
var (
	postgresImages   = images{env: "TENANTDB_POSTGRES_IMAGE", local: "tenantdb/postgres:15", official: "postgres:15"}
	redisImages      = images{env: "TENANTDB_REDIS_IMAGE", local: "tenantdb/redis:7", official: "redis:7"}
	prometheusImages = images{env: "TENANTDB_PROMETHEUS_IMAGE", local: "tenantdb/prometheus:2", official: "prom/prometheus:v2.42.0"}
	// Jaeger tags its releases in pairs: v2.12.0 is the image of the same
	// source as the Go module version v1.75.0 that the local image builds.
	jaegerImages = images{env: "TENANTDB_JAEGER_IMAGE", local: "tenantdb/jaeger:1.75.0", official: "jaegertracing/jaeger:2.12.0"}
)

// connect connects to Docker to start what (envVar would name an existing
// server instead) and chooses the image: given, else the one of the
// environment variable, else the local one if the local image store has it,
// else the official one. Preferring the local image means a machine without
// a registry never tries to pull.
func (im images) connect(ctx context.Context, what, envVar, given string) (*dockerEnv, string, error) {
	d, err := connectDocker(ctx, what, envVar)
	if err != nil {
		return nil, "", err
	}
	defer d.close()
	return d, im.choose(ctx, d, given), nil
}

// choose is connect's choice of the image, with d's provider.
func (im images) choose(ctx context.Context, d *dockerEnv, given string) string {
	if given != "" {
		return given
	}
	if img := os.Getenv(im.env); img != "" {
		return img
	}
	if _, err := d.provider.Client().ImageInspect(ctx, im.local); err == nil {
		return im.local
	}
	return im.official
}

// startError is the error of a failed start of what from image, with a hint
// when the official image was tried: most likely no registry is reachable
// and the local image was never built.
func (im images) startError(what, image string, err error) error {
	hint := ""
	if image == im.official {
		hint = fmt.Sprintf(" (no local image %s was found and %s could not be used: where no registry is reachable, "+
			"build the local images with testdata/build-images.sh from the tenantdb repository, or set %s)", im.local, im.official, im.env)
	}
	return fmt.Errorf("tenantdbtest: start %s from %s: %w%s", what, image, err, hint)
}
