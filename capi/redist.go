package main

/*
#include <stdint.h>
#include <stdlib.h>
#include "gocoll.h"
*/
import "C"

import (
	"encoding/json"
	"unsafe"

	"github.com/gocoll/gocoll/vppu/redist"
	"github.com/gocoll/gocoll/vppu/resmap"
)

// ---------------------------------------------------------------------------
// Redistribution plans (vppu/redist, vppu/resmap)

//export capi_PlanCyclic
func capi_PlanCyclic(out *C.uintptr_t, srcProcs, srcBlock, dstProcs, dstBlock C.int, srcA, srcB, dstA, dstB C.long, n C.size_t) (rc C.int) {
	const name = "gocollPlanCyclic"
	defer guard(name, &rc)
	if out == nil {
		return fail(name, nil, argErr("plan is NULL"))
	}
	if uint64(n) > 1<<40 {
		return fail(name, nil, argErr("loop count %d", uint64(n)))
	}
	p, err := redist.PlanAffine(redist.Affine{
		Src: redist.Cyclic{Procs: int(srcProcs), Block: int(srcBlock)}, Dst: redist.Cyclic{Procs: int(dstProcs), Block: int(dstBlock)},
		SrcIndex: redist.Access{A: int(srcA), B: int(srcB)}, DstIndex: redist.Access{A: int(dstA), B: int(dstB)}, N: int(n),
	})
	if err != nil {
		return fail(name, nil, argErr("%v", err))
	}
	*out = C.uintptr_t(handles.addPlan(p))
	return resSuccess
}

// goMap reads a gocollMap_t.
func goMap(m *C.gocollMap_t, what string) (*resmap.Map, error) {
	if m == nil {
		return nil, argErr("%s map is NULL", what)
	}
	nd := int(m.ndims)
	if nd < 1 || nd > 8 || m.extent == nil || m.tile == nil {
		return nil, argErr("%s map: ndims %d (1..8) with extent and tile arrays", what, nd)
	}
	ext := unsafe.Slice((*C.size_t)(unsafe.Pointer(m.extent)), nd)
	tile := unsafe.Slice((*C.size_t)(unsafe.Pointer(m.tile)), nd)
	extent, tiles := make([]int, nd), make([]int, nd)
	for d := 0; d < nd; d++ {
		if uint64(ext[d]) > 1<<40 || uint64(tile[d]) > 1<<40 {
			return nil, argErr("%s map: extent or tile of dimension %d too large", what, d)
		}
		extent[d], tiles[d] = int(ext[d]), int(tile[d])
	}
	devices := int(m.devices)
	if devices < 1 || devices > 1<<20 {
		return nil, argErr("%s map: %d devices", what, devices)
	}
	var weights []float64
	if m.weights != nil {
		w := unsafe.Slice((*C.double)(unsafe.Pointer(m.weights)), devices)
		for _, x := range w {
			weights = append(weights, float64(x))
		}
	}
	var a resmap.Assign
	switch m.assign {
	case C.gocollMapBlocks:
		a = resmap.Blocks
	case C.gocollMapCyclic:
		a = resmap.Cyclic
	default:
		return nil, argErr("%s map: assignment %d", what, int(m.assign))
	}
	mp, err := resmap.Regular(extent, tiles, devices, a, weights)
	if err != nil {
		return nil, argErr("%s map: %v", what, err)
	}
	return mp, nil
}

//export capi_PlanMaps
func capi_PlanMaps(out *C.uintptr_t, src, dst *C.gocollMap_t) (rc C.int) {
	const name = "gocollPlanMaps"
	defer guard(name, &rc)
	if out == nil {
		return fail(name, nil, argErr("plan is NULL"))
	}
	sm, err := goMap(src, "source")
	if err != nil {
		return fail(name, nil, err)
	}
	dm, err := goMap(dst, "destination")
	if err != nil {
		return fail(name, nil, err)
	}
	p, err := redist.PlanMaps(sm, dm)
	if err != nil {
		return fail(name, nil, argErr("%v", err))
	}
	*out = C.uintptr_t(handles.addPlan(p))
	return resSuccess
}

//export capi_PlanPlace
func capi_PlanPlace(plan C.uintptr_t, srcRanks, dstRanks *C.int) (rc C.int) {
	const name = "gocollPlanPlace"
	defer guard(name, &rc)
	p, err := handles.plan(uintptr(plan))
	if err != nil {
		return fail(name, nil, err)
	}
	var s, d []int
	if srcRanks != nil {
		for _, r := range unsafe.Slice(srcRanks, p.Q) {
			s = append(s, int(r))
		}
	}
	if dstRanks != nil {
		for _, r := range unsafe.Slice(dstRanks, p.P) {
			d = append(d, int(r))
		}
	}
	if err := p.Place(s, d); err != nil {
		return fail(name, nil, argErr("%v", err))
	}
	return resSuccess
}

//export capi_PlanCounts
func capi_PlanCounts(plan C.uintptr_t, rank C.int, srcCount, dstCount *C.size_t) (rc C.int) {
	const name = "gocollPlanCounts"
	defer guard(name, &rc)
	p, err := handles.plan(uintptr(plan))
	if err != nil {
		return fail(name, nil, err)
	}
	if srcCount == nil || dstCount == nil {
		return fail(name, nil, argErr("srcCount or dstCount is NULL"))
	}
	s, d := p.Counts(int(rank))
	*srcCount, *dstCount = C.size_t(s), C.size_t(d)
	return resSuccess
}

//export capi_PlanGetJSON
func capi_PlanGetJSON(plan C.uintptr_t, buf *C.char, length C.size_t, needed *C.size_t) (rc C.int) {
	const name = "gocollPlanGetJSON"
	defer guard(name, &rc)
	p, err := handles.plan(uintptr(plan))
	if err != nil {
		return fail(name, nil, err)
	}
	text, err := json.Marshal(p)
	if err != nil {
		return fail(name, nil, err)
	}
	if err := putText(text, buf, length, needed); err != nil {
		return fail(name, nil, err)
	}
	return resSuccess
}

//export capi_Redistribute
func capi_Redistribute(plan C.uintptr_t, src, dst unsafe.Pointer, dt C.int, comm C.uintptr_t) C.int {
	return call("gocollRedistribute", comm, func(cs *commState) error {
		p, err := handles.plan(uintptr(plan))
		if err != nil {
			return err
		}
		t, err := datatype(dt)
		if err != nil {
			return err
		}
		ns, nd := p.Counts(cs.c.Rank())
		if ns > 0 && src == nil || nd > 0 && dst == nil {
			return argErr("rank %d holds %d source and %d destination elements but a buffer is NULL", cs.c.Rank(), ns, nd)
		}
		var sb, db []byte
		if ns > 0 {
			sb = unsafe.Slice((*byte)(src), ns*t.Size())
		}
		if nd > 0 {
			db = unsafe.Slice((*byte)(dst), nd*t.Size())
		}
		return redist.Redistribute(cs.c, p, sb, db, t)
	})
}

//export capi_PlanDestroy
func capi_PlanDestroy(plan C.uintptr_t) (rc C.int) {
	const name = "gocollPlanDestroy"
	defer guard(name, &rc)
	if _, err := handles.takePlan(uintptr(plan)); err != nil {
		return fail(name, nil, err)
	}
	return resSuccess
}
