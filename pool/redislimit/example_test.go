package redislimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tenantdb/tenantdb/pool"
	"github.com/tenantdb/tenantdb/pool/redislimit"
)

// A Limiter behind a Gate makes each plan's cap a cap for all the processes
// sharing the Redis. With tenantdb it goes in tenantdb.Config.Cluster the
// same way. Close the Limiter after the Gates (or pools) that use it.
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer rdb.Close()
	lim, err := redislimit.New(redislimit.Config{
		Client:   rdb,
		Prefix:   "billing-api",
		LeaseTTL: 10 * time.Second,    // a dead process's slots come back within this
		Mode:     redislimit.FailOpen, // Redis down: per-process caps only
	})
	if err != nil {
		panic(err)
	}
	defer lim.Close()

	gate, err := pool.New(pool.Config{
		Capacity: 20, // this process's connections
		Plans:    map[string]pool.Plan{"standard": {MaxConns: 4, MaxWaiting: 8, MaxWait: time.Second}},
		Cluster:  lim, // at most 4 per tenant across every process
	})
	if err != nil {
		panic(err)
	}
	defer gate.Close()

	permit, err := gate.Acquire(context.Background(), "acme")
	if err != nil {
		fmt.Println(err) // an *OverLimitError when acme's 4 cluster-wide slots stay taken
		return
	}
	defer permit.Release()
	st := lim.Stats()
	fmt.Println(st.Mode, st.Healthy, st.Held)
}
