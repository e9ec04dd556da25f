package kernel

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// divOracle divides one element the slow, obvious way. n == 1 leaves the
// bytes alone (even a signalling NaN stays as it is).
func divOracle(e []byte, dt DataType, n int) {
	if n == 1 {
		return
	}
	switch dt {
	case Int8:
		e[0] = byte(int8(int64(int8(e[0])) / int64(n)))
	case Uint8:
		e[0] = byte(uint64(e[0]) / uint64(n))
	case Int16:
		ne.PutUint16(e, uint16(int16(int64(int16(ne.Uint16(e)))/int64(n))))
	case Int32:
		ne.PutUint32(e, uint32(int32(int64(int32(ne.Uint32(e)))/int64(n))))
	case Uint32:
		ne.PutUint32(e, uint32(uint64(ne.Uint32(e))/uint64(n)))
	case Int64:
		ne.PutUint64(e, uint64(int64(ne.Uint64(e))/int64(n)))
	case Uint64:
		ne.PutUint64(e, ne.Uint64(e)/uint64(n))
	case Float32:
		ne.PutUint32(e, math.Float32bits(math.Float32frombits(ne.Uint32(e))/float32(n)))
	case Float64:
		ne.PutUint64(e, math.Float64bits(math.Float64frombits(ne.Uint64(e))/float64(n)))
	case Float16:
		ne.PutUint16(e, Float32ToFloat16(Float16ToFloat32(ne.Uint16(e))/float32(n)))
	case Bfloat16:
		ne.PutUint16(e, Float32ToBfloat16(Bfloat16ToFloat32(ne.Uint16(e))/float32(n)))
	}
}

func TestDivideBy(t *testing.T) {
	for _, path := range paths() {
		t.Run(path, func(t *testing.T) {
			usePath(t, path)
			testDivideBy(t)
		})
	}
}

func testDivideBy(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for _, dt := range AllDataTypes() {
		if CheckOp(dt, Avg) != nil {
			continue // bool: TestPanics
		}
		for _, n64 := range []int64{1, 2, 3, 4, 7, 8, 64, 100, 127, 128, 129, 255, 256, 1000, 1 << 20, 1<<31 - 1, 1 << 31, 1 << 40, math.MaxInt64} {
			if n64 > math.MaxInt {
				continue
			}
			n := int(n64)
			for _, off := range []int{0, 1, 3} {
				cnt := 1000
				src := randElems(r, dt, cnt)
				want := bytes.Clone(src)
				sz := dt.Size()
				for i := 0; i < len(want); i += sz {
					divOracle(want[i:i+sz], dt, n)
				}
				got := at(src, off)
				DivideBy(got, dt, n)
				for i := 0; i < len(want); i += sz {
					g, w := got[i:i+sz], want[i:i+sz]
					if bytes.Equal(g, w) {
						continue
					}
					t.Fatalf("%v / %d (off %d): element %d = %x: got %x want %x", dt, n, off, i/sz, src[i:i+sz], g, w)
				}
			}
		}
	}
}

func TestDivideByTruncates(t *testing.T) {
	i32 := func(v ...int32) []byte {
		b := make([]byte, 4*len(v))
		for i, x := range v {
			ne.PutUint32(b[4*i:], uint32(x))
		}
		return b
	}
	for _, c := range []struct {
		in   []int32
		n    int
		want []int32
	}{
		{[]int32{-7, 7, -1, 1, -8, 8, 0, math.MinInt32}, 2, []int32{-3, 3, 0, 0, -4, 4, 0, math.MinInt32 / 2}},
		{[]int32{-7, 7, -1, 1, -9, 9, 0, math.MinInt32}, 3, []int32{-2, 2, 0, 0, -3, 3, 0, math.MinInt32 / 3}},
		{[]int32{-7, 7, -5, 5, -4, 4, -3, 3}, 4, []int32{-1, 1, -1, 1, -1, 1, 0, 0}},
	} {
		b := i32(c.in...)
		DivideBy(b, Int32, c.n)
		if !bytes.Equal(b, i32(c.want...)) {
			t.Errorf("%v / %d = %x, want %v", c.in, c.n, b, c.want)
		}
	}
	b := []byte{0x80, 0x7f, 0xff, 0x81} // int8 -128, 127, -1, -127
	DivideBy(b, Int8, 2)
	if fmt.Sprint([]int8{int8(b[0]), int8(b[1]), int8(b[2]), int8(b[3])}) != "[-64 63 0 -63]" {
		t.Errorf("int8 / 2 = %v", b)
	}
	b = []byte{0x80, 0x7f, 0xff, 0x81}
	DivideBy(b, Uint8, 2)
	if !bytes.Equal(b, []byte{64, 63, 127, 64}) {
		t.Errorf("uint8 / 2 = %v", b)
	}
}

func TestDivideByHalf(t *testing.T) {
	// 3 * 1/3 in half: 1.0/3 rounds once.
	h := []byte{0, 0}
	ne.PutUint16(h, 0x3c00) // 1.0
	DivideBy(h, Float16, 3)
	if got := ne.Uint16(h); got != 0x3555 { // 0.33325
		t.Errorf("half 1/3 = %#04x", got)
	}
	ne.PutUint16(h, 0x3f80) // bf16 1.0
	DivideBy(h, Bfloat16, 3)
	if got := ne.Uint16(h); got != 0x3eab {
		t.Errorf("bf16 1/3 = %#04x", got)
	}
}

// TestDivideBySmallExhaustive: every int8/uint8 value by every divisor up to
// 300, and 32-bit edge values by many divisors (the multiply-high path).
func TestDivideBySmallExhaustive(t *testing.T) {
	for n := 1; n <= 300; n++ {
		b := make([]byte, 256)
		for i := range b {
			b[i] = byte(i)
		}
		s := bytes.Clone(b)
		DivideBy(s, Int8, n)
		u := bytes.Clone(b)
		DivideBy(u, Uint8, n)
		for i := range b {
			if want := int8(int(int8(b[i])) / n); int8(s[i]) != want {
				t.Fatalf("int8 %d / %d = %d, want %d", int8(b[i]), n, int8(s[i]), want)
			}
			if want := int(b[i]) / n; int(u[i]) != want {
				t.Fatalf("uint8 %d / %d = %d, want %d", b[i], n, u[i], want)
			}
		}
	}
	// every int16 value, for the divisors the 8-bit loop used and a few
	// beyond the type's range
	all16 := make([]byte, 2*65536)
	for i := range 65536 {
		ne.PutUint16(all16[2*i:], uint16(i))
	}
	for _, n := range []int{1, 2, 3, 7, 10, 255, 256, 300, 32767, 32768, 32769, 65536, 1 << 40} {
		s := bytes.Clone(all16)
		DivideBy(s, Int16, n)
		for i := range 65536 {
			if got, want := int16(ne.Uint16(s[2*i:])), int16(int64(int16(i))/int64(n)); got != want {
				t.Fatalf("int16 %d / %d = %d, want %d", int16(i), n, got, want)
			}
		}
	}
	edges := []uint32{0, 1, 2, 3, 0x7fffffff, 0x80000000, 0x80000001, 0xfffffffe, 0xffffffff, 12345678, 0xdeadbeef}
	r := rand.New(rand.NewPCG(15, 16))
	divs := []int64{2, 3, 5, 6, 7, 10, 641, 65535, 65537, 1<<31 - 1, 1 << 31, 1<<31 + 1, 1<<32 - 1, 1 << 32, 1<<32 + 1}
	for i := 0; i < 200; i++ {
		divs = append(divs, int64(r.Uint32()>>r.IntN(32))+1)
	}
	for _, n64 := range divs {
		if n64 > math.MaxInt {
			continue
		}
		n := int(n64)
		b := make([]byte, 4*len(edges))
		for i, e := range edges {
			ne.PutUint32(b[4*i:], e)
		}
		s, u := bytes.Clone(b), bytes.Clone(b)
		DivideBy(s, Int32, n)
		DivideBy(u, Uint32, n)
		for i, e := range edges {
			if got, want := int32(ne.Uint32(s[4*i:])), int32(int64(int32(e))/int64(n)); got != want {
				t.Fatalf("int32 %d / %d = %d, want %d", int32(e), n, got, want)
			}
			if got, want := ne.Uint32(u[4*i:]), uint32(uint64(e)/uint64(n)); got != want {
				t.Fatalf("uint32 %d / %d = %d, want %d", e, n, got, want)
			}
		}
	}
}
