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
func capi_CommRevoke(comm C.uintptr_t, flags C.int) C.int {
	return call("gocollCommRevoke", comm, func(cs *commState) error {
		if flags != 0 {
			return argErr("flags %d: no flags are defined (pass 0)", int(flags))
		}
		cs.c.Revoke()
		return nil
	})
}

//export capi_CommShrink
func capi_CommShrink(comm C.uintptr_t, exclude *C.int, count C.int, newOK C.int, out *C.uintptr_t, cfg *C.gocollConfig_t, flags C.int) C.int {
	return call("gocollCommShrink", comm, func(cs *commState) error {
		switch {
		case newOK == 0:
			return argErr("newcomm is NULL")
		case flags != C.GOCOLL_SHRINK_DEFAULT && flags != C.GOCOLL_SHRINK_ABORT:
			return argErr("flags %d: want GOCOLL_SHRINK_DEFAULT (0) or GOCOLL_SHRINK_ABORT (1)", int(flags))
		case count < 0:
			return argErr("excludeCount %d is negative", int(count))
		case exclude == nil && count > 0:
			return argErr("excludeRanks is NULL but excludeCount is %d", int(count))
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
			var err error
			if opts, err = configOptions(cfg); err != nil {
				return err
			}
		}
		if err := cs.c.CheckExclude(list); err != nil {
			return err // before revoking: a bad list changes nothing
		}
		if flags == C.GOCOLL_SHRINK_ABORT {
			cs.c.Revoke()
		}
		child, err := cs.c.ShrinkWith(list, opts)
		if err != nil {
			return err
		}
		*out = C.uintptr_t(handles.addComm(child).h)
		return nil
	})
}

//export capi_CommGetFailed
func capi_CommGetFailed(comm C.uintptr_t, ranks *C.int, max C.int, nOK C.int, n *C.int) C.int {
	return call("gocollCommGetFailed", comm, func(cs *commState) error {
		switch {
		case nOK == 0:
			return argErr("n is NULL")
		case max < 0:
			return argErr("max %d is negative", int(max))
		case ranks == nil && max > 0:
			return argErr("ranks is NULL but max is %d", int(max))
		}
		failed := cs.c.Failed()
		*n = C.int(len(failed))
		if ranks != nil {
			out := unsafe.Slice(ranks, int(max))
			for i := 0; i < len(failed) && i < len(out); i++ {
				out[i] = C.int(failed[i])
			}
		}
		return nil
	})
}

//export capi_CommJoinInfo
func capi_CommJoinInfo(comm C.uintptr_t, buf *C.char, length C.size_t, needed *C.size_t) C.int {
	return call("gocollCommJoinInfo", comm, func(cs *commState) error {
		info, err := cs.c.JoinInfo()
		if err != nil {
			return err
		}
		return putText([]byte(info), buf, length, needed)
	})
}

//export capi_CommJoiners
func capi_CommJoiners(comm C.uintptr_t, nOK C.int, n *C.int) C.int {
	return call("gocollCommJoiners", comm, func(cs *commState) error {
		return putInt(nOK != 0, n, "n", cs.c.Joiners())
	})
}

//export capi_CommGrow
func capi_CommGrow(comm C.uintptr_t, joiners C.int, newOK C.int, out *C.uintptr_t) C.int {
	return call("gocollCommGrow", comm, func(cs *commState) error {
		if newOK == 0 {
			return argErr("newcomm is NULL")
		}
		child, err := cs.c.Grow(int(joiners))
		if err != nil {
			return err
		}
		*out = C.uintptr_t(handles.addComm(child).h)
		return nil
	})
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
	opts, err := configOptions(cfg)
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
