package tenantdbtest

import (
	"context"
	"errors"
	"fmt"
	"testing"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"
)

// fakeImages answers ImageInspect and DistributionInspect with the given
// errors and counts the registry's questions.
type fakeImages struct {
	local, registry error
	asked           int
}

func (f *fakeImages) ImageInspect(context.Context, string, ...client.ImageInspectOption) (client.ImageInspectResult, error) {
	return client.ImageInspectResult{}, f.local
}

func (f *fakeImages) DistributionInspect(context.Context, string, client.DistributionInspectOptions) (client.DistributionInspectResult, error) {
	f.asked++
	return client.DistributionInspectResult{}, f.registry
}

func TestReaperUnavailable(t *testing.T) {
	notFound := fmt.Errorf("no such image: %w", cerrdefs.ErrNotFound)
	for _, tc := range []struct {
		name            string
		local, registry error
		want            bool
		asked           int
	}{
		{"in the local store", nil, errors.New("no registry"), false, 0},
		{"served by a registry", notFound, nil, false, 1},
		{"neither", notFound, errors.New("lookup registry-1.docker.io: no such host"), true, 1},
		{"no daemon", errors.New("cannot connect to the Docker daemon"), errors.New("no registry"), false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeImages{local: tc.local, registry: tc.registry}
			if got := reaperUnavailable(context.Background(), f, "testcontainers/ryuk"); got != tc.want || f.asked != tc.asked {
				t.Fatalf("reaperUnavailable = %v after %d registry questions, want %v after %d", got, f.asked, tc.want, tc.asked)
			}
		})
	}
}
