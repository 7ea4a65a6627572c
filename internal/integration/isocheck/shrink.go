package main

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"time"
)

var digits = regexp.MustCompile(`[0-9]+`)

// violationKind is a violation's message without its numbers (ports, op
// numbers, counts): a replay must fail the same way, not just fail.
func violationKind(msg string) string { return digits.ReplaceAllString(msg, "N") }

// shrink looks for a shorter sequence of ops that still breaks an
// invariant, delta-debugging style: it replays the ops up to the first
// violation (and those in flight with it), then without chunks of them,
// each time in a fresh Pool, and keeps every removal after which a replay
// still fails the same way (violationKind). It stops when no chunk can go or budget is spent, and returns
// the shortest failing sequence and whether it reproduced at all.
func shrink(ctx context.Context, e *env, c config, o runOptions, failed *runCtx, budget time.Duration, out io.Writer) ([]op, bool) {
	vs := failed.sortedViolations()
	cand := failed.executed
	if len(vs) > 0 && vs[0].seq >= 0 {
		upTo := vs[0].seq + int64(o.workers)
		cand = nil
		for i, s := range failed.seqOf {
			if s <= upTo {
				cand = append(cand, failed.executed[i])
			}
		}
	}
	want := ""
	if len(vs) > 0 {
		want = violationKind(vs[0].msg)
	}
	end := time.Now().Add(budget)
	fails := func(ops []op) bool {
		for try := 0; try < 2; try++ {
			if time.Now().After(end) || ctx.Err() != nil {
				return false
			}
			ro := o
			ro.plan = make([][]op, o.workers)
			for _, x := range ops {
				ro.plan[x.worker] = append(ro.plan[x.worker], x)
			}
			ro.stopOnViolation = true
			rctx, cancel := context.WithDeadline(ctx, end)
			rc, err := runOnce(rctx, e, c, ro)
			cancel()
			if err != nil {
				fmt.Fprintf(out, "shrink: replay: %v\n", err)
				return false
			}
			for _, v := range rc.sortedViolations() {
				if violationKind(v.msg) == want {
					return true
				}
			}
		}
		return false
	}
	if !fails(cand) {
		return cand, false
	}
	n := 2
	for len(cand) >= 2 && time.Now().Before(end) {
		chunk := (len(cand) + n - 1) / n
		removed := false
		for start := 0; start < len(cand); start += chunk {
			rest := append(append([]op(nil), cand[:start]...), cand[min(start+chunk, len(cand)):]...)
			if len(rest) > 0 && fails(rest) {
				cand = rest
				n = max(n-1, 2)
				removed = true
				break
			}
		}
		if !removed {
			if n >= len(cand) {
				break
			}
			n = min(n*2, len(cand))
		}
	}
	return cand, true
}
