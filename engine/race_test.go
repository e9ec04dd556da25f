//go:build race

package engine

// raceEnabled: the race detector is on (its shadow memory makes resident
// memory meaningless to compare).
const raceEnabled = true
