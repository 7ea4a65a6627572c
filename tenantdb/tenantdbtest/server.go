package tenantdbtest

import (
	"context"
	"fmt"

	"github.com/testcontainers/testcontainers-go"
)

// server is the fault injection that Postgres and Redis share: stopping,
// starting, pausing the server's container. For an existing server, named by
// an environment variable, there is no container and each method returns
// ErrNoContainer.
type server struct {
	base          // the container, nil for an existing server
	envVar string // the variable that names an existing server
}

// newServer is the fault injection of c, or of an existing server when c is
// nil.
func newServer[C testcontainers.Container](what, envVar string, c C) server {
	return server{base: newBase(what, c), envVar: envVar}
}

// Stop stops the container, keeping its data and host port: connections fail
// until Start. PostgreSQL shuts down fast (open transactions are rolled
// back); Redis saves its data set on the way down. ctx governs the Docker
// request.
func (s *server) Stop(ctx context.Context) error {
	if s.ctr == nil {
		return s.noContainer()
	}
	if err := s.ctr.Stop(ctx, nil); err != nil {
		return fmt.Errorf("tenantdbtest: stop %s: %w", s.what, err)
	}
	return nil
}

// Start starts a stopped container again and waits until the server answers
// at the same address; ctx governs the start and the wait.
func (s *server) Start(ctx context.Context) error {
	if s.ctr == nil {
		return s.noContainer()
	}
	if err := s.ctr.Start(ctx); err != nil {
		return fmt.Errorf("tenantdbtest: start %s again: %w", s.what, err)
	}
	return nil
}

// Restart is Stop followed by Start: every open connection breaks, and the
// server accepts new ones at the same address when Restart returns.
func (s *server) Restart(ctx context.Context) error {
	if err := s.Stop(ctx); err != nil {
		return err
	}
	return s.Start(ctx)
}

// Pause freezes the server's processes: connections stay open but get no
// answers, like a hung server or a dropped network, until Unpause.
func (s *server) Pause(ctx context.Context) error {
	return s.setPaused(ctx, true)
}

// Unpause lets a paused server go on.
func (s *server) Unpause(ctx context.Context) error {
	return s.setPaused(ctx, false)
}

func (s *server) setPaused(ctx context.Context, pause bool) error {
	if s.ctr == nil {
		return s.noContainer()
	}
	if err := setPaused(ctx, s.ctr, pause); err != nil {
		verb := "unpause"
		if pause {
			verb = "pause"
		}
		return fmt.Errorf("tenantdbtest: %s %s: %w", verb, s.what, err)
	}
	return nil
}

// noContainer is the error of fault injection without a container: the
// server is an existing one, named by s.envVar, or was given as a value.
func (s *server) noContainer() error {
	if s.envVar == "" {
		return ErrNoContainer
	}
	return fmt.Errorf("%w: %s is set", ErrNoContainer, s.envVar)
}
