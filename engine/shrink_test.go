package engine

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/internal/recovery"
	"github.com/gocoll/gocoll/engine/transport/tcp"
)

// crash makes c's rank look like a dead process to the others: its
// transport and control links close without a goodbye.
func crash(c *Comm) {
	c.ctl.Crash()
	c.Abort()
	c.tr.Close()
}

// shrinkWorlds are the in-process worlds Shrink is tested on: the
// in-memory transport, and ranks joined over TCP and over shared memory
// (whose control links are TCP).
var shrinkWorlds = []struct {
	name string
	make func(t testing.TB, n int, opts Options) []*Comm
}{
	{"mem", newLocal},
	{"tcp", func(t testing.TB, n int, opts Options) []*Comm { opts.Transport = "tcp"; return newJoined(t, n, opts) }},
	{"shm", newShm},
}

// checkSum runs an allreduce of rank+1 over comms and checks the sums.
func checkSum(t *testing.T, comms []*Comm) {
	t.Helper()
	n := len(comms)
	mustRanks(t, comms, func(c *Comm) error {
		if c.Size() != n {
			return fmt.Errorf("size %d, want %d", c.Size(), n)
		}
		buf := make([]byte, 4*100)
		for i := 0; i < 100; i++ {
			putF32(buf[4*i:], float32(c.Rank()+1))
		}
		if err := c.AllReduce(buf, buf, 100, Float32, Sum); err != nil {
			return err
		}
		want := make([]byte, 4)
		putF32(want, float32(n*(n+1)/2))
		for i := 0; i < 100; i++ {
			if string(buf[4*i:4*i+4]) != string(want) {
				return fmt.Errorf("element %d wrong", i)
			}
		}
		return nil
	})
}

// shrinkAll runs Shrink(exclude) on comms (nil entries skipped) and returns
// the children by rank of the parent.
func shrinkAll(comms []*Comm, exclude []int) ([]*Comm, []error) {
	kids := make([]*Comm, len(comms))
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		if c == nil {
			continue
		}
		wg.Go(func() { kids[r], errs[r] = c.Shrink(exclude) })
	}
	wg.Wait()
	return kids, errs
}

func destroyLive(comms []*Comm) {
	for _, c := range comms {
		if c != nil {
			c.Destroy()
		}
	}
}

// TestShrinkAfterKill kills one of 4 ranks (the coordinator, rank 0, and
// another) in the middle of allreducing; the survivors agree it failed,
// shrink to 3 ranks renumbered in order, and allreduce correctly.
func TestShrinkAfterKill(t *testing.T) {
	for _, w := range shrinkWorlds {
		for _, victim := range []int{0, 2} {
			t.Run(fmt.Sprintf("%s/kill=%d", w.name, victim), func(t *testing.T) {
				comms := w.make(t, 4, Options{Timeout: 5 * time.Second})
				checkSum(t, comms)
				var wg sync.WaitGroup
				for r, c := range comms {
					if r != victim {
						wg.Go(func() {
							b := make([]byte, 4<<10)
							for c.AllReduce(b, b, 1<<10, Float32, Sum) == nil {
							}
						})
					}
				}
				time.Sleep(10 * time.Millisecond)
				crash(comms[victim])
				wg.Wait()
				live := slices.Clone(comms)
				live[victim] = nil
				kids, errs := shrinkAll(live, nil)
				for r, err := range errs {
					if err != nil {
						t.Fatalf("rank %d: %v", r, err)
					}
				}
				defer destroyLive(kids)
				var got []*Comm
				for r, k := range kids {
					if r == victim {
						continue
					}
					if want := r - btoi(r > victim); k.Rank() != want {
						t.Fatalf("rank %d became %d, want %d", r, k.Rank(), want)
					}
					if f := comms[r].Failed(); !slices.Equal(f, []int{victim}) {
						t.Fatalf("rank %d: Failed() = %v, want [%d]", r, f, victim)
					}
					got = append(got, k)
				}
				checkSum(t, got)
			})
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestShrinkExclude leaves out ranks by list, and refuses bad lists.
func TestShrinkExclude(t *testing.T) {
	comms := newLocal(t, 5, Options{Timeout: 5 * time.Second})
	for _, bad := range [][]int{{5}, {-1}, {1, 1}, {0}} {
		if _, err := comms[0].Shrink(bad); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("Shrink(%v) = %v, want ErrInvalidArgument", bad, err)
		}
	}
	live := []*Comm{comms[0], nil, comms[2], nil, comms[4]}
	kids, errs := shrinkAll(live, []int{1, 3})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	defer destroyLive(kids)
	checkSum(t, []*Comm{kids[0], kids[2], kids[4]})
	if kids[4].Rank() != 2 {
		t.Fatalf("rank 4 became %d", kids[4].Rank())
	}
}

// TestRevoke: a revoke fails the operations pending on every rank and
// later ones with ErrRevoked; it is idempotent; the revoked communicator
// shrinks to all its ranks.
func TestRevoke(t *testing.T) {
	for _, w := range shrinkWorlds {
		t.Run(w.name, func(t *testing.T) {
			comms := w.make(t, 3, Options{Timeout: 10 * time.Second})
			errs := make([]error, 3)
			var wg sync.WaitGroup
			for r := 1; r < 3; r++ {
				wg.Go(func() {
					b := make([]byte, 64)
					errs[r] = comms[r].AllReduce(b, b, 16, Float32, Sum)
				})
			}
			time.Sleep(20 * time.Millisecond)
			comms[0].Revoke()
			comms[0].Revoke()
			wg.Wait()
			for r := 1; r < 3; r++ {
				if !errors.Is(errs[r], ErrRevoked) {
					t.Fatalf("rank %d: pending allreduce: %v, want ErrRevoked", r, errs[r])
				}
			}
			for r, c := range comms {
				b := make([]byte, 64)
				if err := c.AllReduce(b, b, 16, Float32, Sum); !errors.Is(err, ErrRevoked) {
					t.Fatalf("rank %d: later allreduce: %v, want ErrRevoked", r, err)
				}
			}
			kids, serrs := shrinkAll(comms, nil)
			for r, err := range serrs {
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
			}
			defer destroyLive(kids)
			checkSum(t, kids)
		})
	}
}

// TestShrinkStalledRank: a rank that stays silent past the timeout (as a
// stopped process) is left out; when it comes back it gets ErrExcluded.
func TestShrinkStalledRank(t *testing.T) {
	for _, w := range shrinkWorlds[:2] {
		t.Run(w.name, func(t *testing.T) {
			timeout := time.Second // a healthy rank must answer within it, even on a loaded machine
			comms := w.make(t, 4, Options{Timeout: timeout})
			kids, errs := shrinkAll(comms[:3], nil)
			for r, err := range errs {
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
			}
			defer destroyLive(kids)
			checkSum(t, kids)
			if f := comms[0].Failed(); !slices.Equal(f, []int{3}) {
				t.Fatalf("Failed() = %v, want [3]", f)
			}
			for i := 0; i < 2; i++ { // and again: it stays out
				if _, err := comms[3].Shrink(nil); !errors.Is(err, ErrExcluded) {
					t.Fatalf("the stalled rank's Shrink #%d: %v, want ErrExcluded", i, err)
				}
			}
		})
	}
}

// TestShrinkDeathDuringShrink kills a second rank inside the shrink (after
// the agreement, or after connecting): one more round leaves it out too.
func TestShrinkDeathDuringShrink(t *testing.T) {
	for _, w := range shrinkWorlds[:2] {
		for _, point := range []string{"agreed", "connected"} {
			for _, second := range []int{0, 3} {
				t.Run(fmt.Sprintf("%s/%s/second=%d", w.name, point, second), func(t *testing.T) {
					opts := Options{Timeout: 5 * time.Second, hooks: crashOnceAt(second, point)}
					kids, got := shrinkAfterCrash(t, w.make(t, 5, opts), second)
					defer destroyLive(kids)
					checkSum(t, got)
				})
			}
		}
	}
}

// TestShrinkTreeTCP: 12 ranks over TCP lose rank 1 and shrink to 11, so
// that the setup table goes two levels down the exchange's tree (view
// positions 5 and up get it from a member, not from rank 0), with JSON
// frames on real connections; with second set, rank 2 — position 1, the
// parent of positions 5–8 — dies as well once the first agreement
// decided, and the others agree again without it.
func TestShrinkTreeTCP(t *testing.T) {
	for _, second := range []int{-1, 2} {
		t.Run(fmt.Sprintf("second=%d", second), func(t *testing.T) {
			opts := Options{Transport: "tcp", Timeout: 5 * time.Second, hooks: crashOnceAt(second, "agreed")}
			kids, got := shrinkAfterCrash(t, newJoined(t, 12, opts), second)
			defer destroyLive(kids)
			checkSum(t, got)
		})
	}
}

// crashOnceAt crashes rank the first time its Shrink reaches point
// (testHooks.shrink); rank -1: none.
func crashOnceAt(rank int, point string) *testHooks {
	var once sync.Once
	return &testHooks{shrink: func(r int, p string) bool {
		hit := false
		if r == rank && p == point {
			once.Do(func() { hit = true })
		}
		return hit
	}}
}

// shrinkAfterCrash crashes rank 1 of comms and shrinks the others, of
// whom second (or none: -1) crashes on its way (crashOnceAt): it returns
// every child, to destroy, and the survivors', which must all have
// shrunk.
func shrinkAfterCrash(t *testing.T, comms []*Comm, second int) (kids, survivors []*Comm) {
	t.Helper()
	crash(comms[1])
	live := slices.Clone(comms)
	live[1] = nil
	kids, errs := shrinkAll(live, nil)
	for r, k := range kids {
		if r == 1 || r == second {
			continue
		}
		if errs[r] != nil {
			destroyLive(kids)
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		survivors = append(survivors, k)
	}
	return kids, survivors
}

// growBy1 has comms (one communicator's ranks) admit one process that
// joins with secret: it returns the grown communicator's ranks (the
// joiner last) and the joiner's error.
func growBy1(t *testing.T, comms []*Comm, secret []byte, opts Options) ([]*Comm, error) {
	t.Helper()
	info, err := comms[0].JoinInfo()
	if err != nil {
		t.Fatal(err)
	}
	var joiner *Comm
	var jerr error
	var wg sync.WaitGroup
	wg.Go(func() { joiner, jerr = Join(info, secret, opts) })
	grown := make([]*Comm, len(comms))
	errs := runRanks(comms, func(c *Comm) error {
		g, err := c.Grow(1)
		grown[c.Rank()] = g
		return err
	})
	wg.Wait()
	if jerr != nil {
		destroyLive(grown)
		return nil, jerr
	}
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: grow: %v", r, err)
		}
	}
	return append(grown, joiner), nil
}

func secretOf(c *Comm) []byte { return c.split.(*netSplitter).secret }

// TestGrow: after a shrink, a new process joins through JoinInfo with the
// job's secret and the members admit it; a wrong secret is refused.
func TestGrow(t *testing.T) {
	opts := Options{Transport: "tcp", Timeout: 5 * time.Second}
	comms := newJoined(t, 3, opts)
	crash(comms[2])
	kids, errs := shrinkAll(comms[:2], nil)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	defer destroyLive(kids)
	grown, err := growBy1(t, kids, secretOf(comms[0]), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer destroyLive(grown)
	if grown[2].Rank() != 2 || grown[2].Size() != 3 {
		t.Fatalf("the joiner is rank %d of %d", grown[2].Rank(), grown[2].Size())
	}
	checkSum(t, grown)

	// Bad input.
	info, _ := kids[0].JoinInfo()
	short := Options{Transport: "tcp", Timeout: 300 * time.Millisecond}
	if _, err := Join(info, []byte("not the secret"), short); !errors.Is(err, ErrAuth) {
		t.Fatalf("join with a wrong secret: %v, want ErrAuth", err)
	}
	if _, err := Join("gocoll-join:1:zz:127.0.0.1:1", secretOf(comms[0]), short); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("join with bad info: %v, want ErrInvalidArgument", err)
	}
	if _, err := kids[0].Grow(0); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Grow(0): %v", err)
	}
	tooMany := recovery.MaxJoiners(2) + 1
	if _, err := kids[0].Grow(tooMany); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "at most") {
		t.Fatalf("Grow(%d), more than may wait to join: %v, want ErrInvalidArgument naming the bound", tooMany, err)
	}
	local := newLocal(t, 2, opts)
	if _, err := local[0].Grow(1); !errors.Is(err, ErrInvalidUsage) {
		t.Fatalf("Grow on an in-process communicator: %v", err)
	}
}

// TestShrinkGrowCycles kills a rank of 3, shrinks, grows back with a new
// process and allreduces, many times in this process: goroutines,
// descriptors and memory files come back to where they were after the
// warm-up.
func TestShrinkGrowCycles(t *testing.T) {
	cycles := 100
	if testing.Short() {
		cycles = 30
	}
	for _, transport := range []string{"tcp", "auto"} {
		t.Run(transport, func(t *testing.T) {
			opts := Options{Transport: transport, Timeout: time.Minute}
			if transport == "auto" {
				cycles = min(cycles, multiCycles()) // shared-memory setup is the slow part
			}
			cycle := func(i int) {
				id, err := NewUniqueID(opts)
				if err != nil {
					t.Fatal(err)
				}
				comms := make([]*Comm, 3)
				for r, err := range runIndexed(3, func(r int) error {
					var err error
					comms[r], err = NewComm(id, 3, r, opts)
					return err
				}) {
					if err != nil {
						t.Fatalf("cycle %d: rank %d: %v", i, r, err)
					}
				}
				defer destroyLive(comms)
				crash(comms[i%3])
				live := slices.Clone(comms)
				live[i%3] = nil
				kids, errs := shrinkAll(live, nil)
				defer destroyLive(kids)
				var members []*Comm
				for r, err := range errs {
					if r == i%3 {
						continue
					}
					if err != nil {
						t.Fatalf("cycle %d: rank %d: %v", i, r, err)
					}
					members = append(members, kids[r])
				}
				_, secret, _ := id.Parse()
				grown, err := growBy1(t, members, secret, opts)
				if err != nil {
					t.Fatalf("cycle %d: %v", i, err)
				}
				defer destroyLive(grown)
				checkSum(t, grown)
			}
			cycled(t, cycles, cycle)
		})
	}
}

// TestShrinkMajority: under the majority quorum (the default), a
// partition of 5 ranks into 3 and 2 (messages lost silently) leaves the 3
// to shrink and the 2 with ErrNoQuorum; ranks that are killed are dead,
// not counted, so 2 survivors of 3 kills still shrink; under "live" both
// sides of the partition go on alone.
func TestShrinkMajority(t *testing.T) {
	opts := Options{Timeout: time.Second}
	side := func(r int) bool { return r == 1 || r == 3 }
	partition := func(comms []*Comm) {
		comms[0].split.(*localSplitter).ctl.SetCut(func(a, b int) bool { return side(a) != side(b) })
	}
	comms := newLocal(t, 5, opts)
	partition(comms)
	kids, errs := shrinkAll(comms, nil)
	defer destroyLive(kids)
	for r := range comms {
		switch {
		case side(r) && !errors.Is(errs[r], ErrNoQuorum):
			t.Fatalf("rank %d (the side of 2): %v, want ErrNoQuorum", r, errs[r])
		case !side(r) && (errs[r] != nil || kids[r].Size() != 3):
			t.Fatalf("rank %d (the side of 3): %v", r, errs[r])
		}
	}
	checkSum(t, []*Comm{kids[0], kids[2], kids[4]})

	comms = newLocal(t, 5, opts)
	for _, r := range []int{0, 2, 4} {
		crash(comms[r])
	}
	kids, errs = shrinkAll([]*Comm{nil, comms[1], nil, comms[3], nil}, nil)
	defer destroyLive(kids)
	for _, r := range []int{1, 3} {
		if errs[r] != nil || kids[r].Size() != 2 {
			t.Fatalf("rank %d, 3 of 5 killed: %v", r, errs[r])
		}
	}
	checkSum(t, []*Comm{kids[1], kids[3]})

	live := opts
	live.ShrinkQuorum = "live"
	comms = newLocal(t, 5, live)
	partition(comms)
	kids, errs = shrinkAll(comms, nil)
	defer destroyLive(kids)
	for r := range comms {
		if want := map[bool]int{true: 2, false: 3}[side(r)]; errs[r] != nil || kids[r].Size() != want {
			t.Fatalf("live quorum, rank %d: %v, want a communicator of %d", r, errs[r], want)
		}
	}

	bad := newLocal(t, 1, Options{ShrinkQuorum: "most"})
	if _, err := bad[0].Shrink(nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("quorum \"most\": %v", err)
	}
}

// TestGrowPrunesDeadJoiner: a process that asked to join and went away
// while it waited (a replacement killed) is neither counted by Joiners
// nor admitted: the next Grow takes the live joiner behind it. Before, it
// was admitted and failed the Grow.
func TestGrowPrunesDeadJoiner(t *testing.T) {
	opts := Options{Transport: "tcp", Timeout: 5 * time.Second}
	comms := newJoined(t, 2, opts)
	dead := askToJoin(t, comms[0])
	waitFor(t, func() bool { return comms[0].Joiners() == 1 })
	dead.Close()
	waitFor(t, func() bool { return comms[0].Joiners() == 0 })
	grown, err := growBy1(t, comms, secretOf(comms[0]), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer destroyLive(grown)
	checkSum(t, grown)
}

// TestJoinRefusedPastBound: rank 0 keeps at most MaxJoiners processes
// waiting to join; the next one's Join fails at once with an ErrTimeout
// naming the bound, rather than waiting out its timeout (before, it was
// queued without bound, with a descriptor each).
func TestJoinRefusedPastBound(t *testing.T) {
	opts := Options{Transport: "tcp", Timeout: 5 * time.Second}
	comms := newJoined(t, 2, opts)
	most := recovery.MaxJoiners(2)
	for range most {
		defer askToJoin(t, comms[0]).Close()
	}
	waitFor(t, func() bool { return comms[0].Joiners() == most })
	info, err := comms[0].JoinInfo()
	if err != nil {
		t.Fatal(err)
	}
	_, err = Join(info, secretOf(comms[0]), Options{Transport: "tcp", Timeout: time.Minute})
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), fmt.Sprintf("at most %d may wait", most)) {
		t.Fatalf("join past the bound: %v, want ErrTimeout naming the bound", err)
	}
}

// askToJoin connects to c's join port and proves the secret, as a
// process calling Join does, then waits there: c's rank 0 counts it a
// joiner until the connection closes.
func askToJoin(t *testing.T, c *Comm) net.Conn {
	t.Helper()
	info, err := c.JoinInfo()
	if err != nil {
		t.Fatal(err)
	}
	tag, addr, err := parseJoinInfo(info)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tcp.ClientHandshake(conn, secretOf(c), recovery.GrowTag(tag), -1, time.Now().Add(5*time.Second)); err != nil {
		conn.Close()
		t.Fatal(err)
	}
	return conn
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatal("condition not met within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestShrinkDeathWhileConnecting: a member dies (its control links close)
// after the agreement and the exchange of the shrunk communicator's
// addresses, while the others connect to it. Its control links' loss must
// end their setup (recovery.WhileUp) so they agree again without it, well
// within the shrink's bound; a setup that waited on the dead member's
// address until the shrink's own deadline would leave every survivor with
// a timeout and no communicator (issue 40's third scenario).
func TestShrinkDeathWhileConnecting(t *testing.T) {
	const timeout = time.Second
	opts := Options{Transport: "tcp", Timeout: timeout}
	comms := newJoined(t, 5, opts)
	defer destroyLive(comms)
	crash(comms[1])
	const victim = 3
	release := make(chan struct{})
	var once sync.Once
	vopts := opts
	vopts.hooks = &testHooks{beforeTCP: func() {
		once.Do(func() {
			comms[victim].ctl.Crash()
			<-release
		})
	}}
	kids := make([]*Comm, 5)
	errs := make([]error, 5)
	took := make([]time.Duration, 5)
	var wg, victimDone sync.WaitGroup
	for r, c := range comms {
		if r == 1 {
			continue
		}
		w := &wg
		o := opts
		if r == victim {
			w, o = &victimDone, vopts
		}
		w.Go(func() {
			began := time.Now()
			kids[r], errs[r] = c.ShrinkWith(nil, o)
			took[r] = time.Since(began)
		})
	}
	wg.Wait()
	close(release)
	victimDone.Wait()
	defer destroyLive(kids)
	t.Logf("shrink took %v (the victim: %v, %v)", took, errs[victim], took[victim])
	var got []*Comm
	for _, r := range []int{0, 2, 4} {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		if bound := recovery.Bound(timeout); took[r] > bound/2 {
			t.Errorf("rank %d: shrink took %v, more than half its bound (%v)", r, took[r], bound)
		}
		got = append(got, kids[r])
	}
	checkSum(t, got)
}

// TestShrinkTwice: a communicator that was shrunk already refuses a second
// Shrink: the others are done with it, so an agreement now would be the
// caller's alone and give it a communicator of its own (issue 40's sixth
// scenario).
func TestShrinkTwice(t *testing.T) {
	opts := Options{Transport: "tcp", Timeout: 2 * time.Second}
	comms := newJoined(t, 3, opts)
	defer destroyLive(comms)
	crash(comms[2])
	kids, errs := shrinkAll(comms[:2], nil)
	defer destroyLive(kids)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	again, err := comms[0].Shrink(nil)
	if err == nil {
		again.Destroy()
		t.Fatalf("second shrink gave a communicator of %d", again.Size())
	}
	if !errors.Is(err, ErrInvalidUsage) {
		t.Fatalf("second shrink: %v, want ErrInvalidUsage", err)
	}
}
