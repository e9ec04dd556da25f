//go:build linux

package shmcoll

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/kernel"
	"github.com/gocoll/gocoll/engine/transport"
)

// Ranks in separate processes: the test binary re-executes itself with
// -test.run=^TestChild$ and these variables.
const (
	envRole = "GOCOLL_SHMCOLL_TEST_ROLE"
	envRank = "GOCOLL_SHMCOLL_TEST_RANK"
	envSize = "GOCOLL_SHMCOLL_TEST_SIZE"
	envDir  = "GOCOLL_SHMCOLL_TEST_DIR"
	envTag  = "GOCOLL_SHMCOLL_TEST_TAG"
	envSlot = "GOCOLL_SHMCOLL_TEST_SLOT"
	envArg  = "GOCOLL_SHMCOLL_TEST_ARG"
)

// TestChild is the body of the child processes the other tests start; run
// directly it does nothing.
func TestChild(t *testing.T) {
	role := os.Getenv(envRole)
	if role == "" {
		t.Skip("only run as a child process")
	}
	rank, _ := strconv.Atoi(os.Getenv(envRank))
	size, _ := strconv.Atoi(os.Getenv(envSize))
	slot, _ := strconv.Atoi(os.Getenv(envSlot))
	var tag [8]byte
	hex.Decode(tag[:], []byte(os.Getenv(envTag)))
	a, err := childSetup(rank, size, slot, tag, os.Getenv(envDir))
	if err != nil {
		fmt.Printf("@@ERR setup: %v\n", err)
		return
	}
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	switch role {
	case "matrix":
		cases := matrix(size, a.SlotBytes(), testTypes, kernel.AllRedOps())
		hashes := make([]uint64, len(cases))
		if err := runMatrix(ctx, a, cases, hashes); err != nil {
			fmt.Printf("@@ERR %v\n", err)
			return
		}
		// Across processes too, cross-memory reads are on wherever the
		// kernel allows them, and used (2 ranks: the test slot's pieces
		// exceed the 8 KiB threshold).
		if a.cma != canCMA() || (a.cma && size == 2 && a.cmaReads == 0) {
			fmt.Printf("@@ERR cross-memory reads %v after %d copies; process_vm_readv works: %v\n", a.cma, a.cmaReads, canCMA())
			return
		}
		var b strings.Builder
		for _, h := range hashes {
			fmt.Fprintf(&b, "%x,", h)
		}
		fmt.Printf("@@HASHES %s\n", b.String())
		fmt.Println("@@OK")
	case "bcast-exit": // rank 0 broadcasts and exits at once; the others come later
		if rank == 0 {
			if err := bcast(ctx, a, 1, 4096, 0); err != nil {
				report(err)
				return
			}
			fmt.Println("@@OK")
			os.Exit(0) // no Close: the process is simply gone
		}
		fmt.Println("@@READY")
		in := bufio.NewScanner(os.Stdin)
		in.Scan() // the parent saw rank 0 exit
		if err := bcast(ctx, a, 1, 4096, 0); err != nil {
			report(err)
			return
		}
		fmt.Println("@@OK")
		report(a.Barrier(ctx, Call{Seq: 2}))
	case "sleep": // wait to be killed
		fmt.Println("@@READY")
		time.Sleep(time.Minute)
	case "alloc": // allocations only small calls touched, then wait to be killed
		for _, n := range []int{4096, 1 << 20} {
			m, err := a.Alloc(n)
			if err != nil {
				report(err)
				return
			}
			// Below the in-place threshold: the peers never map it.
			if err := a.AllReduce(ctx, Call{Seq: uint64(n)}, m[:64], m[:64], kernel.Int8, kernel.Sum); err != nil {
				report(err)
				return
			}
		}
		fmt.Println("@@READY")
		time.Sleep(time.Minute)
	case "wait": // an allreduce that a peer never joins
		fmt.Println("@@READY")
		report(allReduce(ctx, a, 1, 1<<20))
	case "mismatch": // rank 2 passes another signature
		b := make([]byte, 256)
		report(a.AllReduce(ctx, Call{Seq: 1, Sig: 42 + uint64(rank/2)}, b, b, kernel.Int8, kernel.Sum))
	case "abort": // abort with the reason read from stdin
		fmt.Println("@@READY")
		in := bufio.NewScanner(os.Stdin)
		if in.Scan() {
			a.Abort(errors.New(in.Text()))
			fmt.Println("@@ABORTED")
		}
		io.Copy(io.Discard, os.Stdin) // until the parent is done
	case "bench": // "iters bytes" → AllReduce float32 sum that often; rank 0 prints the time
		var iters, bytes int
		fmt.Sscanf(os.Getenv(envArg), "%d %d", &iters, &bytes)
		send, recv := make([]byte, bytes), make([]byte, bytes)
		for i := range send {
			send[i] = byte(i)
		}
		times := make([]time.Duration, iters)
		var start, last time.Time
		for i := -3; i < iters; i++ {
			if i == 0 {
				if err := a.Barrier(ctx, Call{Seq: 1 << 40}); err != nil {
					report(err)
					return
				}
				start = time.Now()
				last = start
			}
			if err := a.AllReduce(ctx, Call{Seq: uint64(i + 10), Sig: 1}, send, recv, kernel.Float32, kernel.Sum); err != nil {
				report(err)
				return
			}
			if i >= 0 {
				now := time.Now()
				times[i], last = now.Sub(last), now
			}
		}
		slices.Sort(times)
		fmt.Printf("@@TIME %d %d %d\n", time.Since(start).Nanoseconds(), times[len(times)/2], times[(len(times)-1)*99/100])
	default:
		fmt.Printf("@@ERR unknown role %q\n", role)
	}
}

// childSetup creates this rank's arena, publishes where peers find its
// segment in dir, waits for the others', connects, synchronises once and
// releases the segment's descriptor.
func childSetup(rank, size, slot int, tag [8]byte, dir string) (*Arena, error) {
	a, err := Create(Config{Rank: rank, Size: size, Tag: tag, SlotBytes: slot})
	if err != nil {
		return nil, err
	}
	tmp := filepath.Join(dir, fmt.Sprintf("tmp-%d", rank))
	ref := a.Ref()
	if err := os.WriteFile(tmp, fmt.Appendf(nil, "%d %d %d %d", ref.Pid, ref.Fd, ref.Dev, ref.Ino), 0o600); err != nil {
		a.Close()
		return nil, err
	}
	os.Rename(tmp, filepath.Join(dir, fmt.Sprintf("rank-%d", rank)))
	peers := map[int]PeerInfo{}
	deadline := time.Now().Add(30 * time.Second)
	for r := 0; r < size; {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank-%d", r)))
		if err != nil {
			if time.Now().After(deadline) {
				a.Close()
				return nil, fmt.Errorf("rank %d never showed up", r)
			}
			time.Sleep(time.Millisecond)
			continue
		}
		var info PeerInfo
		fmt.Sscanf(string(b), "%d %d %d %d", &info.Pid, &info.Fd, &info.Dev, &info.Ino)
		peers[r] = info
		r++
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.Connect(ctx, peers); err != nil {
		a.Close()
		return nil, err
	}
	if err := a.Barrier(ctx, Call{Seq: 0}); err != nil {
		a.Close()
		return nil, err
	}
	a.Release()
	return a, nil
}

// report prints how err classifies, for the parent to check.
func report(err error) {
	if err == nil {
		fmt.Println("@@OK")
		return
	}
	peer := -1
	var ple *transport.PeerLostError
	var rae *transport.RemoteAbortError
	if errors.As(err, &ple) {
		peer = ple.Peer
	} else if errors.As(err, &rae) {
		peer = rae.Peer
	}
	fmt.Printf("@@ERR lost=%v remote=%v mismatch=%v deadline=%v peer=%d: %v\n",
		errors.Is(err, transport.ErrPeerLost), errors.Is(err, transport.ErrRemoteAbort),
		errors.Is(err, transport.ErrMismatch), errors.Is(err, context.DeadlineExceeded), peer, err)
}

type child struct {
	rank  int
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

// startRanks starts n child processes, rank r with roles[r].
func startRanks(t testing.TB, n, slot int, roles []string, arg string) []*child {
	t.Helper()
	dir := t.TempDir()
	tag := newTag()
	t.Cleanup(func() { checkNoFiles(t, tag) })
	kids := make([]*child, n)
	for r := range n {
		cmd := exec.Command(os.Args[0], "-test.run=^TestChild$", "-test.v")
		cmd.Env = append(os.Environ(),
			envRole+"="+roles[r], envRank+"="+strconv.Itoa(r), envSize+"="+strconv.Itoa(n),
			envDir+"="+dir, envTag+"="+hex.EncodeToString(tag[:]), envSlot+"="+strconv.Itoa(slot), envArg+"="+arg)
		cmd.Stderr = os.Stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		c := &child{rank: r, cmd: cmd, stdin: stdin, lines: make(chan string, 16)}
		go func() {
			sc := bufio.NewScanner(stdout)
			sc.Buffer(nil, 16<<20)
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), "@@") {
					c.lines <- sc.Text()
				}
			}
			close(c.lines)
		}()
		kids[r] = c
	}
	t.Cleanup(func() {
		for _, c := range kids {
			c.stdin.Close()
			c.cmd.Process.Kill()
			c.cmd.Wait()
		}
	})
	return kids
}

// next returns the child's next "@@" line, failing the test after timeout.
func (c *child) next(t testing.TB, timeout time.Duration) string {
	t.Helper()
	select {
	case l, ok := <-c.lines:
		if !ok {
			t.Fatalf("rank %d exited without a word", c.rank)
		}
		return l
	case <-time.After(timeout):
		t.Fatalf("rank %d said nothing for %v", c.rank, timeout)
	}
	return ""
}

func roles(n int, role string) []string {
	r := make([]string, n)
	for i := range r {
		r[i] = role
	}
	return r
}

// TestProcesses runs the conformance matrix with every rank in its own
// process; results every rank receives must hash alike everywhere.
func TestProcesses(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			if testing.Short() && n > 2 {
				t.Skip("short")
			}
			kids := startRanks(t, n, testSlot, roles(n, "matrix"), "")
			hashes := make([][]string, n)
			for r, c := range kids {
				l := c.next(t, 5*time.Minute)
				if !strings.HasPrefix(l, "@@HASHES ") {
					t.Fatalf("rank %d: %s", r, l)
				}
				hashes[r] = strings.Split(strings.TrimPrefix(l, "@@HASHES "), ",")
				if l := c.next(t, time.Minute); l != "@@OK" {
					t.Fatalf("rank %d: %s", r, l)
				}
			}
			cases := matrix(n, testSlot, testTypes, kernel.AllRedOps())
			for i, c := range cases {
				if c.kind == "allreduce" || c.kind == "broadcast" || c.kind == "allgather" {
					for r := 1; r < n; r++ {
						if hashes[r][i] != hashes[0][i] {
							t.Errorf("%v: rank %d received other bytes than rank 0", c, r)
						}
					}
				}
			}
		})
	}
}

// TestProcessBroadcastRootExits: a broadcast's root returns without waiting
// for the others (barrierFrom); when its process exits right after, the
// others still get the data out of its segment, and their next call
// reports it lost.
func TestProcessBroadcastRootExits(t *testing.T) {
	kids := startRanks(t, 3, testSlot, roles(3, "bcast-exit"), "")
	for _, c := range kids[1:] {
		if l := c.next(t, time.Minute); l != "@@READY" {
			t.Fatalf("rank %d: %s", c.rank, l)
		}
	}
	if l := kids[0].next(t, time.Minute); l != "@@OK" {
		t.Fatalf("root: %s", l)
	}
	kids[0].cmd.Wait()
	for _, c := range kids[1:] {
		fmt.Fprintln(c.stdin, "go")
	}
	for _, c := range kids[1:] {
		if l := c.next(t, time.Minute); l != "@@OK" {
			t.Fatalf("rank %d: broadcast: %s", c.rank, l)
		}
		if l := c.next(t, time.Minute); !strings.HasPrefix(l, "@@ERR lost=true") || !strings.Contains(l, "peer=0") {
			t.Errorf("rank %d: barrier after the root left: %s", c.rank, l)
		}
	}
}

// TestProcessKilled: the peers of a SIGKILLed rank fail with ErrPeerLost
// naming it within about a second.
func TestProcessKilled(t *testing.T) {
	kids := startRanks(t, 3, testSlot, []string{"wait", "wait", "sleep"}, "")
	for _, c := range kids {
		if l := c.next(t, time.Minute); l != "@@READY" {
			t.Fatalf("rank %d: %s", c.rank, l)
		}
	}
	time.Sleep(200 * time.Millisecond) // the waiters go to sleep on the futex
	start := time.Now()
	kids[2].cmd.Process.Signal(syscall.SIGKILL)
	for _, c := range kids[:2] {
		l := c.next(t, 10*time.Second)
		d := time.Since(start)
		if !strings.HasPrefix(l, "@@ERR lost=true") || !strings.Contains(l, "peer=2") {
			t.Errorf("rank %d: %s", c.rank, l)
		}
		if d > 2*time.Second {
			t.Errorf("rank %d noticed after %v", c.rank, d)
		}
		t.Logf("rank %d after %v: %s", c.rank, d, l)
	}
}

// Ranks killed while holding allocations leave nothing in /dev/shm (the
// cleanup's checkNoFiles): named files stayed there for good when only
// small calls had used them.
func TestProcessKilledLeavesNoFiles(t *testing.T) {
	kids := startRanks(t, 3, testSlot, roles(3, "alloc"), "")
	for _, c := range kids {
		if l := c.next(t, time.Minute); l != "@@READY" {
			t.Fatalf("rank %d: %s", c.rank, l)
		}
	}
	for _, c := range kids {
		c.cmd.Process.Signal(syscall.SIGKILL)
		c.cmd.Wait()
	}
}

func TestProcessAbort(t *testing.T) {
	kids := startRanks(t, 3, testSlot, []string{"wait", "wait", "abort"}, "")
	for _, c := range kids {
		if l := c.next(t, time.Minute); l != "@@READY" {
			t.Fatalf("rank %d: %s", c.rank, l)
		}
	}
	fmt.Fprintln(kids[2].stdin, "out of memory on rank two")
	if l := kids[2].next(t, 10*time.Second); l != "@@ABORTED" {
		t.Fatal(l)
	}
	for _, c := range kids[:2] {
		l := c.next(t, 10*time.Second)
		if !strings.HasPrefix(l, "@@ERR lost=false remote=true") || !strings.Contains(l, "peer=2") || !strings.Contains(l, "out of memory on rank two") {
			t.Errorf("rank %d: %s", c.rank, l)
		}
	}
}

func TestProcessMismatch(t *testing.T) {
	kids := startRanks(t, 3, testSlot, roles(3, "mismatch"), "")
	for _, c := range kids {
		if l := c.next(t, time.Minute); !strings.Contains(l, "mismatch=true") {
			t.Errorf("rank %d: %s", c.rank, l)
		}
	}
}
