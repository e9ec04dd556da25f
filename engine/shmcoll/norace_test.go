//go:build linux && !race

package shmcoll

const raceEnabled = false
