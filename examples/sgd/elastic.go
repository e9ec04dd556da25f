package main

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"math"

	"github.com/gocoll/gocoll/vppu/elastic"
)

// -elastic keeps a virtual-device run going when rank processes die: the
// elastic runner (vppu/elastic) shrinks the job onto the survivors,
// re-places the devices with their state and runs the loop again from the
// step they all are at (TrainVirtual). Since every device's data depends
// only on (seed, device, step) and every reduction folds the devices in
// order, the run ends with the weights of an uninterrupted one.

// reportRecoveries prints what each recovery cost (rank 0 at the end).
func reportRecoveries(w io.Writer, rs []elastic.Recovery) {
	for _, r := range rs {
		fmt.Fprintf(w, "recovery at step %d: lost %v, detected at %d (Unix ms), shrink %.1f ms, recover %.1f ms, first step %.1f ms, %d bytes moved, %d round(s), resumed at step %d on %d processes\n",
			r.Step, r.Lost, r.DetectedUnixMS, r.ShrinkMS, r.RecoverMS, r.FirstStepMS, r.Bytes, r.Attempts, r.Resumed, r.Ranks)
	}
}

// weightsHash is the sha256 of the parameters as little-endian float64s,
// layer by layer: equal hashes, bitwise equal weights.
func weightsHash(params [][]float64) string {
	h := sha256.New()
	var b [8]byte
	for _, p := range params {
		for _, x := range p {
			binary.LittleEndian.PutUint64(b[:], math.Float64bits(x))
			h.Write(b[:])
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}
