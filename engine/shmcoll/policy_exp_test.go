//go:build linux

package shmcoll

import (
	"fmt"
	"os"
	"time"
)

func init() {
	if s := os.Getenv("EXP_POLICY"); s != "" {
		var polls, spin, yields int
		fmt.Sscanf(s, "%d,%d,%d", &polls, &spin, &yields)
		expPolicy = func(a *Arena) {
			a.policy.Polls, a.policy.Spin, a.policy.Yields = polls, time.Duration(spin)*time.Microsecond, yields
		}
	}
}
