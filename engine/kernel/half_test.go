package kernel

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

// Independent oracles: the value of a half / bfloat16 bit pattern computed
// from the IEEE definition with math.Ldexp in float64, and round-to-nearest-
// even done by bracketing between adjacent representable values and
// comparing with their exact midpoint.

func f16Value(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	e := int(h>>10) & 0x1f
	m := float64(h & 0x3ff)
	switch e {
	case 0:
		return sign * math.Ldexp(m, -24)
	case 31:
		if m == 0 {
			return sign * math.Inf(1)
		}
		return math.NaN()
	}
	return sign * math.Ldexp(1024+m, e-25)
}

func bf16Value(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	e := int(h>>7) & 0xff
	m := float64(h & 0x7f)
	switch e {
	case 0:
		return sign * math.Ldexp(m, -133)
	case 255:
		if m == 0 {
			return sign * math.Inf(1)
		}
		return math.NaN()
	}
	return sign * math.Ldexp(128+m, e-134)
}

// roundOracle rounds the finite value v to the format whose non-negative
// finite values, by increasing bit pattern, are value(0..maxFinite); the
// pattern maxFinite+1 is Inf and, for rounding purposes, stands for the value
// one ulp above the largest finite one (overflowVal), as IEEE specifies.
func roundOracle(v float64, value func(uint16) float64, maxFinite uint16, overflowVal float64) uint16 {
	var sign uint16
	if math.Signbit(v) {
		sign = 0x8000
		v = -v
	}
	val := func(h uint16) float64 {
		if h == maxFinite+1 {
			return overflowVal
		}
		return value(h)
	}
	if v >= overflowVal {
		return sign | (maxFinite + 1)
	}
	// Largest lo with val(lo) <= v.
	lo := uint16(sort.Search(int(maxFinite)+2, func(i int) bool { return val(uint16(i)) > v }) - 1)
	if val(lo) == v {
		return sign | lo
	}
	hi := lo + 1
	mid := (val(lo) + val(hi)) / 2 // exact: adjacent values, few significant bits
	switch {
	case v < mid:
		return sign | lo
	case v > mid:
		return sign | hi
	}
	if lo&1 == 0 {
		return sign | lo
	}
	return sign | hi
}

func f16Oracle(f float32) uint16 { return roundOracle(float64(f), f16Value, 0x7bff, 65536) }
func bf16Oracle(f float32) uint16 {
	return roundOracle(float64(f), bf16Value, 0x7f7f, math.Ldexp(1, 128))
}

func TestFloat16AllPatterns(t *testing.T) {
	for i := 0; i < 65536; i++ {
		h := uint16(i)
		f := Float16ToFloat32(h)
		if w := f16Widen(h); math.Float32bits(w) != math.Float32bits(f) {
			t.Fatalf("f16Widen(%#04x) = %#08x, Float16ToFloat32 = %#08x", h, math.Float32bits(w), math.Float32bits(f))
		}
		isNaN := h&0x7c00 == 0x7c00 && h&0x3ff != 0
		if isNaN {
			if f == f {
				t.Fatalf("%#04x: NaN widened to %v", h, f)
			}
			if math.Float32bits(f)>>31 != uint32(h>>15) || math.Float32bits(f)>>13&0x3ff != uint32(h&0x3ff) {
				t.Fatalf("%#04x: NaN sign/payload lost: %#08x", h, math.Float32bits(f))
			}
			if back := Float32ToFloat16(f); back != h|f16QuietBit {
				t.Fatalf("%#04x: NaN round trip %#04x, want %#04x", h, back, h|f16QuietBit)
			}
			continue
		}
		if v := f16Value(h); float64(f) != v || math.Signbit(float64(f)) != math.Signbit(v) {
			t.Fatalf("Float16ToFloat32(%#04x) = %v, want %v", h, f, v)
		}
		if back := Float32ToFloat16(f); back != h {
			t.Fatalf("round trip %#04x -> %v -> %#04x", h, f, back)
		}
	}
}

func TestBfloat16AllPatterns(t *testing.T) {
	for i := 0; i < 65536; i++ {
		h := uint16(i)
		f := Bfloat16ToFloat32(h)
		isNaN := h&0x7f80 == 0x7f80 && h&0x7f != 0
		if isNaN {
			if f == f {
				t.Fatalf("%#04x: NaN widened to %v", h, f)
			}
			if back := Float32ToBfloat16(f); back != h|bfQuietBit {
				t.Fatalf("%#04x: NaN round trip %#04x, want %#04x", h, back, h|bfQuietBit)
			}
			continue
		}
		if v := bf16Value(h); float64(f) != v || math.Signbit(float64(f)) != math.Signbit(v) {
			t.Fatalf("Bfloat16ToFloat32(%#04x) = %v, want %v", h, f, v)
		}
		if back := Float32ToBfloat16(f); back != h {
			t.Fatalf("round trip %#04x -> %v -> %#04x", h, f, back)
		}
	}
}

// roundingInputs returns float32 values around every representable value of
// a 16-bit format: the value, its neighbours, the exact midpoints to the next
// value (ties) and the float32s just either side of them.
func roundingInputs(value func(uint16) float64, maxFinite uint16, overflowVal float64) []float32 {
	var out []float32
	add := func(v float64) {
		f := float32(v)
		if float64(f) != v { // only exact float32s
			return
		}
		for _, g := range []float32{f, math.Nextafter32(f, float32(math.Inf(1))), math.Nextafter32(f, float32(math.Inf(-1)))} {
			out = append(out, g, -g)
		}
	}
	for h := uint16(0); h <= maxFinite; h++ {
		lo := value(h)
		hi := overflowVal
		if h < maxFinite {
			hi = value(h + 1)
		}
		add(lo)
		add((lo + hi) / 2)
		add(lo + (hi-lo)/4)
	}
	add(overflowVal)
	return out
}

func TestFloat32ToFloat16Rounding(t *testing.T) {
	check := func(f float32) {
		if got, want := Float32ToFloat16(f), f16Oracle(f); got != want {
			t.Fatalf("Float32ToFloat16(%v = %#08x) = %#04x, want %#04x", f, math.Float32bits(f), got, want)
		}
	}
	for _, f := range roundingInputs(f16Value, 0x7bff, 65536) {
		check(f)
	}
	r := rand.New(rand.NewPCG(7, 8))
	for i := 0; i < 200000; i++ {
		f := math.Float32frombits(r.Uint32())
		if f != f {
			continue
		}
		check(f)
	}
	// Named cases.
	for _, c := range []struct {
		f    float32
		want uint16
	}{
		{1 + 1.0/2048, 0x3c00},           // tie, even is 1.0
		{1 + 3.0/2048, 0x3c02},           // tie, rounds up to even
		{65504, 0x7bff},                  // max half
		{65519.996, 0x7bff},              // below the overflow threshold
		{65520, 0x7c00},                  // tie at the top rounds to Inf
		{-65520, 0xfc00},                 //
		{float32(math.Ldexp(1, -25)), 0}, // half the smallest subnormal: tie to 0
		{float32(math.Ldexp(3, -25)), 0x0002},
		{float32(math.Ldexp(1, -25)) * 1.0000001, 0x0001},
		{float32(math.Ldexp(1, -14)), 0x0400},                      // smallest normal
		{float32(math.Ldexp(1, -14) - math.Ldexp(1, -25)), 0x0400}, // tie, rounds up to the normal
		{float32(math.Ldexp(1, -149)), 0},                          // float32 subnormal
		{float32(math.Copysign(0, -1)), 0x8000},
		{float32(math.Inf(-1)), 0xfc00},
	} {
		if got := Float32ToFloat16(c.f); got != c.want {
			t.Errorf("Float32ToFloat16(%g) = %#04x, want %#04x", c.f, got, c.want)
		}
	}
	// NaN stays NaN, quiet, sign kept, even with payload only in low bits.
	for _, bits := range []uint32{0x7f800001, 0xff800001, 0x7fc00000, 0x7fbfffff, 0xffffffff} {
		h := Float32ToFloat16(math.Float32frombits(bits))
		if h&0x7c00 != 0x7c00 || h&f16QuietBit == 0 || h>>15 != uint16(bits>>31) {
			t.Errorf("Float32ToFloat16(NaN %#08x) = %#04x", bits, h)
		}
	}
}

func TestFloat32ToBfloat16Rounding(t *testing.T) {
	check := func(f float32) {
		if got, want := Float32ToBfloat16(f), bf16Oracle(f); got != want {
			t.Fatalf("Float32ToBfloat16(%v = %#08x) = %#04x, want %#04x", f, math.Float32bits(f), got, want)
		}
	}
	for _, f := range roundingInputs(bf16Value, 0x7f7f, math.Ldexp(1, 128)) {
		check(f)
	}
	r := rand.New(rand.NewPCG(9, 10))
	for i := 0; i < 200000; i++ {
		f := math.Float32frombits(r.Uint32())
		if f != f {
			continue
		}
		check(f)
	}
	for _, c := range []struct {
		bits uint32
		want uint16
	}{
		{0x3f808000, 0x3f80}, // tie, even
		{0x3f818000, 0x3f82}, // tie, up to even
		{0x3f808001, 0x3f81},
		{0x7f7fffff, 0x7f80}, // float32 max rounds to Inf
		{0x7f7f7fff, 0x7f7f},
		{0x00008000, 0x0000}, // tie among subnormals
		{0x00018000, 0x0002},
	} {
		if got := Float32ToBfloat16(math.Float32frombits(c.bits)); got != c.want {
			t.Errorf("Float32ToBfloat16(%#08x) = %#04x, want %#04x", c.bits, got, c.want)
		}
	}
	for _, bits := range []uint32{0x7f800001, 0xff800001, 0x7fc00000, 0x7f80ffff, 0xffffffff} {
		h := Float32ToBfloat16(math.Float32frombits(bits))
		if h&0x7f80 != 0x7f80 || h&bfQuietBit == 0 || h>>15 != uint16(bits>>31) {
			t.Errorf("Float32ToBfloat16(NaN %#08x) = %#04x", bits, h)
		}
	}
}

// TestHalfSumCorrectlyRounded checks the claim that widening to float32,
// combining and rounding once gives the correctly rounded result: against the
// exact result computed in float64, rounded by the oracle. Products of two
// 16-bit-format values are always exact in float64 (at most 22 significant
// bits, exponents far inside float64's range), and so are sums of halves;
// bfloat16 sums are exact when the exponents differ by less than ~40, so the
// others are skipped.
func TestHalfSumCorrectlyRounded(t *testing.T) {
	type format struct {
		dt        DataType
		value     func(uint16) float64
		maxFinite uint16
		overflow  float64
	}
	for _, f := range []format{
		{Float16, f16Value, 0x7bff, 65536},
		{Bfloat16, bf16Value, 0x7f7f, math.Ldexp(1, 128)},
	} {
		for _, path := range paths() {
			usePath(t, path)
			r := rand.New(rand.NewPCG(11, 12))
			checked := 0
			pairs := 200000
			if testing.Short() { // the race step: these loops share nothing
				pairs = 20000
			}
			for i := 0; i < pairs; i++ {
				a, b := uint16(r.Uint32()), uint16(r.Uint32())
				if i%2 == 0 { // also pairs of similar magnitude
					b = b&0x80ff | a&0x7f00
				}
				fa, fb := f.value(a), f.value(b)
				if fa != fa || fb != fb || math.IsInf(fa, 0) || math.IsInf(fb, 0) {
					continue
				}
				for _, op := range []RedOp{Sum, Prod} {
					exact := fa * fb
					if op == Sum {
						_, ea := math.Frexp(fa)
						_, eb := math.Frexp(fb)
						if f.dt == Bfloat16 && fa != 0 && fb != 0 && (ea-eb > 40 || eb-ea > 40) {
							continue
						}
						exact = fa + fb
					}
					want := roundOracle(exact, f.value, f.maxFinite, f.overflow)
					// A run of 40 identical pairs exercises the vector code.
					d, s := make([]byte, 80), make([]byte, 80)
					for j := 0; j < 80; j += 2 {
						ne.PutUint16(d[j:], a)
						ne.PutUint16(s[j:], b)
					}
					Reduce(d, s, f.dt, op)
					for j := 0; j < 80; j += 2 {
						if got := ne.Uint16(d[j:]); got != want {
							t.Fatalf("%s %v: %#04x %v %#04x = %#04x, want %#04x (exact %g)", path, f.dt, a, op, b, got, want, exact)
						}
					}
					checked++
				}
			}
			if checked < pairs/2 {
				t.Fatalf("only %d cases checked", checked)
			}
		}
	}
}
