package vppu

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/gocoll/gocoll/engine"
)

// arrivals are the buffers a rank received in an exchange: per device
// and name, and the shared ones by name.
type arrivals struct {
	own    map[int]map[string][]byte
	shared map[string][]byte
}

// exchange carries out the transfers that concern this rank (rank me of
// c): it posts every send and receive of the list, in its order (both
// sides walk the same list, so the messages between two ranks pair up),
// then waits for all of them. source gives the buffer a send reads, alloc
// the buffer a receive fills. Nothing registered changes here: the
// received buffers are returned for the caller to commit.
//
// A local failure (an allocation, a refused send) does not stop the
// posting: the rest is still posted (a receive that could not get its
// buffer drains into scratch memory), so no peer waits for a message
// that never comes; the failures are returned once all is done.
func exchange(c *engine.Comm, me int, xs []transfer, source func(transfer) []byte,
	alloc func(dev int, name string, n int) ([]byte, error)) (arrivals, error) {
	got := arrivals{own: map[int]map[string][]byte{}, shared: map[string][]byte{}}
	var reqs []*engine.Request
	var errs []error
	for _, x := range xs {
		var r *engine.Request
		var err error
		switch {
		case x.From == me:
			if x.Size == 0 {
				continue
			}
			if r, err = c.ISend(source(x), x.Size, engine.Uint8, x.To); err != nil {
				err = fmt.Errorf("device %d buffer %q to rank %d: %w", x.Dev, x.Name, x.To, err)
			}
		case x.To == me:
			buf, aerr := alloc(x.Dev, x.Name, x.Size)
			if aerr != nil || len(buf) != x.Size {
				errs = append(errs, fmt.Errorf("device %d buffer %q: allocating %d bytes: %v", x.Dev, x.Name, x.Size, aerr))
				buf = make([]byte, x.Size) // drained, then dropped
			} else if x.Shared {
				got.shared[x.Name] = buf
			} else {
				put(got.own, x.Dev, x.Name, buf)
			}
			if x.Size == 0 {
				continue
			}
			if r, err = c.IRecv(buf, x.Size, engine.Uint8, x.From); err != nil {
				err = fmt.Errorf("device %d buffer %q from rank %d: %w", x.Dev, x.Name, x.From, err)
			}
		default:
			continue
		}
		if err != nil {
			errs = append(errs, err)
		} else {
			reqs = append(reqs, r)
		}
	}
	errs = append(errs, waitAll(reqs))
	return got, errors.Join(errs...)
}

// allGatherBlobs gathers every rank's blob, of any length: the lengths
// first, then the blobs padded to the longest.
func allGatherBlobs(c *engine.Comm, mine []byte) ([][]byte, error) {
	n := c.Size()
	lens := make([]byte, 8*n)
	if err := c.AllGather(binary.LittleEndian.AppendUint64(nil, uint64(len(mine))), lens, 8, engine.Uint8); err != nil {
		return nil, err
	}
	width := 0
	for r := range n {
		width = max(width, int(binary.LittleEndian.Uint64(lens[8*r:])))
	}
	padded := make([]byte, width)
	copy(padded, mine)
	all := make([]byte, width*n)
	if err := c.AllGather(padded, all, width, engine.Uint8); err != nil {
		return nil, err
	}
	out := make([][]byte, n)
	for r := range n {
		l := int(binary.LittleEndian.Uint64(lens[8*r:]))
		if l > width {
			return nil, fmt.Errorf("rank %d sent a damaged length", r)
		}
		out[r] = all[r*width : r*width+l]
	}
	return out, nil
}

// waitAll waits for every request and joins their errors.
func waitAll(reqs []*engine.Request) error {
	var errs []error
	for _, r := range reqs {
		if err := r.Wait(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// put files buf as device dev's buffer name in m.
func put(m map[int]map[string][]byte, dev int, name string, buf []byte) {
	if m[dev] == nil {
		m[dev] = map[string][]byte{}
	}
	m[dev][name] = buf
}
