//go:build linux

package shmsync

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// pair is a counter and its waiter count on separate cache lines, as a
// shared segment would lay them out.
type pair struct {
	word    atomic.Uint64
	_       [120]byte
	waiters atomic.Uint64
}

var policies = map[string]Policy{
	"sleep-at-once":   {},
	"oversubscribed":  PolicyFor(runtime.NumCPU() + 1),
	"undersubscribed": PolicyFor(1),
	"locked-caller":   lockedPolicy(PolicyFor(1)), // sched_yield without Gosched
}

func lockedPolicy(p Policy) Policy {
	p.Goroutines = false
	return p
}

func TestWithLocked(t *testing.T) {
	ctx := context.Background()
	if IsLocked(ctx) || !IsLocked(WithLocked(ctx)) {
		t.Fatal("IsLocked does not see WithLocked")
	}
	c, cancel := context.WithCancel(WithLocked(ctx))
	defer cancel()
	if !IsLocked(c) {
		t.Fatal("the mark does not survive a derived context")
	}
}

func TestLow32(t *testing.T) {
	var w atomic.Uint64
	w.Store(0x1122334455667788)
	if got := *Low32(&w); got != 0x55667788 {
		t.Fatalf("Low32 = %#x", got)
	}
}

func TestPolicyFor(t *testing.T) {
	n := runtime.NumCPU()
	if p := PolicyFor(n); p.Polls < 64 || p.Yield < 50*time.Microsecond {
		t.Errorf("PolicyFor(%d) = %+v: want a longer polite spin when each rank has a core", n, p)
	}
	if p := PolicyFor(n + 1); p.Spin != 0 || p.Polls > 20 {
		t.Errorf("PolicyFor(%d) = %+v: want almost no polling when oversubscribed", n+1, p)
	}
}

// TestAwaitPublish: a waiter under each policy returns once the counter
// moves, whether it is still spinning or already asleep.
func TestAwaitPublish(t *testing.T) {
	for name, p := range policies {
		t.Run(name, func(t *testing.T) {
			p.Sleep = 5 * time.Second // only a wake ends a sleep in time
			for _, delay := range []time.Duration{0, time.Millisecond, 30 * time.Millisecond} {
				var c pair
				done := make(chan error, 1)
				go func() { done <- p.Await(context.Background(), &c.word, &c.waiters, 0, nil) }()
				time.Sleep(delay)
				start := time.Now()
				Publish(&c.word, &c.waiters, 1)
				select {
				case err := <-done:
					if err != nil {
						t.Fatal(err)
					}
				case <-time.After(2 * time.Second):
					t.Fatalf("delay %v: waiter not woken %v after Publish", delay, time.Since(start))
				}
				if c.waiters.Load() != 0 {
					t.Fatalf("waiters = %d after the wait", c.waiters.Load())
				}
			}
		})
	}
}

func TestAwaitDeadline(t *testing.T) {
	var c pair
	p := Policy{Sleep: time.Hour}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := p.Await(ctx, &c.word, &c.waiters, 0, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
	if d := time.Since(start); d < 50*time.Millisecond || d > time.Second {
		t.Fatalf("returned after %v, deadline was 50ms", d)
	}
}

func TestAwaitCancel(t *testing.T) {
	var c pair
	p := Policy{Sleep: 10 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	if err := p.Await(ctx, &c.word, &c.waiters, 0, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
}

func TestAwaitCheck(t *testing.T) {
	var c pair
	p := Policy{Sleep: time.Millisecond}
	calls := 0
	boom := errors.New("boom")
	err := p.Await(context.Background(), &c.word, &c.waiters, 0, func() error {
		calls++
		if calls == 3 {
			return boom
		}
		return nil
	})
	if err != boom || calls != 3 {
		t.Fatalf("err = %v after %d checks", err, calls)
	}
	// A moved counter wins over a failing check and a dead context.
	c.word.Store(7)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.Await(ctx, &c.word, &c.waiters, 0, func() error { return boom }); err != nil {
		t.Fatalf("moved counter: err = %v", err)
	}
}

func TestAwaitAllocs(t *testing.T) {
	var c pair
	p := Policy{Sleep: 100 * time.Microsecond}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	c.word.Store(1)
	n := 0
	if a := testing.AllocsPerRun(100, func() {
		// The check (run before the first sleep) moves the counter: this
		// walks the whole sleep path without sleeping long.
		n++
		_ = p.Await(ctx, &c.word, &c.waiters, 1, func() error { c.word.Store(uint64(n) + 1); return nil })
		c.word.Store(1)
	}); a != 0 {
		t.Fatalf("Await allocates %v times per call", a)
	}
	if a := testing.AllocsPerRun(100, func() { Publish(&c.word, &c.waiters, 2) }); a != 0 {
		t.Fatalf("Publish allocates %v times per call", a)
	}
}

// TestAwaitAcrossProcesses: a child process sleeps on a counter in a file
// both map; the parent's Publish must wake it (the process-shared futex).
func TestAwaitAcrossProcesses(t *testing.T) {
	f, err := os.CreateTemp("/dev/shm", "gocoll-shmsync-test-")
	if err != nil {
		t.Skip("no /dev/shm:", err)
	}
	path := f.Name()
	defer os.Remove(path)
	if err := f.Truncate(4096); err != nil {
		t.Fatal(err)
	}
	m, err := syscall.Mmap(int(f.Fd()), 0, 4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(m)
	c := (*pair)(unsafe.Pointer(&m[0]))
	cmd := exec.Command(os.Args[0], "-test.run=^TestChildWaiter$", "-test.v")
	cmd.Env = append(os.Environ(), "GOCOLL_SHMSYNC_CHILD="+path)
	out := make(chan []byte, 1)
	go func() { b, _ := cmd.CombinedOutput(); out <- b }()
	deadline := time.Now().Add(20 * time.Second)
	for c.waiters.Load() == 0 { // the child is asleep on the futex
		if time.Now().After(deadline) {
			t.Fatal("child never went to sleep")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(10 * time.Millisecond)
	Publish(&c.word, &c.waiters, 1)
	select {
	case b := <-out:
		if !contains(b, "@@WOKEN") {
			t.Fatalf("child output:\n%s", b)
		}
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Fatal("child not woken by Publish")
	}
}

func contains(b []byte, s string) bool {
	for i := 0; i+len(s) <= len(b); i++ {
		if string(b[i:i+len(s)]) == s {
			return true
		}
	}
	return false
}

// TestChildWaiter is the child of TestAwaitAcrossProcesses.
func TestChildWaiter(t *testing.T) {
	path := os.Getenv("GOCOLL_SHMSYNC_CHILD")
	if path == "" {
		t.Skip("only run as a child process")
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	m, err := syscall.Mmap(int(f.Fd()), 0, 4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	c := (*pair)(unsafe.Pointer(&m[0]))
	p := Policy{Sleep: time.Minute} // a missed wake would take a minute
	start := time.Now()
	if err := p.Await(context.Background(), &c.word, &c.waiters, 0, nil); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("@@WOKEN after %v\n", time.Since(start))
}

func TestProc(t *testing.T) {
	me := Self()
	if me.Pid != os.Getpid() || me.Start == 0 {
		t.Fatalf("Self() = %+v", me)
	}
	if !me.Alive() {
		t.Fatal("this process is not alive")
	}
	if p, ok := LookupProc(me.Pid); !ok || p != me {
		t.Fatalf("LookupProc(self) = %+v, %v", p, ok)
	}
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	if want, _ := strconv.ParseUint(f[19], 10, 64); want != me.Start {
		t.Fatalf("start time %d, /proc/self/stat says %d", me.Start, want)
	}
	if (Proc{Pid: me.Pid, Start: me.Start + 1}).Alive() {
		t.Fatal("a different start time (recycled pid) counts as alive")
	}
	if (Proc{}).Alive() {
		t.Fatal("pid 0 is alive")
	}
	// A zombie (exited, not reaped) and a reaped child are dead.
	cmd := exec.Command("/bin/true")
	if err := cmd.Start(); err != nil {
		t.Skip(err)
	}
	child, ok := LookupProc(cmd.Process.Pid)
	deadline := time.Now().Add(10 * time.Second)
	for child.Alive() {
		if time.Now().After(deadline) {
			t.Fatal("exited child still alive (zombie not detected)")
		}
		time.Sleep(time.Millisecond)
	}
	cmd.Wait()
	if ok && child.Alive() {
		t.Fatal("reaped child alive")
	}
	if a := testing.AllocsPerRun(20, func() { me.Alive() }); a != 0 {
		t.Fatalf("Alive allocates %v times", a)
	}
}

func TestParseStat(t *testing.T) {
	tail := " 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 12345 99 7\n" // fields 7..21 are 0, 22 is the start
	for _, tc := range []struct {
		in    string
		start uint64
		alive bool
	}{
		{"42 (go) S 1 2 3" + tail, 12345, true},
		{"42 (a) b (c) R 1 2 3" + tail, 12345, true},
		{"42 (x y) Z 1 2 3" + tail, 12345, false},
		{"42 (x) S 1", 0, false},
		{"garbage", 0, false},
	} {
		start, alive := parseStat([]byte(tc.in))
		if start != tc.start || alive != tc.alive {
			t.Errorf("parseStat(%q) = %d, %v; want %d, %v", tc.in, start, alive, tc.start, tc.alive)
		}
	}
	b := make([]byte, 0, 24)
	for _, v := range []uint64{0, 7, 12345, 1<<64 - 1} {
		b = b[:putUint(b[:cap(b)], v)]
		if string(b) != strconv.FormatUint(v, 10) {
			t.Errorf("putUint(%d) = %q", v, b)
		}
	}
}

// A probe file opens through /proc/<pid>/fd while its descriptor is open,
// and only as the file it names: not once closed (ENOENT, as for a process
// that exited), not when the descriptor number now holds another file.
func TestFileRef(t *testing.T) {
	ref, fd, err := NewProbe()
	if err != nil {
		t.Fatal(err)
	}
	if ref.Pid != os.Getpid() || ref.Fd != fd || ref.Ino == 0 {
		t.Fatalf("probe %+v, descriptor %d", ref, fd)
	}
	got, err := ref.Open(nil, syscall.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	syscall.Close(got)
	var opened []int
	spy := func(pid, fd, flags int) (int, error) { opened = append(opened, fd); return OpenProcFd(pid, fd, flags) }
	if got, err := ref.Open(spy, syscall.O_RDONLY); err != nil || len(opened) != 1 || opened[0] != ref.Fd {
		t.Fatalf("through an injected opener: %v, opened %v", err, opened)
	} else {
		syscall.Close(got)
	}
	syscall.Close(fd)
	if _, err := ref.Open(nil, syscall.O_RDONLY); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("closed: %v, want ENOENT", err)
	}
	other, ofd, err := NewProbe()
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(ofd)
	stale := other
	stale.Ino = ref.Ino // the number may even be the same: the file is not
	if _, err := stale.Open(nil, syscall.O_RDONLY); !errors.Is(err, ErrOtherFile) {
		t.Errorf("another file behind the descriptor: %v, want ErrOtherFile", err)
	}
}

func TestColocYielded(t *testing.T) {
	moved := 0
	c := Coloc{move: func() bool { moved++; return false }} // a thread that cannot move sleeps
	for i := 0; i < 10; i++ {
		c.yielded(time.Microsecond) // the peer arrived while nobody else ran
	}
	if c.sleep || c.streak != 0 {
		t.Fatalf("short yields: %+v", c)
	}
	for i := 1; i < colocStreak; i++ {
		c.yielded(colocYield)
	}
	c.yielded(0) // one short yield breaks the streak
	for i := 1; i < colocStreak; i++ {
		c.yielded(colocYield)
	}
	if c.sleep {
		t.Fatalf("%d long yields with a short one between: %+v", 2*(colocStreak-1), c)
	}
	c.yielded(10 * colocYield)
	if moved != 1 || !c.sleep || c.streak != 0 {
		t.Fatalf("%d long yields in a row: %d moves, sleep %v, streak %d; want a move tried and, "+
			"as it failed, the next wait to sleep", colocStreak, moved, c.sleep, c.streak)
	}
	c = Coloc{move: func() bool { moved++; return true }}
	for i := 0; i < colocStreak; i++ {
		c.yielded(colocYield)
	}
	if moved != 2 || c.sleep {
		t.Fatalf("after a move: %d moves, sleep %v; want no sleep", moved, c.sleep)
	}
}

// TestColocSkipsYield: a waiter that found itself sharing a core goes from
// polling straight to its sleep once, however long its yield phase, and
// only when the policy watches for it.
func TestColocSkipsYield(t *testing.T) {
	var w atomic.Uint64
	c := Coloc{sleep: true}
	p := Policy{Polls: 4, Yields: 1 << 30, Yield: time.Hour, Colocation: true, Coloc: &c}
	done := make(chan bool, 1)
	go func() { done <- p.Busy(&w, 0) }()
	select {
	case got := <-done:
		if got || c.sleep {
			t.Fatalf("Busy = %v, sleep = %v: want false (time to sleep) and the flag consumed", got, c.sleep)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Busy yielded instead of going to sleep")
	}
	c.sleep = true
	p = Policy{Polls: 4, Yields: 1, Yield: time.Microsecond, Coloc: &c} // not watching
	if p.Busy(&w, 0) || !c.sleep {
		t.Fatalf("a policy without Colocation used the record: %+v", c)
	}
}

// TestColocationOnOneCore: two threads forced onto one CPU wait on each
// other in turn. Every peer arrival then comes during a yield that ran the
// peer, and the waits must notice and sleep some of the time; without the
// watch, a yield phase of an hour would never end in a sleep.
func TestColocationOnOneCore(t *testing.T) {
	var allowed unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err != nil {
		t.Skipf("sched_getaffinity: %v", err)
	}
	cpu := 0
	for !allowed.IsSet(cpu) {
		cpu++
	}
	var a, b pair
	const rounds = 300
	sleeps := make(chan int, 2)
	var ready sync.WaitGroup
	ready.Add(2)
	run := func(mine, theirs *pair, first bool) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var one unix.CPUSet
		one.Set(cpu)
		if err := unix.SchedSetaffinity(0, &one); err != nil {
			t.Errorf("sched_setaffinity: %v", err)
		}
		defer unix.SchedSetaffinity(0, &allowed) // before the thread goes back to the pool
		ready.Done()
		ready.Wait()
		var c Coloc
		p := Policy{Polls: 16, Yields: 1 << 30, Yield: time.Hour, Colocation: true, Coloc: &c}
		n := 0 // waits whose Busy gave up (the caller would sleep)
		wait := func(old uint64) {
			if !p.Busy(&theirs.word, old) {
				n++
				for theirs.word.Load() == old {
					Yield()
				}
			}
		}
		for i := uint64(1); i <= rounds; i++ {
			if !first {
				wait(i - 1)
			}
			Publish(&mine.word, &mine.waiters, i)
			if first {
				wait(i - 1)
			}
		}
		sleeps <- n
	}
	go run(&a, &b, true)
	go run(&b, &a, false)
	total := 0
	for i := 0; i < 2; i++ {
		select {
		case n := <-sleeps:
			total += n
		case <-time.After(60 * time.Second):
			t.Fatal("ping-pong on one core did not finish")
		}
	}
	t.Logf("%d of %d waits went to sleep", total, 2*rounds)
	if total == 0 {
		t.Fatal("no wait noticed that it shared the core with its peer")
	}
}

// TestMoveOff: the thread lands on another CPU and keeps its affinity mask.
func TestMoveOff(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var before unix.CPUSet
	if err := unix.SchedGetaffinity(0, &before); err != nil {
		t.Skipf("sched_getaffinity: %v", err)
	}
	if before.Count() < 2 {
		t.Skipf("%d CPU allowed: nowhere to move", before.Count())
	}
	// The scheduler may itself move the thread between a read of its CPU
	// and moveOff's (under load it does, now and then), so that moveOff
	// moves it back where it was: one move out of a few tries is the test.
	moved := false
	for try := 0; try < 10 && !moved; try++ {
		from := currentCPU()
		if !moveOff() {
			t.Fatal("moveOff = false with several CPUs allowed")
		}
		moved = currentCPU() != from
	}
	if !moved {
		t.Fatalf("still on CPU %d after 10 moves", currentCPU())
	}
	var after unix.CPUSet
	if err := unix.SchedGetaffinity(0, &after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Fatalf("affinity %v after, %v before", after, before)
	}
	// A thread allowed one CPU stays.
	var one unix.CPUSet
	one.Set(currentCPU())
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatal(err)
	}
	defer unix.SchedSetaffinity(0, &before)
	if moveOff() {
		t.Fatal("moveOff moved a thread allowed only its CPU")
	}
}
