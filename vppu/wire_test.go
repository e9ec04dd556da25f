package vppu

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
)

var movesSamples = [][]bufDesc{
	nil,
	{{Dev: 0, Name: "w", Size: 12}},
	{{Dev: 3, Name: "params", Size: 1 << 20}, {Dev: 3, Name: "step", Size: 8, Shared: true}, {Dev: 70000, Name: "", Size: 0}},
}

var recoverSamples = []recoverDesc{
	{Logical: 1, M: 4, Shared: map[string]int{}, Local: []int{}, Own: []map[string]int{}},
	{Logical: 2, M: 3, Joined: true, MinRanks: 2, Place: []int{0, -4, 1 << 30}, Shared: map[string]int{}, Local: []int{}, Own: []map[string]int{}},
	{Logical: 0xfeedface12345678, M: 8, Step: 1 << 40, Rebuild: true, Place: []int{}, Local: []int{1, 5},
		Shared: map[string]int{"params": 4096, "momentum": 4096, "step": 8},
		Own:    []map[string]int{{"rng": 16}, {}}},
}

func TestWireRoundTrip(t *testing.T) {
	for _, ds := range movesSamples {
		got, err := decodeMoves(encodeMoves(ds))
		if err != nil {
			t.Fatalf("%v: %v", ds, err)
		}
		if len(ds) == 0 && len(got) == 0 {
			continue
		}
		if !reflect.DeepEqual(got, ds) {
			t.Errorf("moves %v came back as %v", ds, got)
		}
	}
	for _, d := range recoverSamples {
		got, err := decodeRecover(encodeRecover(d))
		if err != nil {
			t.Fatalf("%+v: %v", d, err)
		}
		if !reflect.DeepEqual(got, d) {
			t.Errorf("description %+v came back as %+v", d, got)
		}
	}
}

// Every truncation, and every message of the other kind or version, is an
// error.
func TestWireDamaged(t *testing.T) {
	check := func(what string, msg []byte, decode func([]byte) error) {
		t.Helper()
		for k := 0; k < len(msg); k++ {
			if err := decode(msg[:k]); !errors.Is(err, errDamaged) {
				t.Errorf("%s cut to %d of %d bytes: %v", what, k, len(msg), err)
			}
		}
		if err := decode(append(msg[:len(msg):len(msg)], 0)); !errors.Is(err, errDamaged) {
			t.Errorf("%s with a byte past the end: %v", what, err)
		}
		other := append([]byte(nil), msg...)
		other[1]++
		if err := decode(other); !errors.Is(err, errDamaged) {
			t.Errorf("%s of another version: %v", what, err)
		}
	}
	moves := func(b []byte) error { _, err := decodeMoves(b); return err }
	recov := func(b []byte) error { _, err := decodeRecover(b); return err }
	check("buffer list", encodeMoves(movesSamples[2]), moves)
	check("description", encodeRecover(recoverSamples[2]), recov)
	check("a joiner's description", encodeRecover(recoverSamples[1]), recov)
	if err := moves(encodeRecover(recoverSamples[0])); !errors.Is(err, errDamaged) {
		t.Errorf("a description read as a buffer list: %v", err)
	}
	// Counts and sizes no message of that length can hold.
	for name, msg := range map[string][]byte{
		"a billion entries": {kindMoves, wireVersion, 0x80, 0x94, 0xeb, 0xdc, 0x03},
		"huge name":         {kindMoves, wireVersion, 1, 0, 0, 0xff, 0xff, 0x03, 'a'},
		"huge size":         {kindMoves, wireVersion, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		"bad flags":         {kindMoves, wireVersion, 1, 0, 2, 0, 0},
	} {
		if err := moves(msg); !errors.Is(err, errDamaged) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// Logical, M, step, flags, MinRanks, no place, no devices, shared "a"
	// twice, no own tables.
	dup := []byte{kindRecover, wireVersion, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 1, 'a', 1, 1, 'a', 2, 0}
	distinct := slices.Clone(dup)
	distinct[21] = 'b'
	if d, err := decodeRecover(distinct); err != nil || len(d.Shared) != 2 {
		t.Fatalf("the sample with distinct names: %+v, %v", d, err)
	}
	if err := recov(dup); !errors.Is(err, errDamaged) || !strings.Contains(err.Error(), "twice") {
		t.Errorf("a name listed twice: %v", err)
	}
}

// FuzzDecodeMoves: any input decodes to an error or to a list that encodes
// and decodes to itself; never a panic or an allocation beyond the input's
// size.
func FuzzDecodeMoves(f *testing.F) {
	for _, ds := range movesSamples {
		f.Add(encodeMoves(ds))
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		ds, err := decodeMoves(msg)
		if err != nil {
			return
		}
		again, err := decodeMoves(encodeMoves(ds))
		if err != nil || (len(ds) > 0 && !reflect.DeepEqual(again, ds)) {
			t.Fatalf("%v re-decoded as %v, %v", ds, again, err)
		}
	})
}

// FuzzDecodeRecover is FuzzDecodeMoves for a recovery's description.
func FuzzDecodeRecover(f *testing.F) {
	for _, d := range recoverSamples {
		f.Add(encodeRecover(d))
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		d, err := decodeRecover(msg)
		if err != nil {
			return
		}
		again, err := decodeRecover(encodeRecover(d))
		if err != nil || !reflect.DeepEqual(again, d) {
			t.Fatalf("%+v re-decoded as %+v, %v", d, again, err)
		}
	})
}
