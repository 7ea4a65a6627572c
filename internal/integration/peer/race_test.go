//go:build race

package peer

// raceEnabled: the suites run with -race when this test does.
const raceEnabled = true
