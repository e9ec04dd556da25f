package vppu

import (
	"bytes"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine"
	"github.com/gocoll/gocoll/engine/proctest"
)

// collectivesChild is one rank of TestCollectivesProcesses: 8 devices
// placed by VPPU_FROM, every collective's result on every local device
// checked against the reference. Exit 0: all equal; 4: a call failed or a
// result differs.
func collectivesChild(pc *engine.Comm) int {
	const m = 8
	place, err := ParsePlace(os.Getenv("VPPU_FROM"), m)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	l, err := ParseLogical("ring", m)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	c, err := New(pc, l, place)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 4
	}
	defer c.Destroy()
	want, bad := reference(m), 0
	err = everyCollective(c, func(name string, v int, b []byte) {
		if !bytes.Equal(b, want[name][v]) {
			fmt.Fprintf(os.Stderr, "rank %d: %s on device %d differs from the reference\n", pc.Rank(), name, v)
			bad++
		}
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "rank %d: %v\n", pc.Rank(), err)
		return 4
	}
	if bad > 0 {
		return 4
	}
	return 0
}

// TestCollectivesProcesses: every virtual collective across real
// processes, over shared memory and TCP, on block, cyclic and explicit
// placements, equal bit for bit to the reference.
func TestCollectivesProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	for _, tc := range []struct {
		name  string
		n     int
		place string
		env   []string
	}{
		{"block-shm", 2, "block:2", nil},
		{"cyclic-shm", 3, "cyclic:3", nil},
		{"explicit-tcp", 3, "2,2,0,1,1,2,0,0", []string{"GOCOLL_TRANSPORT=tcp"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := append([]string{"VPPU_FROM=" + tc.place, "GOCOLL_TIMEOUT=60s"}, tc.env...)
			kids := proctest.Start(t, "collectives", tc.n, env, nil)
			proctest.Wait(t, kids, 2*time.Minute)
			for r, k := range kids {
				if k.Err != nil {
					t.Errorf("rank %d: %v\n%s", r, k.Err, k.Out.String())
				}
			}
		})
	}
}
