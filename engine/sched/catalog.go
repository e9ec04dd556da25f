package sched

import "fmt"

// Entry is a builder under its name: the name GOCOLL_ALGO, the logs and
// gocoll-topo use. The list of them is the engine's registry
// (engine/internal/choose), which engine.Schedules hands out.
type Entry struct {
	Coll  Coll
	Name  string
	Build Builder
	// Hosts says the builder needs Params.Hosts (the hierarchical forms).
	Hosts bool
}

// Find returns the entry of entries for coll and name.
func Find(entries []Entry, coll Coll, name string) (Entry, error) {
	for _, e := range entries {
		if e.Coll == coll && e.Name == name {
			return e, nil
		}
	}
	return Entry{}, fmt.Errorf("sched: no %s algorithm %q", coll, name)
}
