package main

/*
#include <stdint.h>
#include <stdlib.h>
#include "gocoll.h"
*/
import "C"

import (
	"unsafe"

	"github.com/gocoll/gocoll/engine"
)

// Revoke, shrink, failed ranks and grow (docs/elastic.md).

//export capi_CommRevoke
func capi_CommRevoke(comm C.uintptr_t, flags C.int) (rc C.int) {
	const name = "gocollCommRevoke"
	defer guard(name, &rc)
	cs, err := handles.comm(uintptr(comm))
	if err != nil {
		return fail(name, nil, err)
	}
	if flags != 0 {
		return fail(name, cs, argErr("flags %d: no flags are defined (pass 0)", int(flags)))
	}
	cs.c.Revoke()
	return resSuccess
}

//export capi_CommShrink
func capi_CommShrink(comm C.uintptr_t, exclude *C.int, count C.int, newOK C.int, out *C.uintptr_t, cfg *C.gocollConfig_t, flags C.int) (rc C.int) {
	const name = "gocollCommShrink"
	defer guard(name, &rc)
	cs, err := handles.comm(uintptr(comm))
	if err != nil {
		return fail(name, nil, err)
	}
	switch {
	case newOK == 0:
		return fail(name, cs, argErr("newcomm is NULL"))
	case flags != C.GOCOLL_SHRINK_DEFAULT && flags != C.GOCOLL_SHRINK_ABORT:
		return fail(name, cs, argErr("flags %d: want GOCOLL_SHRINK_DEFAULT (0) or GOCOLL_SHRINK_ABORT (1)", int(flags)))
	case count < 0:
		return fail(name, cs, argErr("excludeCount %d is negative", int(count)))
	case exclude == nil && count > 0:
		return fail(name, cs, argErr("excludeRanks is NULL but excludeCount is %d", int(count)))
	}
	var list []int
	if exclude != nil {
		list = make([]int, 0, int(count))
		for _, r := range unsafe.Slice(exclude, int(count)) {
			list = append(list, int(r))
		}
	}
	opts := cs.c.Options()
	if cfg != nil {
		settings, err := configSettings(cfg)
		if err != nil {
			return fail(name, cs, err)
		}
		if opts, err = options(settings...); err != nil {
			return fail(name, cs, err)
		}
	}
	if err := cs.c.CheckExclude(list); err != nil {
		return fail(name, cs, err) // before revoking: a bad list changes nothing
	}
	if flags == C.GOCOLL_SHRINK_ABORT {
		cs.c.Revoke()
	}
	child, err := cs.c.ShrinkWith(list, opts)
	if err != nil {
		return fail(name, cs, err)
	}
	*out = C.uintptr_t(handles.addComm(child).h)
	return resSuccess
}

//export capi_CommGetFailed
func capi_CommGetFailed(comm C.uintptr_t, ranks *C.int, max C.int, nOK C.int, n *C.int) (rc C.int) {
	const name = "gocollCommGetFailed"
	defer guard(name, &rc)
	cs, err := handles.comm(uintptr(comm))
	if err != nil {
		return fail(name, nil, err)
	}
	switch {
	case nOK == 0:
		return fail(name, cs, argErr("n is NULL"))
	case max < 0:
		return fail(name, cs, argErr("max %d is negative", int(max)))
	case ranks == nil && max > 0:
		return fail(name, cs, argErr("ranks is NULL but max is %d", int(max)))
	}
	failed := cs.c.Failed()
	*n = C.int(len(failed))
	if ranks != nil {
		out := unsafe.Slice(ranks, int(max))
		for i := 0; i < len(failed) && i < len(out); i++ {
			out[i] = C.int(failed[i])
		}
	}
	return resSuccess
}

//export capi_CommJoinInfo
func capi_CommJoinInfo(comm C.uintptr_t, buf *C.char, length C.size_t, needed *C.size_t) (rc C.int) {
	const name = "gocollCommJoinInfo"
	defer guard(name, &rc)
	cs, err := handles.comm(uintptr(comm))
	if err != nil {
		return fail(name, nil, err)
	}
	info, err := cs.c.JoinInfo()
	if err != nil {
		return fail(name, cs, err)
	}
	return copyText(name, cs, []byte(info), buf, length, needed)
}

//export capi_CommJoiners
func capi_CommJoiners(comm C.uintptr_t, nOK C.int, n *C.int) (rc C.int) {
	const name = "gocollCommJoiners"
	defer guard(name, &rc)
	cs, err := handles.comm(uintptr(comm))
	if err != nil {
		return fail(name, nil, err)
	}
	if nOK == 0 {
		return fail(name, cs, argErr("n is NULL"))
	}
	*n = C.int(cs.c.Joiners())
	return resSuccess
}

//export capi_CommGrow
func capi_CommGrow(comm C.uintptr_t, joiners C.int, newOK C.int, out *C.uintptr_t) (rc C.int) {
	const name = "gocollCommGrow"
	defer guard(name, &rc)
	cs, err := handles.comm(uintptr(comm))
	if err != nil {
		return fail(name, nil, err)
	}
	if newOK == 0 {
		return fail(name, cs, argErr("newcomm is NULL"))
	}
	child, err := cs.c.Grow(int(joiners))
	if err != nil {
		return fail(name, cs, err)
	}
	*out = C.uintptr_t(handles.addComm(child).h)
	return resSuccess
}

//export capi_CommJoin
func capi_CommJoin(commOK C.int, out *C.uintptr_t, info *C.char, id *C.char, cfg *C.gocollConfig_t) (rc C.int) {
	const name = "gocollCommJoin"
	defer guard(name, &rc)
	switch {
	case commOK == 0:
		return fail(name, nil, argErr("comm is NULL"))
	case info == nil:
		return fail(name, nil, argErr("joinInfo is NULL"))
	}
	var uid *engine.UniqueID
	if id != nil {
		uid = new(engine.UniqueID)
		copy(uid[:], unsafe.Slice((*byte)(unsafe.Pointer(id)), len(uid)))
	}
	secret, err := engine.JoinSecret(uid, cGetenv)
	if err != nil {
		return fail(name, nil, err)
	}
	settings, err := configSettings(cfg)
	if err != nil {
		return fail(name, nil, err)
	}
	opts, err := options(settings...)
	if err != nil {
		return fail(name, nil, err)
	}
	c, err := engine.Join(C.GoString(info), secret, opts)
	if err != nil {
		return fail(name, nil, err)
	}
	*out = C.uintptr_t(handles.addComm(c).h)
	return resSuccess
}
