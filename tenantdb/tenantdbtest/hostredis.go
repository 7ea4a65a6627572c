package tenantdbtest

import (
	"context"
	"fmt"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// hostRedisImage resolves opts and the image for a set-up of several Redis
// servers in one container on the Docker host's network (a Redis Cluster,
// Sentinel): their addresses must be the ones the tests dial, as MOVED
// answers and sentinels announce them. what names the set-up in errors;
// ctx governs the Docker calls.
func hostRedisImage(ctx context.Context, what string, opts []RedisOption) (redisConfig, string, error) {
	cfg := redisConfig{startupTimeout: time.Minute}
	for _, o := range opts {
		o(&cfg)
	}
	d, err := connectDocker(ctx, what, redisAddrEnv)
	if err != nil {
		return cfg, "", err
	}
	defer d.close()
	if d.host != "127.0.0.1" && d.host != "localhost" {
		return cfg, "", fmt.Errorf("tenantdbtest: %s needs a local Docker daemon (its servers use the host's network); Docker is at %s", what, d.host)
	}
	image := cfg.image
	if image == "" {
		image = d.chooseImage(ctx, redisImageEnv, localRedisImage, officialRedisImage)
	}
	return cfg, image, nil
}

// runHostRedis runs script (sh) in image on the host's network and waits
// until it prints ready; ctx governs the start. On error no container is
// left running.
func runHostRedis(ctx context.Context, cfg redisConfig, image, what, script, ready string) (testcontainers.Container, error) {
	ctr, err := testcontainers.Run(ctx, image,
		testcontainers.WithEntrypoint("sh", "-c", script),
		testcontainers.WithCmd(),
		testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) { hc.NetworkMode = "host" }),
		testcontainers.WithWaitStrategyAndDeadline(cfg.startupTimeout, wait.ForLog(ready)),
	)
	if err != nil {
		if ctr != nil {
			_ = testcontainers.TerminateContainer(ctr)
		}
		return nil, fmt.Errorf("tenantdbtest: start %s from %s: %w%s", what, image, err,
			imageHint(image, officialRedisImage, localRedisImage, redisImageEnv))
	}
	return ctr, nil
}
