//go:build race

package choose

// raceEnabled: the race detector is on; the model's walks start no
// goroutine, so the tests that walk whole schedules walk fewer under it.
const raceEnabled = true
