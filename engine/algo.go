package engine

import (
	"fmt"
	"sort"
	"strings"
)

// Algorithm names per collective. The first is the default family; the
// choice by size is in chooseAlgo.
var algorithms = map[string][]string{
	"allreduce":     {"ring", "hd", "rd"}, // ring (doc 004), pipelined halving–doubling (doc 000), recursive doubling
	"reduce":        {"hd", "tree"},       // doc 000's collection phase toward the root; binomial tree
	"broadcast":     {"tree", "pipeline"}, // binomial tree; segmented chain
	"allgather":     {"ring", "rd"},
	"reducescatter": {"ring", "hd"},
	"alltoall":      {"pairwise", "bruck"},
	"alltoallv":     {"pairwise"},
	"barrier":       {"dissemination"},
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
// ranks agree on (collective, bytes, rank count, options), so every rank picks
// the same one; the choice is also part of the message signature.
func chooseAlgo(spec algoSpec, coll string, bytes, nranks int) string {
	if a := spec.override(coll); a != "" {
		return a
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
