//go:build !race

package choose

const raceEnabled = false
