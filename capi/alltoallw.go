package main

/*
#include <stdint.h>
#include <stdlib.h>
#include "gocoll.h"
*/
import "C"

import (
	"math/bits"
	"unsafe"

	"github.com/gocoll/gocoll/engine"
)

// wlayout converts one side's displacements (bytes) and block types of
// gocollAllToAllw, and returns how many bytes of the buffer they reach.
func wlayout(what string, displs *C.size_t, types *C.gocollBlockType_t, n int) (ds []int, ts []engine.BlockType, span uint64, err error) {
	if displs == nil || types == nil {
		return nil, nil, 0, argErr("%sdispls and %stypes must not be NULL", what[:1], what)
	}
	dd := unsafe.Slice(displs, n)
	tt := unsafe.Slice(types, n)
	ds, ts = make([]int, n), make([]engine.BlockType, n)
	for i := range n {
		t := &tt[i]
		dt, err := datatype(C.int(t.datatype))
		if err != nil {
			return nil, nil, 0, argErr("%stypes[%d]: unknown datatype %d", what, i, int(t.datatype))
		}
		var bt engine.BlockType
		bt.Type = dt
		if bt.Count, err = elems(what, "types count", t.count); err != nil {
			return nil, nil, 0, err
		}
		if bt.BlockLen, err = elems(what, "types blocklen", t.blocklen); err != nil {
			return nil, nil, 0, err
		}
		if bt.Stride, err = elems(what, "types stride", t.stride); err != nil {
			return nil, nil, 0, err
		}
		if bt.Count <= 1 {
			bt.Stride = bt.BlockLen
		}
		ts[i] = bt
		if bt.Count == 0 || bt.BlockLen == 0 {
			continue // its displacement is not used
		}
		if ds[i], err = elems(what[:1], "displs entry", dd[i]); err != nil {
			return nil, nil, 0, err
		}
		// disp + ((count-1)·stride + blocklen)·size, without overflowing.
		hi, runs := bits.Mul64(uint64(bt.Count-1), uint64(bt.Stride))
		ext := (runs + uint64(bt.BlockLen)) * uint64(dt.Size())
		if hi != 0 || runs > maxBytes || ext > maxBytes || uint64(ds[i])+ext > maxBytes {
			return nil, nil, 0, argErr("%s block %d (%d runs of %d elements, stride %d) does not fit in memory", what, i, bt.Count, bt.BlockLen, bt.Stride)
		}
		span = max(span, uint64(ds[i])+ext)
	}
	return ds, ts, span, nil
}

//export capi_AllToAllw
func capi_AllToAllw(send unsafe.Pointer, sdispls *C.size_t, sendtypes *C.gocollBlockType_t, recv unsafe.Pointer, rdispls *C.size_t,
	recvtypes *C.gocollBlockType_t, comm C.uintptr_t, nb, reqOK C.int, out *C.uintptr_t) C.int {
	name := pick(nb, "gocollAllToAllw", "gocollIAllToAllw")
	return collective(name, comm, nb, reqOK, out, func(c *engine.Comm, nb bool) (*engine.Request, error) {
		sd, st, sspan, err := wlayout("send", sdispls, sendtypes, c.Size())
		if err != nil {
			return nil, err
		}
		rd, rt, rspan, err := wlayout("recv", rdispls, recvtypes, c.Size())
		if err != nil {
			return nil, err
		}
		sb, err := buffer("sendbuff", send, C.size_t(sspan), 1, engine.Uint8)
		if err != nil {
			return nil, err
		}
		rb, err := buffer("recvbuff", recv, C.size_t(rspan), 1, engine.Uint8)
		if err != nil {
			return nil, err
		}
		if nb {
			return c.IAllToAllw(sb, sd, st, rb, rd, rt)
		}
		return nil, c.AllToAllw(sb, sd, st, rb, rd, rt)
	})
}
