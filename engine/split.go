package engine

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/gocoll/gocoll/engine/internal/recovery"
	"github.com/gocoll/gocoll/engine/transport/mem"
)

// SplitNoColor as a colour leaves a rank out of every sub-communicator
// (Split returns nil for it), like NCCL_SPLIT_NOCOLOR.
const SplitNoColor = -1

// splitter builds the transport of a sub-communicator. members lists the
// parent ranks of the new communicator in its rank order.
type splitter interface {
	child(c *Comm, splitSeq uint64, color int, members []int, childRank int) (links, splitter, error)
	// shrunk builds the links of the communicator of view (ranks of c,
	// newRank among them) agreed in rec's instance inst (see Shrink).
	shrunk(c *Comm, rec *recovery.Recoverer, inst uint64, view []int, newRank int, opts Options, ctx context.Context) (links, splitter, error)
}

// Split is a collective over c: ranks passing the same colour form a new
// communicator, ranked by key (ties by rank in c). Every rank must call it;
// a rank passing SplitNoColor gets nil.
func (c *Comm) Split(color, key int) (*Comm, error) {
	if color < SplitNoColor {
		return nil, invalidArg("split colour %d is negative (use SplitNoColor to opt out)", color)
	}
	mine := make([]byte, 16)
	binary.LittleEndian.PutUint64(mine, uint64(int64(color)))
	binary.LittleEndian.PutUint64(mine[8:], uint64(int64(key)))
	all := make([]byte, 16*c.size)
	if err := c.AllGather(mine, all, 2, Int64); err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.splits++
	seq := c.splits
	c.mu.Unlock()
	type member struct{ rank, key int }
	var ms []member
	for r := 0; r < c.size; r++ {
		col := int(int64(binary.LittleEndian.Uint64(all[16*r:])))
		k := int(int64(binary.LittleEndian.Uint64(all[16*r+8:])))
		if col == color {
			ms = append(ms, member{r, k})
		}
	}
	if color == SplitNoColor {
		// Still take part in the collective steps of the children's setup.
		_, _, err := c.split.child(c, seq, color, nil, -1)
		return nil, err
	}
	sort.SliceStable(ms, func(i, j int) bool { return ms[i].key < ms[j].key })
	members := make([]int, len(ms))
	childRank := -1
	for i, m := range ms {
		members[i] = m.rank
		if m.rank == c.rank {
			childRank = i
		}
	}
	l, sp, err := c.split.child(c, seq, color, members, childRank)
	if err != nil {
		return nil, fmt.Errorf("gocoll: split on rank %d: %w", c.rank, setupTimeout(err, "setting up the child", c.opts.Timeout))
	}
	return adopt(childRank, len(members), l, sp, c.opts)
}

// localSplitter makes in-process children: the first member to arrive
// creates the child's world and the others pick it up.
type localSplitter struct {
	world *mem.World
	hub   *localHub
	id    uint64 // the communicator id of the world's ranks
	ctl   *recovery.LocalWorld
}

// localHub is shared by the ranks of one in-process communicator; each
// child gets its own, so grandchildren's names never collide.
type localHub struct {
	mu       sync.Mutex
	children map[string]*localSplitter
}

func newLocalHub() *localHub { return &localHub{children: map[string]*localSplitter{}} }

// child is the in-process child world of n ranks named key, made by the
// first member to ask.
func (h *localHub) child(key string, n int) *localSplitter {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch, ok := h.children[key]
	if !ok {
		ch = &localSplitter{world: mem.NewWorld(n), hub: newLocalHub(), id: randomID(), ctl: recovery.NewLocalWorld(n)}
		h.children[key] = ch
	}
	return ch
}

func (s *localSplitter) child(c *Comm, seq uint64, color int, members []int, childRank int) (links, splitter, error) {
	if members == nil {
		return links{}, nil, nil
	}
	ch := s.hub.child(fmt.Sprintf("%d/%d", seq, color), len(members))
	return links{tr: ch.world.Endpoint(childRank), hosts: restrictHosts(c.layout.hosts, members), id: ch.id, ctl: ch.ctl.Member(childRank)}, ch, nil
}

// restrictHosts is the placement of a child whose ranks are members (parent
// ranks, in child order): each parent host keeps the members it held,
// renumbered, hosts without members dropped.
func restrictHosts(hosts [][]int, members []int) [][]int {
	child := map[int]int{}
	for i, m := range members {
		child[m] = i
	}
	var out [][]int
	for _, h := range hosts {
		var kept []int
		for _, r := range h {
			if i, ok := child[r]; ok {
				kept = append(kept, i)
			}
		}
		if kept != nil {
			slices.Sort(kept)
			out = append(out, kept)
		}
	}
	slices.SortFunc(out, func(a, b []int) int { return a[0] - b[0] })
	return out
}
