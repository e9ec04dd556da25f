package engine

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/gocoll/gocoll/engine/internal/recovery"
	"github.com/gocoll/gocoll/engine/internal/shmsync"
	"github.com/gocoll/gocoll/engine/transport/tcp"
)

// The rendezvous: the exchange rounds of connect, over the job's
// exchangeFunc (the bootstrap root, or a parent communicator's links).

// setupInfo is what ranks tell each other while connecting.
type setupInfo struct {
	Host string `json:"host"`
	Shm  string `json:"shm_domain,omitempty"` // equal on ranks that share /dev/shm (see shmDomain)
	Addr string `json:"addr"`
	Pid  int    `json:"pid"`
	// Probe is an empty memory file the ranks of this host try to open:
	// whether they may map this rank's memory (see connect).
	Probe *shmsync.FileRef `json:"probe,omitempty"`
	// Second round.
	Sees     []int            `json:"sees,omitempty"` // ranks whose memory this rank can map
	ShmSeg   *shmsync.FileRef `json:"shm,omitempty"`
	ArenaSeg *shmsync.FileRef `json:"arena,omitempty"` // when every rank is on this host
}

// round tells every rank what this one announces (s.me) and returns what
// all announced, indexed by rank.
func (s *setup) round() ([]setupInfo, error) {
	infos, err := exchangeInfo(s.ctx, s.exchange, s.me, s.size)
	if err != nil {
		return nil, fmt.Errorf("gocoll: rank %d: rendezvous: %w", s.rank, err)
	}
	return infos, nil
}

func exchangeInfo(ctx context.Context, exchange exchangeFunc, me setupInfo, size int) ([]setupInfo, error) {
	blob, err := json.Marshal(me)
	if err != nil {
		return nil, err
	}
	all, err := exchange(ctx, blob)
	if err != nil {
		return nil, err
	}
	if len(all) != size {
		return nil, fmt.Errorf("rendezvous returned %d entries for %d ranks", len(all), size)
	}
	out := make([]setupInfo, size)
	for q, b := range all {
		if err := json.Unmarshal(b, &out[q]); err != nil {
			return nil, fmt.Errorf("setup data of rank %d: %w", q, err)
		}
	}
	return out, nil
}

// controlRound is the last round, "everyone connected", which also says
// where each rank's control listener is (package engine/internal/recovery): opened only now, so
// that nothing but the setup's own listener waits for a late rank.
func (s *setup) controlRound() (*recovery.TCP, error) {
	cln, err := tcp.Listen(s.host)
	if err != nil {
		return nil, fmt.Errorf("gocoll: rank %d: listen: %w", s.rank, err)
	}
	ctlAddr, err := tcp.AdvertiseAddr(cln, s.host)
	var ctlAddrs [][]byte
	if err == nil {
		ctlAddrs, err = s.exchange(s.ctx, []byte(ctlAddr))
	}
	if err == nil && len(ctlAddrs) != s.size {
		err = fmt.Errorf("rendezvous returned %d entries for %d ranks", len(ctlAddrs), s.size)
	}
	if err != nil {
		cln.Close()
		return nil, fmt.Errorf("gocoll: rank %d: rendezvous: %w", s.rank, err)
	}
	addrs := make([]string, s.size)
	for q, a := range ctlAddrs {
		addrs[q] = string(a)
	}
	return recovery.NewTCP(s.rank, addrs, s.secret, s.tag, s.opts.Timeout, cln, s.log), nil
}

// hostsOf groups the ranks by host: the ranks that share memory with each
// other (same host name and /dev/shm, as connect decided), hosts ordered by
// their lowest rank. Every rank computes it from the same setup data.
// Ranks without shared memory are hosts of their own.
func hostsOf(infos []setupInfo) ([][]int, []string) {
	var hosts [][]int
	var names []string
	index := map[string]int{}
	for q, in := range infos {
		key := in.Host + "\x00" + in.Shm
		if in.Shm == "" {
			key = fmt.Sprintf("rank %d", q)
		}
		h, ok := index[key]
		if !ok {
			h = len(hosts)
			index[key] = h
			hosts = append(hosts, nil)
			names = append(names, in.Host)
		}
		hosts[h] = append(hosts[h], q)
	}
	return hosts, names
}
