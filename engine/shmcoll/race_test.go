//go:build linux && race

package shmcoll

const raceEnabled = true
