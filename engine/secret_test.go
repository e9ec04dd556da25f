package engine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gocoll/gocoll/engine/bootstrap"
)

// TestGuessedSecretRefused: with GOCOLL_SECRET unset, a one-host job (real
// processes) uses a random secret handed over through a private file; an
// intruder that computes the secret the launch environment used to imply
// is refused, the job completes, and no secret file is left behind.
func TestGuessedSecretRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process")
	}
	const n = 3
	port := freePort(t)
	tmp := t.TempDir()
	env := func(r int) map[string]string {
		return map[string]string{
			"GOCOLL_RANK": strconv.Itoa(r), "GOCOLL_SIZE": strconv.Itoa(n),
			"GOCOLL_ROOT_ADDR": fmt.Sprintf("127.0.0.1:%d", port),
		}
	}
	start := func(r int) *child {
		ch := &child{Cmd: exec.Command(os.Args[0], "-test.run=^$")}
		ch.Cmd.Env = append(os.Environ(), "GOCOLL_TEST_ROLE=join", "GOCOLL_SECRET=", "XDG_RUNTIME_DIR=", "TMPDIR="+tmp, "GOCOLL_TIMEOUT=30s")
		for k, v := range env(r) {
			ch.Cmd.Env = append(ch.Cmd.Env, k+"="+v)
		}
		ch.Cmd.Stdout, ch.Cmd.Stderr = &ch.Out, &ch.Out
		if err := ch.Cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ch.Cmd.Process.Kill() })
		return ch
	}
	kids := []*child{start(0), start(1)}
	// The intruder computes what every rank used to derive and tries to
	// join as the last rank before it arrives.
	l, err := bootstrap.FromEnv(func(k string) string { return env(n - 1)[k] })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = bootstrap.Exchange(ctx, l.RootAddr, l.Secret, n-1, n, []byte(`{"host":"evil"}`))
	if !errors.Is(err, bootstrap.ErrAuth) {
		t.Errorf("intruder with the derived secret: %v, want an authentication failure", err)
	}
	kids = append(kids, start(n-1))
	waitRanks(t, kids, time.Minute)
	for r, k := range kids {
		if k.Err != nil {
			t.Errorf("rank %d: %v\n%s", r, k.Err, k.Out.String())
		}
	}
	if ents, _ := os.ReadDir(tmp); len(ents) != 0 {
		t.Errorf("left behind in the secret directory's parent: %v", ents)
	}
}

// TestRootBindsAdvertisedAddress: a root advertised on 127.0.0.1 does not
// answer on this host's other addresses.
func TestRootBindsAdvertisedAddress(t *testing.T) {
	other := defaultHost()
	if other == "127.0.0.1" {
		t.Skip("no non-loopback address on this host")
	}
	if got := bindHost("127.0.0.1"); got != "127.0.0.1" {
		t.Fatalf("bindHost(127.0.0.1) = %q", got)
	}
	if got := bindHost(other); got != other {
		t.Errorf("bindHost(%s) = %q, want the address itself", other, got)
	}
	if got := bindHost("192.0.2.1"); got != "" { // TEST-NET: not this host's (NAT)
		t.Errorf("bindHost(192.0.2.1) = %q, want every interface", got)
	}
	root, err := bootstrap.StartRoot(hostPort(bindHost("127.0.0.1"), 0), []byte("s"), time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	c, err := net.DialTimeout("tcp", hostPort(other, root.Port()), 5*time.Second)
	if err == nil {
		c.Close()
		t.Fatalf("the root answered on %s although it advertises 127.0.0.1", other)
	}
	c, err = net.DialTimeout("tcp", hostPort("127.0.0.1", root.Port()), 5*time.Second)
	if err != nil {
		t.Fatalf("the root does not answer on loopback: %v", err)
	}
	c.Close()
}

// TestRootStartFailsLeavesNoSecret: rank 0 of a one-host job whose root
// port is taken fails with an error naming it, and leaves no job secret
// file behind (before, the file rank 0 had made stayed in $TMPDIR).
func TestRootStartFailsLeavesNoSecret(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	tmp := t.TempDir()
	env := map[string]string{"GOCOLL_RANK": "0", "GOCOLL_SIZE": "2", "GOCOLL_ROOT_ADDR": taken.Addr().String(), "TMPDIR": tmp}
	opts := Options{Timeout: 2 * time.Second, Getenv: func(k string) string { return env[k] }}
	if _, err := NewCommFromEnv(opts); err == nil || !strings.Contains(err.Error(), "could not start the rendezvous root") {
		t.Fatalf("root on a taken port: %v", err)
	}
	left, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Errorf("left in TMPDIR: %v", left)
	}
}
