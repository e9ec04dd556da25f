package engine

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// dumpRegistry is the set of live communicators of a process with their
// flight recorders on, so that one signal can ask every one of them to dump.
type dumpRegistry struct {
	mu     sync.Mutex
	comms  map[*Comm]struct{}
	listen sync.Once
}

// processDumps is the process's registry, the one piece of package-level
// state in the engine: SIGUSR1 is delivered to a process, not to a
// communicator, and a handler must be installed once per process however
// many communicators (or copies of the library's users) come and go.
var processDumps dumpRegistry

// add registers c and, the first time, starts listening for SIGUSR1.
// Listening only once a communicator exists leaves the signal's default
// action alone in processes that never make one.
func (d *dumpRegistry) add(c *Comm) {
	d.listen.Do(func() {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGUSR1)
		go func() {
			for range ch {
				d.dumpAll("SIGUSR1")
			}
		}()
	})
	d.mu.Lock()
	if d.comms == nil {
		d.comms = map[*Comm]struct{}{}
	}
	d.comms[c] = struct{}{}
	d.mu.Unlock()
}

func (d *dumpRegistry) remove(c *Comm) {
	d.mu.Lock()
	delete(d.comms, c)
	d.mu.Unlock()
}

// dumpAll writes every registered communicator's dump file and returns
// the paths; failures are logged by each communicator.
func (d *dumpRegistry) dumpAll(reason string) []string {
	d.mu.Lock()
	comms := make([]*Comm, 0, len(d.comms))
	for c := range d.comms {
		comms = append(comms, c)
	}
	d.mu.Unlock()
	var paths []string
	for _, c := range comms {
		path, err := c.dumpFile(reason)
		if err != nil {
			c.log.Warn("could not write the flight recorder's dump", "reason", reason, "err", err)
			continue
		}
		c.log.Info("flight recorder dumped", "reason", reason, "path", path)
		paths = append(paths, path)
	}
	return paths
}
