package elastic

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gocoll/gocoll/engine"
)

// The job file tells a replacement process how to join: the join info of
// the job's current communicator (its view), the pids of its members (a
// replacement for a dead process waits for a file without that pid, so
// it never joins the view the dead process belonged to) and the view's
// epoch (how many views the file has held before it):
//
//	gocoll-join:1:<tag>:<address>
//	pids 4100 4101 4103
//	epoch 2
//
// Python's gocoll.elastic writes and reads the same format.
//
// A rank of the job rewrites it after every change of view, and only as a
// compare-and-swap: the file must still hold the view this rank came
// from. A rank that was left out (paused past the timeout, then resumed
// after the others went on, so that it decided a view of its own) finds
// the file holding the others' view and stops: at most one successor of
// each view is ever published, and replacements join only that one.

// ErrSuperseded is returned when the job file no longer holds the view
// this rank came from: other ranks went on without it. It is an
// engine.ErrExcluded: stop (or join anew).
var ErrSuperseded = fmt.Errorf("%w: another view of the job was published", engine.ErrExcluded)

// job is what a job file says.
type job struct {
	info  string
	pids  []int
	epoch int
}

func (j job) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\npids", j.info)
	for _, p := range j.pids {
		fmt.Fprintf(&b, " %d", p)
	}
	fmt.Fprintf(&b, "\nepoch %d\n", j.epoch)
	return b.String()
}

// parseJob reads a job file's text.
func parseJob(text string) (job, error) {
	lines := strings.Split(strings.TrimSpace(text), "\n")
	if len(lines) < 2 || !strings.HasPrefix(lines[0], "gocoll-join:") || !strings.HasPrefix(lines[1], "pids") {
		return job{}, errors.New("not what the job writes")
	}
	j := job{info: lines[0]}
	for _, f := range strings.Fields(lines[1])[1:] {
		p, err := strconv.Atoi(f)
		if err != nil {
			return job{}, fmt.Errorf("pid %q", f)
		}
		j.pids = append(j.pids, p)
	}
	if len(lines) > 2 {
		e, ok := strings.CutPrefix(lines[2], "epoch ")
		n, err := strconv.Atoi(e)
		if !ok || err != nil || n < 0 {
			return job{}, fmt.Errorf("epoch line %q", lines[2])
		}
		j.epoch = n
	}
	return j, nil
}

// readJob reads the job file at path.
func readJob(path string) (job, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return job{}, err
	}
	j, err := parseJob(string(b))
	if err != nil {
		return job{}, fmt.Errorf("job file %s: %w", path, err)
	}
	return j, nil
}

// swapJob writes next to the job file at path if the file holds the view
// parent (its join info), or if parent is "" (the job's first view: any
// earlier file is replaced). next.epoch becomes the file's epoch plus one.
// It holds an exclusive lock on path+".lock" across the read and the
// atomic rename, so two ranks racing from the same parent cannot both
// win; the lock is the kernel's (flock), released if its holder dies.
// It returns the epoch written, or ErrSuperseded.
func swapJob(path, parent string, next job) (int, error) {
	lock, err := os.OpenFile(path+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return 0, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return 0, fmt.Errorf("locking %s.lock: %w", path, err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	cur, err := readJob(path)
	switch {
	case parent == "":
		next.epoch = 0
		if err == nil {
			next.epoch = cur.epoch + 1
		}
	case err != nil:
		return 0, fmt.Errorf("%w: the job file is unreadable (%v), so this rank cannot tell that the view it came from is still the job's", ErrSuperseded, err)
	case cur.info != parent:
		return 0, fmt.Errorf("%w: %s holds the view of epoch %d (pids %v), not the one this rank came from", ErrSuperseded, path, cur.epoch, cur.pids)
	default:
		next.epoch = cur.epoch + 1
	}
	tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
	if err := os.WriteFile(tmp, []byte(next.String()), 0o600); err != nil {
		return 0, err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return 0, err
	}
	return next.epoch, nil
}

// JoinJob is a replacement process joining the job of the job file: it
// waits (up to opts' timeout) for a file that no longer lists the pid
// replaces (the dead process it replaces; 0: none), then joins that view
// (engine.Join) with the job's secret. It returns the communicator and
// the view it joined through, for Join.
func JoinJob(path string, replaces int, secret []byte, opts engine.Options) (*engine.Comm, string, error) {
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = engine.DefaultTimeout
	}
	// The job may first have to shrink (up to eight timeouts: Shrink's
	// bound) and recover before it grows: waiting one timeout gave a
	// replacement up while the job it was to join still recovered.
	deadline := time.Now().Add(10 * timeout)
	var last error
	for time.Now().Before(deadline) {
		j, err := readJob(path)
		switch {
		case err != nil:
			last = err
		case replaces != 0 && slices.Contains(j.pids, replaces):
			last = fmt.Errorf("the job has not yet recovered from the death of pid %d", replaces)
		default:
			c, err := engine.Join(j.info, secret, opts)
			if err == nil {
				return c, j.info, nil
			}
			last = err
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil, "", fmt.Errorf("joining through %s: %w", path, last)
}
