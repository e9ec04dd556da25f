package transporttest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/transport"
)

// A child rank is the test binary again: Main, called from the package's
// TestMain, sees these variables and runs the rank instead of the tests.
// Lines between parent and child (the child's start with "@@" on stdout,
// the parent's go to its stdin):
//
//	child:  @@ADDR <quoted Setup.Addr>
//	parent: ADDR <rank> <quoted addr>   (one per rank)   CONNECT
//	child:  @@CONNECTED                  (or @@ERR <why>)
//	parent: READY                        (every rank connected)
//	child:  the role's lines; @@ERR <why> if it failed
const (
	envRole = "GOCOLL_KIT_ROLE"
	envRank = "GOCOLL_KIT_RANK"
	envSize = "GOCOLL_KIT_SIZE"
	envJob  = "GOCOLL_KIT_JOB"
)

// childWait bounds how long the parent waits for a child's next line: a
// test binary built with -race may take a while to start.
const childWait = 4 * Hang

// Parent is a child rank's link to the test that started it.
type Parent struct {
	in *bufio.Scanner
}

// Say sends the parent a line (the "@@" is added).
func (p *Parent) Say(format string, a ...any) {
	fmt.Printf("@@"+format+"\n", a...)
}

// Next returns the parent's next line; false when the parent closed the
// link (it is done with this rank).
func (p *Parent) Next() (string, bool) {
	if !p.in.Scan() {
		return "", false
	}
	return p.in.Text(), true
}

// drain waits until the parent closes the link.
func (p *Parent) drain() {
	for p.in.Scan() {
	}
}

// Role is what a child rank does once connected. Roles the kit knows:
//
//	idle      waits until the parent is done (or kills it)
//	abort     reads a line and aborts with it as the reason
//	close     (transports) sends "last!" to rank 1 as message 0 of 5 bytes,
//	          closes and exits at once; (groups) closes and exits
//	exchange  (transports) exchanges every size of the kit with every rank
//
// A Maker adds its own by implementing Roles.
type Role[T any] func(ctx context.Context, x T, p *Parent) error

// Roles adds child roles (a benchmark's echo peer, say) to a Maker's.
type Roles interface {
	Roles() map[string]Role[transport.Transport]
}

// stopper is what every rank of a transport or a group can do.
type stopper interface {
	Abort(reason error)
	Close() error
}

func commonRoles[T stopper]() map[string]Role[T] {
	return map[string]Role[T]{
		"idle": func(ctx context.Context, x T, p *Parent) error {
			p.Say("IDLE")
			p.drain()
			return nil
		},
		"abort": func(ctx context.Context, x T, p *Parent) error {
			p.Say("WAITING")
			reason, ok := p.Next()
			if !ok {
				return errors.New("the parent left before saying why to abort")
			}
			x.Abort(errors.New(reason))
			p.Say("ABORTED")
			p.drain()
			return nil
		},
	}
}

func transportRoles(mk Maker) map[string]Role[transport.Transport] {
	roles := commonRoles[transport.Transport]()
	roles["close"] = func(ctx context.Context, tr transport.Transport, p *Parent) error {
		if err := tr.Send(ctx, 1, Hdr(0, 5), []byte("last!")); err != nil {
			return err
		}
		tr.Close()
		p.Say("CLOSED")
		os.Exit(0) // at once, as a process that is done would
		return nil
	}
	roles["exchange"] = func(ctx context.Context, tr transport.Transport, p *Parent) error {
		if err := exchange(ctx, tr, AllRanks(tr.Size()), sizes(mk.Caps()), 0); err != nil {
			return err
		}
		p.Say("OK")
		return nil
	}
	if r, ok := mk.(Roles); ok {
		for name, f := range r.Roles() {
			roles[name] = f
		}
	}
	return roles
}

// Main runs the package's tests (m.Run), or, in a child process the kit
// started, the child's rank of mk; it returns the exit code. Call it from
// TestMain: os.Exit(transporttest.Main(m, maker)).
func Main(m *testing.M, mk Maker) int {
	role := os.Getenv(envRole)
	if role == "" {
		return m.Run()
	}
	return runChild(role, mk.Prepare, transportRoles(mk))
}

// runChild is the body of a child rank.
func runChild[T stopper](role string, prepare func(Config) (Setup[T], error), roles map[string]Role[T]) int {
	p := &Parent{in: bufio.NewScanner(os.Stdin)}
	fail := func(format string, a ...any) int {
		p.Say("ERR "+format, a...)
		return 1
	}
	run, ok := roles[role]
	if !ok {
		return fail("unknown role %q", role)
	}
	rank, err1 := strconv.Atoi(os.Getenv(envRank))
	size, err2 := strconv.Atoi(os.Getenv(envSize))
	if err := errors.Join(err1, err2); err != nil {
		return fail("bad rank or size: %v", err)
	}
	s, err := prepare(Config{Rank: rank, Size: size, Job: os.Getenv(envJob)})
	if err != nil {
		return fail("prepare: %v", err)
	}
	p.Say("ADDR %s", strconv.Quote(s.Addr))
	addrs := make([]string, size)
	for {
		line, ok := p.Next()
		if !ok {
			return fail("the parent left during setup")
		}
		if line == "CONNECT" {
			break
		}
		rest, _ := strings.CutPrefix(line, "ADDR ")
		rs, quoted, _ := strings.Cut(rest, " ")
		q, err1 := strconv.Atoi(rs)
		addr, err2 := strconv.Unquote(quoted)
		if err := errors.Join(err1, err2); err != nil || q < 0 || q >= size {
			return fail("bad line %q", line)
		}
		addrs[q] = addr
	}
	// Only a bound on a hang: the parent kills children it is done with.
	ctx, cancel := context.WithTimeout(context.Background(), 20*Hang)
	defer cancel()
	x, err := s.Connect(ctx, addrs)
	if err != nil {
		return fail("connect: %v", err)
	}
	defer x.Close()
	p.Say("CONNECTED")
	if line, ok := p.Next(); !ok || line != "READY" {
		return fail("expected READY, got %q", line)
	}
	if s.Ready != nil {
		s.Ready()
	}
	if err := run(ctx, x, p); err != nil {
		return fail("%s: %v", role, err)
	}
	return 0
}

// Child is a rank running in a child process.
type Child struct {
	Rank  int
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	mu    sync.Mutex
	log   bytes.Buffer // everything the child wrote, for failures

	waitOnce sync.Once
	waitErr  error
}

func (c *Child) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.log.Write(b)
}

// Output is everything the child wrote so far.
func (c *Child) Output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.log.String()
}

// Say sends the child a line.
func (c *Child) Say(t testing.TB, format string, a ...any) {
	t.Helper()
	if _, err := fmt.Fprintf(c.stdin, format+"\n", a...); err != nil {
		t.Fatalf("rank %d (child): %v", c.Rank, err)
	}
}

// Expect waits for the child's next line, which must start with word, and
// returns the rest.
func (c *Child) Expect(t testing.TB, word string) string {
	t.Helper()
	return c.ExpectWithin(t, word, childWait)
}

// ExpectWithin is Expect for a line that may take longer than usual (the
// result of a long computation).
func (c *Child) ExpectWithin(t testing.TB, word string, d time.Duration) string {
	t.Helper()
	select {
	case line, ok := <-c.lines:
		if !ok {
			t.Fatalf("rank %d (child) exited while %s was expected; output:\n%s", c.Rank, word, c.Output())
		}
		rest, ok := strings.CutPrefix(line, word)
		if !ok {
			t.Fatalf("rank %d (child) said %q, expected %s; output:\n%s", c.Rank, line, word, c.Output())
		}
		return strings.TrimSpace(rest)
	case <-time.After(d):
		t.Fatalf("rank %d (child) said nothing for %v while %s was expected; output:\n%s", c.Rank, d, word, c.Output())
	}
	return ""
}

// Kill ends the child with SIGKILL, without reaping it: until Wait, it is a
// zombie, which the peers must tell from a live process too.
func (c *Child) Kill(t testing.TB) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
}

// Wait waits for the child to exit and returns how it ended.
func (c *Child) Wait() error {
	c.waitOnce.Do(func() { c.waitErr = c.cmd.Wait() })
	return c.waitErr
}

// Done closes the link: an idle or aborted child closes and exits.
func (c *Child) Done() { c.stdin.Close() }

func startChild(t testing.TB, role string, cfg Config) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envRole+"="+role, envRank+"="+strconv.Itoa(cfg.Rank),
		envSize+"="+strconv.Itoa(cfg.Size), envJob+"="+cfg.Job)
	c := &Child{Rank: cfg.Rank, cmd: cmd, lines: make(chan string, 16)}
	var err error
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = c
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(c, line)
			if s, ok := strings.CutPrefix(line, "@@"); ok {
				c.lines <- s
			}
		}
		close(c.lines)
	}()
	return c
}

// stop ends a child the test is done with: it closes the link and gives
// the child a while to close and exit by itself.
func (c *Child) stop() {
	c.Done()
	done := make(chan struct{})
	go func() { c.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(Hang):
		c.cmd.Process.Kill()
		<-done
	}
}

// StartMesh makes a mesh of len(roles) ranks: rank r runs in a child
// process with role roles[r] (see Role), or in this process where roles[r]
// is "". It
// returns the ranks in this process (nil for children) and the children
// (nil for ranks in this process), connected; at cleanup the ranks here are
// closed, the children told to finish (and killed if they do not), and the
// job checked for leftovers. mk's package must call Main from TestMain.
func StartMesh(t testing.TB, mk Maker, roles []string) ([]transport.Transport, []*Child) {
	t.Helper()
	if !mk.Caps().Processes {
		t.Fatal("the transport cannot run ranks in other processes")
	}
	return startMesh(t, roles, mk.Prepare, residueOf(mk))
}

func startMesh[T closer](t testing.TB, roles []string, prepare func(Config) (Setup[T], error), res Residue) ([]T, []*Child) {
	t.Helper()
	n := len(roles)
	job := NewJob()
	ps := make([]prepared[T], n)
	kids := make([]*Child, n)
	var out []T
	t.Cleanup(func() {
		for _, x := range out {
			if !isNil(x) {
				x.Close()
			}
		}
		for _, c := range kids {
			if c != nil {
				c.stop()
			}
		}
		checkResidue(t, res, job)
	})
	for r, role := range roles {
		cfg := Config{Rank: r, Size: n, Job: job}
		if role != "" {
			ps[r].child = startChild(t, role, cfg)
			kids[r] = ps[r].child
			continue
		}
		s, err := prepare(cfg)
		if err != nil {
			t.Fatalf("rank %d: prepare: %v", r, err)
		}
		ps[r].setup = s
	}
	addrs := make([]string, n)
	for r, p := range ps {
		if p.child == nil {
			addrs[r] = p.setup.Addr
			continue
		}
		a, err := strconv.Unquote(p.child.Expect(t, "ADDR"))
		if err != nil {
			t.Fatalf("rank %d (child): bad address: %v", r, err)
		}
		addrs[r] = a
	}
	for _, c := range kids {
		if c != nil {
			for q, a := range addrs {
				c.Say(t, "ADDR %d %s", q, strconv.Quote(a))
			}
			c.Say(t, "CONNECT")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), childWait)
	defer cancel()
	var err error
	if out, err = connectAll(ctx, ps, addrs); err != nil {
		t.Fatal(err)
	}
	for _, c := range kids {
		if c != nil {
			c.Expect(t, "CONNECTED")
		}
	}
	for _, p := range ps {
		if p.child == nil && p.setup.Ready != nil {
			p.setup.Ready()
		}
	}
	for _, c := range kids {
		if c != nil {
			c.Say(t, "READY")
		}
	}
	return out, kids
}
