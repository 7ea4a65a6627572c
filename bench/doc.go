// Package bench holds tenantdb's benchmarks against a real PostgreSQL and,
// in bench/noisy, the noisy-neighbour demo.
//
// The benchmarks start PostgreSQL with tenantdbtest the first time one of
// them needs it (or use TENANTDB_POSTGRES_DSN). Each compares tenantdb with
// raw pgxpool in the same run, so the ratio holds on a noisy machine:
//
//	go test -run XXX -bench . -count 6 ./bench | tee new.txt
//	benchstat new.txt
package bench
