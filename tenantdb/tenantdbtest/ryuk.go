package tenantdbtest

import (
	"context"
	"os"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
)

// ryukDisabledEnv is testcontainers' switch for its reaper, Ryuk.
const ryukDisabledEnv = "TESTCONTAINERS_RYUK_DISABLED"

// registryProbeTimeout bounds the question whether a registry serves the
// reaper's image; a registry that answers does so in a few seconds.
const registryProbeTimeout = 15 * time.Second

var reaperOnce sync.Once

// disableReaperWhereUnavailable sets TESTCONTAINERS_RYUK_DISABLED=true when
// it is unset, no hub prefix names a mirror, and the reaper's image is
// neither in the local store nor served by a registry: every container start
// would fail starting the reaper otherwise. It must run before testcontainers
// reads its configuration, which it does once per process, so connectDocker
// calls it before its first use of testcontainers.
func disableReaperWhereUnavailable(ctx context.Context) {
	reaperOnce.Do(func() {
		if _, set := os.LookupEnv(ryukDisabledEnv); set || os.Getenv("TESTCONTAINERS_HUB_IMAGE_NAME_PREFIX") != "" {
			return
		}
		cli, err := client.New(client.FromEnv)
		if err != nil {
			return
		}
		defer cli.Close()
		if reaperUnavailable(ctx, cli, testcontainers.ReaperDefaultImage) {
			_ = os.Setenv(ryukDisabledEnv, "true")
		}
	})
}

// imageSource is what reaperUnavailable asks of Docker.
type imageSource interface {
	ImageInspect(ctx context.Context, image string, opts ...client.ImageInspectOption) (client.ImageInspectResult, error)
	DistributionInspect(ctx context.Context, image string, opts client.DistributionInspectOptions) (client.DistributionInspectResult, error)
}

// reaperUnavailable reports whether image is missing from the local store
// and no registry the daemon asks serves it. Any other failure (no daemon,
// say) reports false: connectDocker says what is wrong with Docker.
func reaperUnavailable(ctx context.Context, d imageSource, image string) bool {
	_, err := d.ImageInspect(ctx, image)
	if err == nil || !cerrdefs.IsNotFound(err) {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, registryProbeTimeout)
	defer cancel()
	_, err = d.DistributionInspect(ctx, image, client.DistributionInspectOptions{})
	return err != nil
}
