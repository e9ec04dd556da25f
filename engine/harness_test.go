package engine

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/gocoll/gocoll/engine/kernel"
)

// runRanks runs fn once per rank, each on its own goroutine, and returns the
// errors by rank.
func runRanks(comms []*Comm, fn func(c *Comm) error) []error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for i, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(c)
		}()
	}
	wg.Wait()
	return errs
}

func mustRanks(t testing.TB, comms []*Comm, fn func(c *Comm) error) {
	t.Helper()
	for r, err := range runRanks(comms, fn) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

func newLocal(t testing.TB, n int, opts Options) []*Comm {
	t.Helper()
	comms, err := NewLocalComms(n, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range comms {
			c.Abort()
			c.Destroy()
		}
	})
	return comms
}

// setElem stores the small integer v as element i of buf in type dt.
func setElem(buf []byte, dt DataType, i int, v int64) {
	switch dt {
	case Int8, Uint8, Bool:
		buf[i] = byte(v)
	case Int16:
		binary.NativeEndian.PutUint16(buf[2*i:], uint16(v))
	case Int32, Uint32:
		binary.NativeEndian.PutUint32(buf[4*i:], uint32(v))
	case Int64, Uint64:
		binary.NativeEndian.PutUint64(buf[8*i:], uint64(v))
	case Float16:
		binary.NativeEndian.PutUint16(buf[2*i:], kernel.Float32ToFloat16(float32(v)))
	case Bfloat16:
		binary.NativeEndian.PutUint16(buf[2*i:], kernel.Float32ToBfloat16(float32(v)))
	case Float32:
		binary.NativeEndian.PutUint32(buf[4*i:], math.Float32bits(float32(v)))
	case Float64:
		binary.NativeEndian.PutUint64(buf[8*i:], math.Float64bits(float64(v)))
	}
}

// inputFor fills a buffer whose reductions are exact in every type and any
// association: small values, and only 1s and 2s under prod for floats.
// Bool inputs are bytes 0, 1 and 2 (true too, so that results show they are
// normalised to 1); bitwise ops get values of both signs, sign bits set.
func inputFor(dt DataType, op RedOp, rank, count, salt int) []byte {
	b := make([]byte, count*dt.Size())
	for i := 0; i < count; i++ {
		v := int64((rank*7 + i*3 + salt*5) % 5)
		switch {
		case dt == Bool:
			v = int64((rank*5 + i*7 + salt) % 3)
		case op.IsBitwise():
			v = int64((rank*37+i*101+salt*7)%251) - 125
		case op == Prod && dt.IsFloat():
			v = v%2 + 1
		case op == Max || op == Min:
			v = int64((rank*13+i*11+salt)%200) - 100
			if dt == Uint8 || dt == Int8 {
				v = int64((rank*13 + i*11 + salt) % 120)
			}
		}
		setElem(b, dt, i, v)
	}
	return b
}

// expectReduce folds inputs in rank order with the reference kernel.
func expectReduce(inputs [][]byte, dt DataType, op RedOp) []byte {
	out := append([]byte(nil), inputs[0]...)
	for _, in := range inputs[1:] {
		kernel.ReferenceReduce(out, in, dt, op)
	}
	if op == Avg {
		kernel.DivideBy(out, dt, len(inputs))
	}
	return out
}

func diffBytes(got, want []byte, es int) string {
	if len(got) != len(want) {
		return fmt.Sprintf("length %d, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			e := i / es
			return fmt.Sprintf("element %d: got % x want % x", e, got[e*es:(e+1)*es], want[e*es:(e+1)*es])
		}
	}
	return ""
}

func putF32(b []byte, f float32) { binary.NativeEndian.PutUint32(b, math.Float32bits(f)) }
