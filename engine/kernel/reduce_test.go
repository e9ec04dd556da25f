package kernel

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// paths lists the kernel tables to test: always pure Go, plus assembly when
// this CPU runs it.
func paths() []string {
	if haveAsm {
		return []string{"go", "asm"}
	}
	return []string{"go"}
}

// usePath installs the kernel table for path until the test ends.
func usePath(t testing.TB, path string) {
	old := kernels
	kernels = buildKernels(path == "asm")
	t.Cleanup(func() { kernels = old })
}

var ne = binary.NativeEndian

// randElems returns n random elements of dt, rich in special values: signed
// zeros, infinities, NaNs with assorted payloads and signs, subnormals,
// extremes, and arbitrary bit patterns.
func randElems(r *rand.Rand, dt DataType, n int) []byte {
	sz := dt.Size()
	b := make([]byte, n*sz)
	for i := 0; i < n; i++ {
		e := b[i*sz : (i+1)*sz]
		k := r.IntN(10)
		switch dt {
		case Bool:
			// mostly 0 and 1, the values torch stores, and any other byte
			// (true as well)
			switch {
			case k < 4:
				e[0] = 0
			case k < 8:
				e[0] = 1
			default:
				e[0] = byte(r.Uint32())
			}
		case Int8, Uint8, Int16, Int32, Uint32, Int64, Uint64:
			var v uint64
			switch {
			case k < 5:
				v = r.Uint64()
			case k < 8: // small values, where max/min/prod are interesting
				v = uint64(r.IntN(21) - 10)
			default:
				v = []uint64{0, 1, math.MaxUint64, 1 << 63, 1<<63 - 1, 0x80, 0x7f, 0xff, 1 << 31, 1<<31 - 1}[r.IntN(10)]
			}
			switch sz {
			case 1:
				e[0] = byte(v)
			case 2:
				ne.PutUint16(e, uint16(v))
			case 4:
				ne.PutUint32(e, uint32(v))
			case 8:
				ne.PutUint64(e, v)
			}
		case Float32:
			var bits uint32
			switch {
			case k < 5:
				bits = math.Float32bits(float32(r.NormFloat64() * math.Ldexp(1, r.IntN(20)-10)))
			case k < 7:
				bits = r.Uint32()
			default:
				bits = []uint32{0, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000,
					0x7f800001, 0xffa00005, 0x7fc12345, 1, 0x80000001, 0x7f7fffff, 0xff7fffff,
					0x3f800000, 0xbf800000, 0x00800000}[r.IntN(16)]
			}
			ne.PutUint32(e, bits)
		case Float64:
			var bits uint64
			switch {
			case k < 5:
				bits = math.Float64bits(r.NormFloat64() * math.Ldexp(1, r.IntN(40)-20))
			case k < 7:
				bits = r.Uint64()
			default:
				bits = []uint64{0, 1 << 63, 0x7ff0000000000000, 0xfff0000000000000, 0x7ff8000000000000,
					0xfff8000000000000, 0x7ff0000000000001, 0xfff4000000000abc, 1, 1<<63 | 1,
					0x7fefffffffffffff, 0xffefffffffffffff, 0x3ff0000000000000}[r.IntN(13)]
			}
			ne.PutUint64(e, bits)
		case Float16, Bfloat16:
			var h uint16
			switch {
			case k < 5:
				f := float32(r.NormFloat64() * math.Ldexp(1, r.IntN(12)-6))
				if dt == Float16 {
					h = Float32ToFloat16(f)
				} else {
					h = Float32ToBfloat16(f)
				}
			default:
				h = uint16(r.Uint32())
			}
			ne.PutUint16(e, h)
		}
	}
	return b
}

// at returns a copy of src placed at byte offset off inside a larger buffer,
// to exercise misaligned starts.
func at(src []byte, off int) []byte {
	buf := make([]byte, len(src)+off+8)
	s := buf[off : off+len(src)]
	copy(s, src)
	return s
}

var testLens = []int{0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 1000, 2500}

type offs struct{ d, a, b int }

var testOffs = []offs{{0, 0, 0}, {1, 1, 1}, {0, 1, 0}, {0, 0, 3}, {2, 0, 0}, {4, 4, 4}, {3, 5, 6}}

func TestReduceMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, path := range paths() {
		t.Run(path, func(t *testing.T) {
			usePath(t, path)
			for _, dt := range AllDataTypes() {
				for _, op := range AllRedOps() {
					if CheckOp(dt, op) != nil {
						continue // TestUndefinedOps
					}
					for _, n := range testLens {
						for _, o := range testOffs {
							checkOne(t, r, dt, op, n, o)
						}
					}
				}
			}
		})
	}
}

func checkOne(t *testing.T, r *rand.Rand, dt DataType, op RedOp, n int, o offs) {
	t.Helper()
	a0, b0 := randElems(r, dt, n), randElems(r, dt, n)
	want := bytes.Clone(a0)
	ReferenceReduce(want, b0, dt, op)
	name := fmt.Sprintf("%v/%v/n=%d/off=%v", dt, op, n, o)

	// Reduce: in place into a.
	d := at(a0, o.d)
	Reduce(d, at(b0, o.b), dt, op)
	expectBytes(t, name+"/Reduce", d, want, dt)

	// Reduce3 into a separate dst.
	a, b := at(a0, o.a), at(b0, o.b)
	d = at(randElems(r, dt, n), o.d)
	Reduce3(d, a, b, dt, op)
	expectBytes(t, name+"/Reduce3", d, want, dt)
	expectBytes(t, name+"/Reduce3 kept a", a, a0, dt)
	expectBytes(t, name+"/Reduce3 kept b", b, b0, dt)

	// Reduce3 with dst aliasing a, then aliasing b.
	a = at(a0, o.a)
	Reduce3(a, a, at(b0, o.b), dt, op)
	expectBytes(t, name+"/Reduce3 d=a", a, want, dt)
	b = at(b0, o.b)
	Reduce3(b, at(a0, o.a), b, dt, op)
	expectBytes(t, name+"/Reduce3 d=b", b, want, dt)
}

func expectBytes(t *testing.T, name string, got, want []byte, dt DataType) {
	t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	sz := dt.Size()
	for i := 0; i < len(want); i += sz {
		if !bytes.Equal(got[i:i+sz], want[i:i+sz]) {
			t.Fatalf("%s: element %d: got %x want %x", name, i/sz, got[i:i+sz], want[i:i+sz])
		}
	}
	t.Fatalf("%s: lengths %d vs %d", name, len(got), len(want))
}

func TestCommutative(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, path := range paths() {
		t.Run(path, func(t *testing.T) {
			usePath(t, path)
			for _, dt := range AllDataTypes() {
				for _, op := range AllRedOps() {
					if CheckOp(dt, op) != nil {
						continue
					}
					a, b := randElems(r, dt, 5000), randElems(r, dt, 5000)
					ab, ba := bytes.Clone(a), bytes.Clone(b)
					Reduce(ab, b, dt, op)
					Reduce(ba, a, dt, op)
					expectBytes(t, fmt.Sprintf("%v/%v a op b vs b op a", dt, op), ab, ba, dt)
					// The reference must be commutative too.
					ab, ba = bytes.Clone(a), bytes.Clone(b)
					ReferenceReduce(ab, b, dt, op)
					ReferenceReduce(ba, a, dt, op)
					expectBytes(t, fmt.Sprintf("%v/%v reference", dt, op), ab, ba, dt)
				}
			}
		})
	}
}

// TestAllHalfPairs checks float16 and bfloat16 Sum/Prod/Max/Min against the
// reference on a large systematic sample of operand pairs: every bit pattern
// for a, against a stride of b values.
func TestAllHalfPairs(t *testing.T) {
	bstep := 509
	if testing.Short() {
		bstep = 2003
	}
	a := make([]byte, 2*65536)
	for i := 0; i < 65536; i++ {
		ne.PutUint16(a[2*i:], uint16(i))
	}
	b := make([]byte, len(a))
	for _, path := range paths() {
		t.Run(path, func(t *testing.T) {
			usePath(t, path)
			for _, dt := range []DataType{Float16, Bfloat16} {
				for _, op := range []RedOp{Sum, Prod, Max, Min} {
					for y := 0; y < 65536; y += bstep {
						for i := 0; i < 65536; i++ {
							ne.PutUint16(b[2*i:], uint16(y+i*7919)) // vary b along the buffer too
						}
						want := bytes.Clone(a)
						ReferenceReduce(want, b, dt, op)
						got := make([]byte, len(a))
						Reduce3(got, a, b, dt, op)
						expectBytes(t, fmt.Sprintf("%v/%v y=%d", dt, op, y), got, want, dt)
					}
				}
			}
		})
	}
}

func f32s(v ...float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		ne.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func bits32(b []byte) []uint32 {
	out := make([]uint32, len(b)/4)
	for i := range out {
		out[i] = ne.Uint32(b[4*i:])
	}
	return out
}

// TestFloatRules pins the documented special cases, 8+ elements so that the
// vector paths run too.
func TestFloatRules(t *testing.T) {
	inf := float32(math.Inf(1))
	nan := math.Float32frombits(0xffc01234) // negative NaN with a payload
	negz := float32(math.Copysign(0, -1))
	a := []float32{1, nan, 0, negz, inf, 2, 3, negz, 5}
	b := []float32{nan, 1, negz, 0, -inf, 3, 2, negz, -7}
	for _, path := range paths() {
		usePath(t, path)
		cases := []struct {
			op   RedOp
			want []uint32
		}{
			{Sum, []uint32{canonNaN32, canonNaN32, 0, 0, canonNaN32, 0x40a00000, 0x40a00000, 0x80000000, 0xc0000000}},
			{Max, []uint32{canonNaN32, canonNaN32, 0, 0, 0x7f800000, 0x40400000, 0x40400000, 0x80000000, 0x40a00000}},
			{Min, []uint32{canonNaN32, canonNaN32, 0x80000000, 0x80000000, 0xff800000, 0x40000000, 0x40000000, 0x80000000, 0xc0e00000}},
			{Prod, []uint32{canonNaN32, canonNaN32, 0x80000000, 0x80000000, 0xff800000, 0x40c00000, 0x40c00000, 0, 0xc20c0000}},
		}
		for _, c := range cases {
			d := f32s(a...)
			Reduce(d, f32s(b...), Float32, c.op)
			if got := bits32(d); fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("%s %v: got %08x want %08x", path, c.op, got, c.want)
			}
		}
	}
}

func TestIntegerWrap(t *testing.T) {
	for _, path := range paths() {
		usePath(t, path)
		// 40 elements: vector body plus tail.
		n := 40
		i8a, i8b := make([]byte, n), make([]byte, n)
		for i := range i8a {
			i8a[i], i8b[i] = 127, 1
		}
		Reduce(i8a, i8b, Int8, Sum)
		if int8(i8a[n-1]) != -128 || int8(i8a[0]) != -128 {
			t.Errorf("%s int8 127+1 = %d, %d", path, int8(i8a[0]), int8(i8a[n-1]))
		}
		u8 := bytes.Repeat([]byte{255}, n)
		Reduce(u8, bytes.Repeat([]byte{1}, n), Uint8, Avg)
		if u8[0] != 0 || u8[n-1] != 0 {
			t.Errorf("%s uint8 255+1 = %d", path, u8[0])
		}
		a, b := make([]byte, 4*n), make([]byte, 4*n)
		for i := 0; i < n; i++ {
			ne.PutUint32(a[4*i:], 0x10000)
			ne.PutUint32(b[4*i:], 0x10001)
		}
		Reduce(a, b, Int32, Prod) // 2^32 + 2^16 wraps to 2^16
		if v := ne.Uint32(a); v != 0x10000 || ne.Uint32(a[4*(n-1):]) != 0x10000 {
			t.Errorf("%s int32 prod wrap: %x", path, v)
		}
		a, b = make([]byte, 8*n), make([]byte, 8*n)
		for i := 0; i < n; i++ {
			ne.PutUint64(a[8*i:], math.MaxInt64)
			ne.PutUint64(b[8*i:], 1)
		}
		Reduce(a, b, Int64, Sum)
		if v := int64(ne.Uint64(a[8*(n-1):])); v != math.MinInt64 {
			t.Errorf("%s int64 max+1 = %d", path, v)
		}
		a, b = make([]byte, 2*n), make([]byte, 2*n)
		for i := 0; i < n; i++ {
			ne.PutUint16(a[2*i:], math.MaxInt16)
			ne.PutUint16(b[2*i:], 1)
		}
		Reduce(a, b, Int16, Sum) // wraps, as torch's int16 does
		if v, w := int16(ne.Uint16(a)), int16(ne.Uint16(a[2*(n-1):])); v != math.MinInt16 || w != math.MinInt16 {
			t.Errorf("%s int16 max+1 = %d, %d", path, v, w)
		}
		for i := 0; i < n; i++ {
			ne.PutUint16(a[2*i:], 300)
			ne.PutUint16(b[2*i:], 300)
		}
		Reduce(a, b, Int16, Prod) // 90000 wraps to 24464
		if v, w := int16(ne.Uint16(a)), int16(ne.Uint16(a[2*(n-1):])); v != 24464 || w != 24464 {
			t.Errorf("%s int16 300*300 = %d, %d", path, v, w)
		}
	}
}

func TestPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"bad type":      func() { Reduce(nil, nil, DataType(42), Sum) },
		"bad op":        func() { Reduce(nil, nil, Int8, RedOp(9)) },
		"len mismatch":  func() { Reduce(make([]byte, 4), make([]byte, 8), Int8, Sum) },
		"len3 mismatch": func() { Reduce3(make([]byte, 4), make([]byte, 4), make([]byte, 8), Int8, Sum) },
		"not multiple":  func() { Reduce(make([]byte, 6), make([]byte, 6), Float32, Sum) },
		"ref multiple":  func() { ReferenceReduce(make([]byte, 6), make([]byte, 6), Float64, Sum) },
		"divide by 0":   func() { DivideBy(make([]byte, 4), Int32, 0) },
		"divide by -2":  func() { DivideBy(make([]byte, 4), Int32, -2) },
		"divide len":    func() { DivideBy(make([]byte, 3), Int32, 2) },
		"type 10":       func() { Reduce(make([]byte, 4), make([]byte, 4), DataType(10), Sum) },
		"band float32":  func() { Reduce(make([]byte, 4), make([]byte, 4), Float32, Band) },
		"bxor bfloat16": func() { Reduce3(make([]byte, 4), make([]byte, 4), make([]byte, 4), Bfloat16, Bxor) },
		"ref bor f64":   func() { ReferenceReduce(make([]byte, 8), make([]byte, 8), Float64, Bor) },
		"avg bool":      func() { Reduce(make([]byte, 4), make([]byte, 4), Bool, Avg) },
		"divide bool":   func() { DivideBy(make([]byte, 4), Bool, 2) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

// TestBoolRules pins torch's bool semantics on the table of every
// operand pair, with bytes other than 1 standing for true: or for
// Sum/Max/Bor, and for Prod/Min/Band, xor for Bxor, results 0 or 1. 40
// elements, so that the vector loops and the tails both run.
func TestBoolRules(t *testing.T) {
	vals := []byte{0, 1, 2, 0x80, 0xff, 0x7f}
	n := 40
	a, b := make([]byte, n), make([]byte, n)
	for i := range n {
		a[i], b[i] = vals[i%len(vals)], vals[(i/len(vals))%len(vals)]
	}
	for _, path := range paths() {
		usePath(t, path)
		for _, c := range []struct {
			ops []RedOp
			f   func(x, y bool) bool
		}{
			{[]RedOp{Sum, Max, Bor}, func(x, y bool) bool { return x || y }},
			{[]RedOp{Prod, Min, Band}, func(x, y bool) bool { return x && y }},
			{[]RedOp{Bxor}, func(x, y bool) bool { return x != y }},
		} {
			for _, op := range c.ops {
				d := make([]byte, n)
				Reduce3(d, a, b, Bool, op)
				for i := range n {
					want := byte(0)
					if c.f(a[i] != 0, b[i] != 0) {
						want = 1
					}
					if d[i] != want {
						t.Errorf("%s bool %v(%#x, %#x) = %#x, want %d", path, op, a[i], b[i], d[i], want)
					}
				}
			}
		}
	}
}

// TestBitwiseIntegers: Band/Bor/Bxor act on the bits, whatever the width
// and sign.
func TestBitwiseIntegers(t *testing.T) {
	for _, path := range paths() {
		usePath(t, path)
		a, b := make([]byte, 8*40), make([]byte, 8*40)
		for i := range 40 {
			ne.PutUint64(a[8*i:], 0xf0f0_ff00_1234_8001+uint64(i))
			ne.PutUint64(b[8*i:], 0x0ff0_f0f0_ffff_0003)
		}
		for _, dt := range []DataType{Int8, Uint8, Int16, Int32, Uint32, Int64, Uint64} {
			for _, c := range []struct {
				op RedOp
				f  func(x, y uint64) uint64
			}{
				{Band, func(x, y uint64) uint64 { return x & y }},
				{Bor, func(x, y uint64) uint64 { return x | y }},
				{Bxor, func(x, y uint64) uint64 { return x ^ y }},
			} {
				d := make([]byte, len(a))
				Reduce3(d, a, b, dt, c.op)
				for i := range 40 {
					if got, want := ne.Uint64(d[8*i:]), c.f(ne.Uint64(a[8*i:]), ne.Uint64(b[8*i:])); got != want {
						t.Fatalf("%s %v %v word %d: %#x, want %#x", path, dt, c.op, i, got, want)
					}
				}
			}
		}
	}
}

// TestCheckOp: which (type, op) pairs are refused, and the type and op
// numbers the C ABI relies on.
func TestCheckOp(t *testing.T) {
	for _, dt := range AllDataTypes() {
		for _, op := range AllRedOps() {
			refused := (op.IsBitwise() && dt.IsFloat()) || (op == Avg && dt == Bool)
			if err := CheckOp(dt, op); (err != nil) != refused {
				t.Errorf("CheckOp(%v, %v) = %v, want refused=%v", dt, op, err, refused)
			} else if err != nil && !strings.Contains(err.Error(), op.String()) {
				t.Errorf("CheckOp(%v, %v) = %q: does not name the op", dt, op, err)
			}
		}
	}
	if CheckOp(DataType(10), Sum) == nil || CheckOp(DataType(11), Sum) == nil || CheckOp(Int32, RedOp(8)) == nil {
		t.Error("numbers 10 and 11 (NCCL's float8) or op 8 accepted")
	}
	if Int16 != 12 || Bool != 13 || Band != 5 || Bor != 6 || Bxor != 7 || len(AllDataTypes()) != 12 {
		t.Errorf("numbers changed: int16 %d bool %d band %d bor %d bxor %d, %d types", Int16, Bool, Band, Bor, Bxor, len(AllDataTypes()))
	}
	for _, s := range []string{"", "int16", "bool", "band"} {
		dt, err := ParseDataType(s)
		if (s == "" || s == "band") != (err != nil) || (err == nil && dt.String() != s) {
			t.Errorf("ParseDataType(%q) = %v, %v", s, dt, err)
		}
	}
	if op, err := ParseRedOp("BXOR"); err != nil || op != Bxor {
		t.Errorf("ParseRedOp(BXOR) = %v, %v", op, err)
	}
}

func TestAsmDetected(t *testing.T) {
	t.Logf("haveAsm=%v", haveAsm)
}

// ---- benchmarks ----

var benchSizes = []struct {
	name string
	n    int
}{{"4KiB", 4 << 10}, {"64KiB", 64 << 10}, {"1MiB", 1 << 20}, {"16MiB", 16 << 20}}

func benchReduce(b *testing.B, path string, three bool) {
	for _, dt := range AllDataTypes() {
		for _, op := range AllRedOps() {
			if CheckOp(dt, op) != nil {
				continue
			}
			for _, s := range benchSizes {
				b.Run(fmt.Sprintf("%v/%v/%s", dt, op, s.name), func(b *testing.B) {
					usePath(b, path)
					x := benchData(dt, s.n, false)
					y := benchData(dt, s.n, op == Prod)
					d := make([]byte, s.n)
					b.SetBytes(int64(s.n))
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						if three {
							Reduce3(d, x, y, dt, op)
						} else {
							Reduce(x, y, dt, op)
						}
					}
				})
			}
		}
	}
}

// benchData is ordinary data: no NaN, Inf or subnormals (which would make
// the hardware slow or take the NaN fix-up path). Repeated in-place Reduce
// must not drift into subnormals either, so a Prod operand is +-1.
func benchData(dt DataType, nbytes int, unit bool) []byte {
	r := rand.New(rand.NewPCG(5, uint64(nbytes)))
	b := make([]byte, nbytes)
	sz := dt.Size()
	for i := 0; i < nbytes; i += sz {
		f := r.Float64()*2000 - 1000
		if unit {
			f = float64(1 - 2*r.IntN(2))
		}
		switch dt {
		case Float32:
			ne.PutUint32(b[i:], math.Float32bits(float32(f)))
		case Float64:
			ne.PutUint64(b[i:], math.Float64bits(f))
		case Float16:
			ne.PutUint16(b[i:], Float32ToFloat16(float32(f)))
		case Bfloat16:
			ne.PutUint16(b[i:], Float32ToBfloat16(float32(f)))
		default:
			for j := 0; j < sz; j++ {
				b[i+j] = byte(r.Uint32())
			}
		}
	}
	return b
}

// BenchmarkReduce uses the kernels Reduce dispatches to by default (assembly
// where available). Bytes counted: the dst buffer size.
func BenchmarkReduce(b *testing.B) {
	path := "go"
	if haveAsm {
		path = "asm"
	}
	benchReduce(b, path, false)
}

// BenchmarkReduceGo forces the pure-Go kernels.
func BenchmarkReduceGo(b *testing.B) { benchReduce(b, "go", false) }

func BenchmarkReduce3(b *testing.B) {
	path := "go"
	if haveAsm {
		path = "asm"
	}
	benchReduce(b, path, true)
}

// BenchmarkCopy is Go's copy of the same sizes, for comparison.
func BenchmarkCopy(b *testing.B) {
	for _, s := range benchSizes {
		b.Run(s.name, func(b *testing.B) {
			x, y := make([]byte, s.n), make([]byte, s.n)
			b.SetBytes(int64(s.n))
			for i := 0; i < b.N; i++ {
				copy(x, y)
			}
		})
	}
}

func BenchmarkDivideBy(b *testing.B) {
	for _, dt := range AllDataTypes() {
		if CheckOp(dt, Avg) != nil {
			continue
		}
		b.Run(fmt.Sprintf("%v/64KiB", dt), func(b *testing.B) {
			x := make([]byte, 64<<10)
			b.SetBytes(int64(len(x)))
			for i := 0; i < b.N; i++ {
				DivideBy(x, dt, 3)
			}
		})
	}
}

// TestLargeBuffers crosses the assembly chunk size (asmChunk) and the
// scratch chunk size, aligned and not.
func TestLargeBuffers(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 18))
	for _, path := range paths() {
		t.Run(path, func(t *testing.T) {
			usePath(t, path)
			dts := AllDataTypes()
			if testing.Short() { // the race step: one type of each kernel family
				dts = []DataType{Float32, Float16, Int16, Bool}
			}
			for _, dt := range dts {
				n := (asmChunk+asmChunk/2)/dt.Size() + 5
				for _, op := range []RedOp{Sum, Max} {
					for _, o := range []offs{{0, 0, 0}, {1, 3, 5}} {
						checkOne(t, r, dt, op, n, o)
					}
				}
				if dt == Int16 || dt == Uint64 || dt == Bool { // the bitwise loop is one for all widths
					for _, o := range []offs{{0, 0, 0}, {1, 3, 5}} {
						checkOne(t, r, dt, Bxor, n, o)
					}
				}
				if CheckOp(dt, Avg) != nil {
					continue
				}
				for _, off := range []int{0, 1} {
					src := randElems(r, dt, n)
					want := bytes.Clone(src)
					for i := 0; i < len(want); i += dt.Size() {
						divOracle(want[i:i+dt.Size()], dt, 7)
					}
					got := at(src, off)
					DivideBy(got, dt, 7)
					for i := 0; i < len(want); i += dt.Size() {
						g, w := got[i:i+dt.Size()], want[i:i+dt.Size()]
						if !bytes.Equal(g, w) {
							t.Fatalf("%v DivideBy 7 off %d: element %d: got %x want %x", dt, off, i/dt.Size(), g, w)
						}
					}
				}
			}
		})
	}
}
