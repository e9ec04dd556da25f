package bootstrap

import (
	"bytes"
	"errors"
	"net"
	"testing"
)

// The rendezvous wire formats, fed arbitrary bytes: no decoder panics,
// none allocates more than its input allows (a frame at most its limit, a
// table at most a few words per input byte), and what decodes re-encodes
// to the same bytes. Seeds: valid encodings here and testdata/fuzz/.

func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{3, 0, 0, 0, 'a', 'b', 'c'})
	f.Add([]byte{0xff, 0xff, 0xff, 0x7f}) // a 2 GiB length, no data
	f.Fuzz(func(t *testing.T, in []byte) {
		const limit = 1 << 12
		a, b := net.Pipe()
		defer a.Close()
		go func() { b.Write(in); b.Close() }()
		frame, err := readFrame(a, limit)
		if err == nil && len(frame) > limit {
			t.Fatalf("frame of %d bytes past the limit %d", len(frame), limit)
		}
		if err == nil && !bytes.Equal(frame, in[4:4+len(frame)]) {
			t.Fatal("frame differs from the bytes sent")
		}
	})
}

func FuzzDecodeTable(f *testing.F) {
	f.Add(encodeTable(nil))
	f.Add(encodeTable([][]byte{[]byte("rank0"), {}, []byte("rank2 blob")}))
	f.Add([]byte{replyTable, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		blobs, err := decodeTable(in)
		if err != nil {
			return
		}
		if len(blobs) > len(in)/4 {
			t.Fatalf("%d blobs from %d bytes", len(blobs), len(in))
		}
		if out := encodeTable(blobs); !bytes.Equal(out, in) {
			t.Fatalf("re-encoded table differs: %x, want %x", out, in)
		}
	})
}

func FuzzReplyErr(f *testing.F) {
	f.Add(errorReply(ErrRankMissing, "ranks 2 never joined"))
	f.Add(errorReply(errors.New("other"), "x"))
	f.Add([]byte{replyError})
	f.Fuzz(func(t *testing.T, in []byte) {
		if err := replyErr("rank 1", in); !errors.Is(err, ErrRendezvous) {
			t.Fatalf("%v does not wrap ErrRendezvous", err)
		}
	})
}

func FuzzUniqueIDParse(f *testing.F) {
	id, err := NewUniqueID("127.0.0.1:29500", NewSecret())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(id[:])
	f.Add(make([]byte, len(id)))
	f.Fuzz(func(t *testing.T, in []byte) {
		var u UniqueID
		copy(u[:], in)
		addr, secret, err := u.Parse()
		if err != nil {
			return
		}
		if len(secret) != 16 || len(addr) == 0 || len(addr) > MaxRootAddr {
			t.Fatalf("parsed %q and a %d-byte secret", addr, len(secret))
		}
		back, err := NewUniqueID(addr, [16]byte(secret))
		if err != nil {
			t.Fatalf("parsed address %q is not one NewUniqueID takes: %v", addr, err)
		}
		addr2, secret2, err := back.Parse()
		if err != nil || addr2 != addr || !bytes.Equal(secret2, secret) {
			t.Fatalf("round trip: %q %x, want %q %x (%v)", addr2, secret2, addr, secret, err)
		}
	})
}

func FuzzDecodeRelays(f *testing.F) {
	f.Add(encodeRelays(nil))
	f.Add(encodeRelays([]string{"127.0.0.1:5", "[::1]:29500", ""}))
	f.Add([]byte{replyRelays, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		addrs, err := decodeRelays(in)
		if err != nil {
			return
		}
		if len(addrs) > len(in)/4 {
			t.Fatalf("%d addresses from %d bytes", len(addrs), len(in))
		}
		if out := encodeRelays(addrs); !bytes.Equal(out, in) {
			t.Fatalf("re-encoded relays differ: %x, want %x", out, in)
		}
	})
}

func FuzzParseJoin(f *testing.F) {
	f.Add([]byte{frameJoin, 4, 0, 0, 0, 'b'})
	f.Add([]byte{frameTreeJoin, 4, 0, 0, 0, 0x39, 0x30, 'b'})
	f.Add([]byte{frameTreeJoin, 4, 0, 0, 0, 0, 0})
	remote := &net.TCPAddr{IP: net.IPv6loopback, Port: 1}
	f.Fuzz(func(t *testing.T, in []byte) {
		e, ok := parseJoin(in, remote)
		if !ok {
			return
		}
		if in[0] == frameTreeJoin {
			host, port, err := net.SplitHostPort(e.relay)
			if err != nil || host != "::1" || port == "0" || len(e.blob) != len(in)-7 {
				t.Fatalf("join %x: relay %q (%v), blob of %d", in, e.relay, err, len(e.blob))
			}
		} else if e.relay != "" || len(e.blob) != len(in)-5 {
			t.Fatalf("join %x: relay %q, blob of %d", in, e.relay, len(e.blob))
		}
	})
}
