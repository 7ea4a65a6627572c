package tenantsql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// Doc is a row of setupRLS's docs table.
type Doc struct {
	ID     int64
	Tenant string `gorm:"->"` // set by the column's default, the tenant's setting
	Body   string
}

// openGORM opens GORM on db with GORM's default config, which pings
// without a context.
func openGORM(t testing.TB, db *sql.DB) *gorm.DB {
	t.Helper()
	g, err := gorm.Open(postgres.New(postgres.Config{Conn: db}), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatalf("gorm.Open: %v", err)
	}
	return g
}

func bodies(docs []Doc) []string {
	var out []string
	for _, d := range docs {
		out = append(out, d.Body)
	}
	sort.Strings(out)
	return out
}

// TestGORMRowLevelSecurity runs tenants a and b concurrently through GORM on
// two shared connections, reading, creating in GORM's default transaction
// and updating: each sees and changes only its own rows, and a query
// without a tenant fails with ErrNoTenant.
func TestGORMRowLevelSecurity(t *testing.T) {
	dsn := setupRLS(t)
	p := newPool(t, dsn, 2, tenantdb.Plan{MaxConns: 1, MaxWaiting: 10, MaxWait: time.Minute}, rlsSession)
	g := openGORM(t, openDB(t, p))

	if err := g.Find(&[]Doc{}).Error; !errors.Is(err, tenantdb.ErrNoTenant) {
		t.Fatalf("GORM Find without a tenant: %v; want ErrNoTenant", err)
	}

	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, tenant := range []string{"a", "b"} {
		wg.Go(func() {
			gt := g.WithContext(as(tenant))
			mine := map[string][]string{"a": {"a1", "a2"}, "b": {"b1"}}[tenant]
			for i := range 20 {
				var docs []Doc
				if err := gt.Order("id").Find(&docs).Error; err != nil {
					errs <- fmt.Errorf("tenant %s: Find: %w", tenant, err)
					return
				}
				for _, d := range docs {
					if d.Tenant != tenant {
						errs <- fmt.Errorf("tenant %s saw tenant %s's row %q", tenant, d.Tenant, d.Body)
						return
					}
				}
				if got := bodies(docs); !slices.Equal(got, mine) {
					errs <- fmt.Errorf("tenant %s saw %v; want %v", tenant, got, mine)
					return
				}
				body := fmt.Sprintf("%s-new-%d", tenant, i)
				doc := Doc{Body: body}
				if err := gt.Create(&doc).Error; err != nil {
					errs <- fmt.Errorf("tenant %s: Create: %w", tenant, err)
					return
				}
				// Every other tenant's rows are invisible to an update too.
				if n := gt.Model(&Doc{}).Where("1 = 1").Update("body", gorm.Expr("body")).RowsAffected; n != int64(len(mine)+1) {
					errs <- fmt.Errorf("tenant %s: an update of every row touched %d rows; want %d", tenant, n, len(mine)+1)
					return
				}
				if err := gt.Delete(&doc).Error; err != nil {
					errs <- fmt.Errorf("tenant %s: Delete: %w", tenant, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assertReleased(t, p, "a")
	assertReleased(t, p, "b")
}

// TestGORMReleasesSlots checks GORM's paths: a Scan error, a Transaction
// whose function fails (rolled back) and one that commits, and a cancelled
// context each leave the tenant holding no slot.
func TestGORMReleasesSlots(t *testing.T) {
	p := newPool(t, "", 4, tenantdb.Plan{MaxConns: 2}, tenantdb.Session{})
	g := openGORM(t, openDB(t, p)).WithContext(as("a"))

	var out struct{ N int }
	if err := g.Raw("select 'not a number' as n").Scan(&out).Error; err == nil {
		t.Fatal("GORM scanned text into an int")
	}
	assertReleased(t, p, "a")

	errFail := errors.New("fail")
	err := g.Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec("select 1").Error; err != nil {
			return err
		}
		if n := inUse(p, "a"); n != 1 {
			return fmt.Errorf("a GORM transaction holds %d slots; want 1", n)
		}
		return errFail
	})
	if !errors.Is(err, errFail) {
		t.Fatalf("Transaction: %v; want the function's error", err)
	}
	assertReleased(t, p, "a")
	if err := g.Transaction(func(tx *gorm.DB) error { return tx.Exec("select 1").Error }); err != nil {
		t.Fatal(err)
	}
	assertReleased(t, p, "a")

	ctx, cancel := context.WithCancel(as("a"))
	done := make(chan error, 1)
	go func() { done <- g.WithContext(ctx).Exec("select pg_sleep(60)").Error }()
	eventually(t, "the sleep holds a slot", func() bool { return inUse(p, "a") == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled GORM Exec: %v; want context.Canceled", err)
	}
	eventually(t, "the cancelled statement's slot is back", func() bool { return inUse(p, "a") == 0 })
	assertReleased(t, p, "a")
}

// TestGORMNoisyNeighbour loads a noisy tenant with slow GORM statements,
// many more than its cap of 2, and measures a quiet tenant's short GORM
// statements: the noisy tenant never has more than 2 backends running
// (counted in pg_stat_activity), and the quiet tenant's median latency stays
// within 1.5x of its unloaded median, measured in the same run. The same
// load through stdlib.OpenDBFromPool on the same pgxpool (no caps) is
// measured as the control: the quiet median there must be at least 3x the
// unloaded one, or the test could not have failed.
func TestGORMNoisyNeighbour(t *testing.T) {
	const (
		maxConns    = 4
		noisyCap    = 2
		noisyWorker = 8
		quietN      = 25
	)
	p := newPool(t, "", maxConns, tenantdb.Plan{MaxConns: noisyCap, MaxWaiting: noisyWorker, MaxWait: time.Minute}, tenantdb.Session{})
	capped := openGORM(t, openDB(t, p))
	rawDB := stdlib.OpenDBFromPool(p.Pgxpool())
	t.Cleanup(func() { rawDB.Close() })
	uncapped := openGORM(t, rawDB)

	quiet := func(g *gorm.DB) time.Duration {
		t.Helper()
		g = g.WithContext(as("quiet"))
		lat := make([]time.Duration, quietN)
		for i := range lat {
			start := time.Now()
			if err := g.Exec("select pg_sleep(0.02)").Error; err != nil {
				t.Fatalf("quiet tenant: %v", err)
			}
			lat[i] = time.Since(start)
		}
		slices.Sort(lat)
		return lat[len(lat)/2]
	}

	// load runs the noisy tenant's workers through g until stop, and
	// returns the most noisy backends seen running at once.
	load := func(g *gorm.DB, during func()) int {
		t.Helper()
		admin, err := pgx.Connect(context.Background(), sharedPG.DSN)
		if err != nil {
			t.Fatal(err)
		}
		defer admin.Close(context.Background())
		stop := make(chan struct{})
		var wg sync.WaitGroup
		errs := make(chan error, noisyWorker+1)
		for range noisyWorker {
			wg.Go(func() {
				gn := g.WithContext(as("noisy"))
				for {
					select {
					case <-stop:
						return
					default:
					}
					if err := gn.Exec("select pg_sleep(0.2) -- noisy").Error; err != nil {
						errs <- err
						return
					}
				}
			})
		}
		// One sampler owns the admin connection; now and most are what it saw
		// last and at most.
		var now, most atomic.Int64
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			for {
				select {
				case <-stop:
					return
				default:
				}
				var n int64
				err := admin.QueryRow(context.Background(), `select count(*) from pg_stat_activity
					where state = 'active' and query like '%-- noisy' and pid <> pg_backend_pid()`).Scan(&n)
				if err != nil {
					errs <- err
					return
				}
				now.Store(n)
				if n > most.Load() {
					most.Store(n)
				}
			}
		}()
		// The noisy tenant has reached its load before the quiet one starts.
		eventually(t, "the noisy tenant runs", func() bool { return now.Load() >= noisyCap })
		during()
		close(stop)
		wg.Wait()
		<-sampled
		close(errs)
		for err := range errs {
			t.Fatalf("noisy tenant: %v", err)
		}
		return int(most.Load())
	}

	unloaded := quiet(capped)
	var loaded, control time.Duration
	most := load(capped, func() { loaded = quiet(capped) })
	mostUncapped := load(uncapped, func() { control = quiet(uncapped) })
	t.Logf("quiet tenant p50: unloaded %v, noisy neighbour capped at %d %v (%.2fx), uncapped %v (%.2fx); noisy backends at once: %d capped, %d uncapped",
		unloaded, noisyCap, loaded, float64(loaded)/float64(unloaded), control, float64(control)/float64(unloaded), most, mostUncapped)
	if most != noisyCap {
		t.Errorf("the noisy tenant ran %d backends at once through tenantsql; want its cap, %d", most, noisyCap)
	}
	if float64(loaded) > 1.5*float64(unloaded) {
		t.Errorf("the quiet tenant's p50 went from %v unloaded to %v beside the capped noisy tenant; want within 1.5x", unloaded, loaded)
	}
	if float64(control) < 3*float64(unloaded) {
		t.Errorf("control: without caps the quiet tenant's p50 was %v, unloaded %v: the load does not crowd it out, so the test proves nothing", control, unloaded)
	}
	assertReleased(t, p, "noisy")
	assertReleased(t, p, "quiet")
}
