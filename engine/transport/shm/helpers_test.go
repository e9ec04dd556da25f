//go:build linux

package shm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/internal/shmtest"
	"github.com/gocoll/gocoll/engine/transport"
)

// Test rings are small so that wrap-around and streaming happen often.
const testRing = MinRingBytes

func newTag(tb testing.TB) [8]byte {
	var tag [8]byte
	if _, err := rand.Read(tag[:]); err != nil {
		tb.Fatal(err)
	}
	return tag
}

func allRanks(n int) []int {
	r := make([]int, n)
	for i := range r {
		r[i] = i
	}
	return r
}

// segPrefix starts the name of every segment of communicator tag.
func segPrefix(tag [8]byte) string { return "gocoll-" + hex.EncodeToString(tag[:]) + "-" }

// checkNoLeftovers: no segment of communicator tag is named in /dev/shm
// or still open in this process (the transports still open map theirs).
func checkNoLeftovers(tb testing.TB, tag [8]byte) {
	tb.Helper()
	if m := append(shmtest.Files(segPrefix(tag)), shmtest.Fds(segPrefix(tag))...); len(m) != 0 {
		tb.Errorf("segments left behind: %v", m)
	}
}

// newGroup makes n in-process ranks of one communicator, connected and
// released; they are closed at cleanup.
func newGroup(tb testing.TB, n, ring int) ([]*Transport, [8]byte) {
	tb.Helper()
	tag := newTag(tb)
	// Runs after the Closes below: nothing of the group is left at all.
	tb.Cleanup(func() {
		if m := shmtest.Leftovers(segPrefix(tag)); len(m) != 0 {
			tb.Errorf("segments left after Close: %v", m)
		}
	})
	ts := make([]*Transport, n)
	for i := range ts {
		tr, err := Create(Config{Rank: i, Size: n, Peers: allRanks(n), Tag: tag, RingBytes: ring})
		if err != nil {
			tb.Fatal(err)
		}
		ts[i] = tr
		tb.Cleanup(func() { tr.Close() })
	}
	for i, tr := range ts {
		peers := map[int]PeerInfo{}
		for j, o := range ts {
			if j != i {
				peers[j] = o.Ref()
			}
		}
		if err := tr.Connect(context.Background(), peers); err != nil {
			tb.Fatal(err)
		}
	}
	for _, tr := range ts {
		tr.Release()
	}
	if fds := shmtest.Fds(segPrefix(tag)); len(fds) != 0 {
		tb.Fatalf("descriptors open after Release: %v", fds)
	}
	return ts, tag
}

// fill writes the content of message k from src to dst.
func fill(b []byte, src, dst, k int) {
	x := uint32(src*1000003 + dst*10007 + k*101 + 1)
	for i := range b {
		x = x*1664525 + 1013904223
		b[i] = byte(x >> 24)
	}
}

func meshSizes(ring int) []int { return []int{0, 1, ring - 1, 3 * ring, 8, ring, ring + 1, 0, 1000} }

func hdr(src, dst, k, n int) transport.Header {
	return transport.Header{Kind: transport.KindData, Seq: uint64(k), Sig: uint64(n)*7 + 3, Step: uint32(src<<16 | dst), Len: uint64(n)}
}

// runMesh sends every size reps times to every peer while receiving the same
// from every peer, all pairs and directions at once, and checks contents.
func runMesh(ctx context.Context, tr *Transport, ring, reps int) error {
	sizes := meshSizes(ring)
	var wg sync.WaitGroup
	errs := make(chan error, 2*tr.Size())
	for peer := 0; peer < tr.Size(); peer++ {
		if peer == tr.Rank() {
			continue
		}
		wg.Add(2)
		go func() {
			defer wg.Done()
			k := 0
			for r := 0; r < reps; r++ {
				for _, n := range sizes {
					b := make([]byte, n)
					fill(b, tr.Rank(), peer, k)
					if err := tr.Send(ctx, peer, hdr(tr.Rank(), peer, k, n), b); err != nil {
						errs <- fmt.Errorf("rank %d send #%d (%d B) to %d: %w", tr.Rank(), k, n, peer, err)
						return
					}
					k++
				}
			}
		}()
		go func() {
			defer wg.Done()
			k := 0
			for r := 0; r < reps; r++ {
				for _, n := range sizes {
					b := make([]byte, n)
					want := make([]byte, n)
					fill(want, peer, tr.Rank(), k)
					if err := tr.Recv(ctx, peer, hdr(peer, tr.Rank(), k, n), b); err != nil {
						errs <- fmt.Errorf("rank %d recv #%d (%d B) from %d: %w", tr.Rank(), k, n, peer, err)
						return
					}
					if !bytes.Equal(b, want) {
						errs <- fmt.Errorf("rank %d recv #%d (%d B) from %d: wrong content", tr.Rank(), k, n, peer)
						return
					}
					k++
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// ---- child processes ----
//
// A child re-executes the test binary running only TestChild, which reads its
// role from the environment. Lines between parent and child:
//
//	child:  @@READY <pid> <fd> <dev> <ino>
//	parent: PEER <rank> <pid> <fd> <dev> <ino> ... CONNECT
//	child:  @@CONNECTED
//	parent: GO                      (everyone connected; the child releases)
//	child:  role-specific @@ lines

const envRole = "GOCOLL_SHM_TEST_ROLE"

type child struct {
	rank  int
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	ref   PeerInfo
	mu    sync.Mutex
	log   bytes.Buffer // everything the child printed, for failures
}

func startChild(tb testing.TB, role string, rank, size int, tag [8]byte, ring int, extra ...string) *child {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestChild$", "-test.count=1")
	cmd.Env = append(os.Environ(),
		envRole+"="+role,
		"GOCOLL_SHM_TEST_RANK="+strconv.Itoa(rank),
		"GOCOLL_SHM_TEST_SIZE="+strconv.Itoa(size),
		"GOCOLL_SHM_TEST_TAG="+hex.EncodeToString(tag[:]),
		"GOCOLL_SHM_TEST_RING="+strconv.Itoa(ring),
	)
	cmd.Env = append(cmd.Env, extra...)
	c := &child{rank: rank, cmd: cmd, lines: make(chan string, 16)}
	var err error
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		tb.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stderr = &lockedWriter{c}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		c.stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			c.mu.Lock()
			c.log.WriteString(line + "\n")
			c.mu.Unlock()
			if s, ok := strings.CutPrefix(line, "@@"); ok {
				c.lines <- s
			}
		}
		close(c.lines)
	}()
	line := c.expect(tb, "READY")
	if _, err := fmt.Sscanf(line, "%d %d %d %d", &c.ref.Pid, &c.ref.Fd, &c.ref.Dev, &c.ref.Ino); err != nil {
		tb.Fatalf("child %d: bad READY line %q: %v", rank, line, err)
	}
	return c
}

type lockedWriter struct{ c *child }

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.c.mu.Lock()
	defer w.c.mu.Unlock()
	return w.c.log.Write(b)
}

func (c *child) output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.log.String()
}

// expect waits for the child's next @@ line, which must start with word,
// and returns the rest.
func (c *child) expect(tb testing.TB, word string) string {
	tb.Helper()
	select {
	case line, ok := <-c.lines:
		if !ok {
			tb.Fatalf("child %d exited while the parent expected %s; output:\n%s", c.rank, word, c.output())
		}
		rest, ok := strings.CutPrefix(line, word)
		if !ok {
			tb.Fatalf("child %d said %q, expected %s; output:\n%s", c.rank, line, word, c.output())
		}
		return strings.TrimSpace(rest)
	case <-time.After(60 * time.Second):
		tb.Fatalf("child %d: timeout waiting for %s; output:\n%s", c.rank, word, c.output())
	}
	return ""
}

// sayPeer tells the child where rank's segment is.
func (c *child) sayPeer(tb testing.TB, rank int, ref PeerInfo) {
	tb.Helper()
	c.say(tb, "PEER %d %d %d %d %d", rank, ref.Pid, ref.Fd, ref.Dev, ref.Ino)
}

func (c *child) say(tb testing.TB, format string, a ...any) {
	tb.Helper()
	if _, err := fmt.Fprintf(c.stdin, format+"\n", a...); err != nil {
		tb.Fatalf("child %d: %v", c.rank, err)
	}
}

// connectChildren tells every child about every other endpoint (children,
// plus the parent's own transports in local), waits until all connected and
// then connects the local transports.
func connectChildren(tb testing.TB, children []*child, local []*Transport) {
	tb.Helper()
	for _, c := range children {
		for _, o := range children {
			if o != c {
				c.sayPeer(tb, o.rank, o.ref)
			}
		}
		for _, l := range local {
			c.sayPeer(tb, l.Rank(), l.Ref())
		}
		c.say(tb, "CONNECT")
	}
	for _, l := range local {
		peers := map[int]PeerInfo{}
		for _, c := range children {
			peers[c.rank] = c.ref
		}
		for _, o := range local {
			if o != l {
				peers[o.Rank()] = o.Ref()
			}
		}
		if err := l.Connect(context.Background(), peers); err != nil {
			tb.Fatal(err)
		}
	}
	for _, c := range children {
		c.expect(tb, "CONNECTED")
	}
	for _, l := range local {
		l.Release()
	}
	for _, c := range children {
		c.say(tb, "GO")
	}
}

// childSetup is the child side of the handshake.
func childSetup(t *testing.T, in *bufio.Scanner) *Transport {
	atoi := func(k string) int {
		v, err := strconv.Atoi(os.Getenv(k))
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		return v
	}
	rank, size, ring := atoi("GOCOLL_SHM_TEST_RANK"), atoi("GOCOLL_SHM_TEST_SIZE"), atoi("GOCOLL_SHM_TEST_RING")
	var tag [8]byte
	if _, err := hex.Decode(tag[:], []byte(os.Getenv("GOCOLL_SHM_TEST_TAG"))); err != nil {
		t.Fatal(err)
	}
	tr, err := Create(Config{Rank: rank, Size: size, Peers: allRanks(size), Tag: tag, RingBytes: ring})
	if err != nil {
		t.Fatal(err)
	}
	ref := tr.Ref()
	fmt.Printf("@@READY %d %d %d %d\n", ref.Pid, ref.Fd, ref.Dev, ref.Ino)
	peers := map[int]PeerInfo{}
	for in.Scan() {
		if in.Text() == "CONNECT" {
			break
		}
		var r int
		var p PeerInfo
		if _, err := fmt.Sscanf(in.Text(), "PEER %d %d %d %d %d", &r, &p.Pid, &p.Fd, &p.Dev, &p.Ino); err != nil {
			t.Fatalf("bad line %q: %v", in.Text(), err)
		}
		peers[r] = p
	}
	if err := tr.Connect(context.Background(), peers); err != nil {
		t.Fatal(err)
	}
	fmt.Println("@@CONNECTED")
	if !in.Scan() || in.Text() != "GO" {
		t.Fatalf("expected GO, got %q", in.Text())
	}
	tr.Release()
	return tr
}
