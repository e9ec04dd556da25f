package engine

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Algorithm names per collective. The first is the default family; the
// choice by size is in chooseAlgo.
//
// "shm" is the shared-memory path (package shmcoll): ranks read each other's
// slots directly. It exists only when every rank of the communicator is on
// this host, and is then the automatic choice; the message algorithms stay
// selectable there, because that is where they are tested.
var algorithms = map[string][]string{
	"allreduce":     {"ring", "hd", "rd", "shm"}, // ring (doc 004), pipelined halving–doubling (doc 000), recursive doubling
	"reduce":        {"hd", "tree", "shm"},       // doc 000's collection phase toward the root; binomial tree
	"broadcast":     {"tree", "pipeline", "shm"}, // binomial tree; segmented chain
	"allgather":     {"ring", "shm"},
	"reducescatter": {"ring", "hd", "shm"},
	"alltoall":      {"pairwise", "bruck", "shm"},
	"alltoallv":     {"pairwise"},
	"barrier":       {"dissemination", "shm"},
}

// algoSpec is a parsed GOCOLL_ALGO: collective → algorithm, "" → any.
type algoSpec map[string]string

func parseAlgoSpec(s string) (algoSpec, error) {
	spec := algoSpec{}
	if strings.TrimSpace(s) == "" {
		return spec, nil
	}
	for _, part := range strings.Split(s, ",") {
		part = strings.ToLower(strings.TrimSpace(part))
		coll, name, found := strings.Cut(part, "=")
		if !found {
			coll, name = "", part
		}
		ok := false
		for c, names := range algorithms {
			if coll != "" && c != coll {
				continue
			}
			for _, n := range names {
				ok = ok || n == name
			}
		}
		if !ok {
			return nil, fmt.Errorf("%w: GOCOLL_ALGO: unknown algorithm %q; known: %s", ErrInvalidArgument, part, knownAlgos())
		}
		spec[coll] = name
	}
	return spec, nil
}

func knownAlgos() string {
	var out []string
	for c, names := range algorithms {
		out = append(out, c+"="+strings.Join(names, "|"))
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// override returns the forced algorithm for coll, if any applies to it.
func (s algoSpec) override(coll string) string {
	if a, ok := s[coll]; ok {
		return a
	}
	if a, ok := s[""]; ok {
		for _, n := range algorithms[coll] {
			if n == a {
				return a
			}
		}
	}
	return ""
}

// Size thresholds of the automatic choice, in bytes of the message.
const (
	smallAllreduce = 16 << 10 // below: recursive doubling (latency bound)
	largeAllreduce = 4 << 20  // above: ring when ranks are not a power of two
	smallAlltoall  = 256      // per-peer block size below which Bruck aggregates
	smallBroadcast = 256 << 10
)

// chooseAlgo picks the algorithm for one call. It depends only on values all
// ranks agree on (collective, bytes, rank count, options, whether all ranks
// share this host), so every rank picks the same one; the choice is also part
// of the message signature. shm says the shared-memory path is available.
func chooseAlgo(spec algoSpec, coll string, bytes, nranks int, shm bool) string {
	if a := spec.override(coll); a != "" && (a != "shm" || shm) {
		return a
	}
	if shm && slices.Contains(algorithms[coll], "shm") {
		return "shm"
	}
	pow2 := nranks&(nranks-1) == 0
	switch coll {
	case "allreduce":
		switch {
		case bytes <= smallAllreduce:
			return "rd"
		case bytes >= largeAllreduce && !pow2:
			return "ring"
		default:
			return "hd"
		}
	case "reduce":
		if bytes <= smallAllreduce {
			return "tree"
		}
		return "hd"
	case "broadcast":
		if bytes <= smallBroadcast || nranks <= 2 {
			return "tree"
		}
		return "pipeline"
	case "allgather":
		return "ring"
	case "reducescatter":
		return "ring"
	case "alltoall":
		if bytes/max(nranks, 1) <= smallAlltoall && nranks > 2 {
			return "bruck"
		}
		return "pairwise"
	}
	return algorithms[coll][0]
}
