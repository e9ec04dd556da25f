// Command capi is libgocoll's C ABI: build it with -buildmode=c-shared (see
// build/build.sh). The public functions are the C wrappers in gocoll.c,
// declared in the hand-written gocoll.h; they forward to the capi_*
// functions exported here, which turn handles and C buffers into engine
// calls and engine errors into result codes. Nothing else lives here: the
// collectives, their argument checks beyond what the ABI needs, and the
// rendezvous are the engine's.
package main

/*
#include <stdint.h>
#include <stdlib.h>
#include "gocoll.h"
*/
import "C"

import (
	"math/bits"
	"time"
	"unsafe"

	"github.com/gocoll/gocoll/engine"
)

func main() {}

// maxBytes bounds the size of any one buffer (64 TiB): anything larger is a
// negative number or garbage cast to size_t.
const maxBytes = 1 << 46

var emptyCString = C.CString("")

// ---------------------------------------------------------------------------
// Library, errors

//export capi_GetVersion
func capi_GetVersion(version *C.int) (rc C.int) {
	const name = "gocollGetVersion"
	defer guard(name, &rc)
	if version == nil {
		return fail(name, nil, argErr("version is NULL"))
	}
	*version = C.GOCOLL_VERSION_CODE
	return resSuccess
}

// capi_GetLastError returns comm's last-error text, or NULL when comm is not
// a live communicator (the C side then returns the thread's text).
//
//export capi_GetLastError
func capi_GetLastError(comm C.uintptr_t) (s *C.char) {
	defer func() {
		if recover() != nil {
			s = nil
		}
	}()
	cs, err := handles.comm(uintptr(comm))
	if err != nil {
		return nil
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.lastErr == nil {
		return emptyCString
	}
	return cs.lastErr
}

// ---------------------------------------------------------------------------
// Communicators

//export capi_GetUniqueId
func capi_GetUniqueId(id *C.char) (rc C.int) {
	const name = "gocollGetUniqueId"
	defer guard(name, &rc)
	if id == nil {
		return fail(name, nil, argErr("id is NULL"))
	}
	opts, err := options()
	if err != nil {
		return fail(name, nil, err)
	}
	uid, err := engine.NewUniqueID(opts)
	if err != nil {
		return fail(name, nil, err)
	}
	copy(unsafe.Slice((*byte)(unsafe.Pointer(id)), len(uid)), uid[:])
	return resSuccess
}

//export capi_CommInitRank
func capi_CommInitRank(commOK C.int, out *C.uintptr_t, nranks C.int, id *C.char, rank C.int) (rc C.int) {
	const name = "gocollCommInitRank"
	defer guard(name, &rc)
	return initRank(name, commOK, out, nranks, id, rank, nil)
}

//export capi_CommInitRankConfig
func capi_CommInitRankConfig(commOK C.int, out *C.uintptr_t, nranks C.int, id *C.char, rank C.int, cfg *C.gocollConfig_t) (rc C.int) {
	const name = "gocollCommInitRankConfig"
	defer guard(name, &rc)
	return initRank(name, commOK, out, nranks, id, rank, cfg)
}

func initRank(name string, commOK C.int, out *C.uintptr_t, nranks C.int, id *C.char, rank C.int, cfg *C.gocollConfig_t) C.int {
	if commOK == 0 {
		return fail(name, nil, argErr("comm is NULL"))
	}
	if nranks < 1 || rank < 0 || rank >= nranks {
		return fail(name, nil, argErr("rank %d of %d ranks: want nranks >= 1 and 0 <= rank < nranks", rank, nranks))
	}
	var uid engine.UniqueID
	copy(uid[:], unsafe.Slice((*byte)(unsafe.Pointer(id)), len(uid)))
	opts, err := configOptions(cfg)
	if err != nil {
		return fail(name, nil, err)
	}
	c, err := engine.NewComm(uid, int(nranks), int(rank), opts)
	if err != nil {
		return fail(name, nil, err)
	}
	*out = C.uintptr_t(handles.addComm(c).h)
	return resSuccess
}

//export capi_CommInitFromEnv
func capi_CommInitFromEnv(commOK C.int, out *C.uintptr_t) (rc C.int) {
	const name = "gocollCommInitFromEnv"
	defer guard(name, &rc)
	return initFromEnv(name, commOK, out, nil)
}

//export capi_CommInitFromEnvConfig
func capi_CommInitFromEnvConfig(commOK C.int, out *C.uintptr_t, cfg *C.gocollConfig_t) (rc C.int) {
	const name = "gocollCommInitFromEnvConfig"
	defer guard(name, &rc)
	return initFromEnv(name, commOK, out, cfg)
}

func initFromEnv(name string, commOK C.int, out *C.uintptr_t, cfg *C.gocollConfig_t) C.int {
	if commOK == 0 {
		return fail(name, nil, argErr("comm is NULL"))
	}
	opts, err := configOptions(cfg)
	if err != nil {
		return fail(name, nil, err)
	}
	c, err := engine.NewCommFromEnv(opts)
	if err != nil {
		return fail(name, nil, err)
	}
	*out = C.uintptr_t(handles.addComm(c).h)
	return resSuccess
}

// call is the body of an entry point on a communicator: find the handle,
// run f, and turn its error (recorded on the communicator) into a result
// code.
func call(name string, comm C.uintptr_t, f func(cs *commState) error) (rc C.int) {
	defer guard(name, &rc)
	cs, err := handles.comm(uintptr(comm))
	if err != nil {
		return fail(name, nil, err)
	}
	if err := f(cs); err != nil {
		return fail(name, cs, err)
	}
	return resSuccess
}

// putInt hands v to the C caller through out; ok says the caller's
// pointer (named what) is not NULL.
func putInt(ok bool, out *C.int, what string, v int) error {
	if !ok {
		return argErr("%s is NULL", what)
	}
	*out = C.int(v)
	return nil
}

//export capi_CommSplit
func capi_CommSplit(comm C.uintptr_t, color, key C.int, newOK C.int, out *C.uintptr_t) C.int {
	return call("gocollCommSplit", comm, func(cs *commState) error {
		if newOK == 0 {
			return argErr("newcomm is NULL")
		}
		child, err := cs.c.Split(int(color), int(key))
		if err != nil {
			return err
		}
		*out = 0
		if child != nil {
			*out = C.uintptr_t(handles.addComm(child).h)
		}
		return nil
	})
}

//export capi_CommDestroy
func capi_CommDestroy(comm C.uintptr_t) (rc C.int) {
	const name = "gocollCommDestroy"
	defer guard(name, &rc)
	cs, err := handles.takeComm(uintptr(comm))
	if err != nil {
		return fail(name, nil, err)
	}
	err = cs.c.Destroy()
	cs.close()
	if err != nil {
		return fail(name, nil, err)
	}
	return resSuccess
}

//export capi_CommAbort
func capi_CommAbort(comm C.uintptr_t) (rc C.int) {
	const name = "gocollCommAbort"
	defer guard(name, &rc)
	cs, err := handles.takeComm(uintptr(comm))
	if err != nil {
		return fail(name, nil, err)
	}
	cs.c.Abort()
	// After Abort the pending operations fail at once, so Destroy only
	// releases resources; its error (connections already broken) is moot.
	_ = cs.c.Destroy()
	cs.close()
	return resSuccess
}

//export capi_CommCount
func capi_CommCount(comm C.uintptr_t, count *C.int) C.int {
	return call("gocollCommCount", comm, func(cs *commState) error {
		return putInt(count != nil, count, "count", cs.c.Size())
	})
}

//export capi_CommUserRank
func capi_CommUserRank(comm C.uintptr_t, rank *C.int) C.int {
	return call("gocollCommUserRank", comm, func(cs *commState) error {
		return putInt(rank != nil, rank, "rank", cs.c.Rank())
	})
}

//export capi_CommGetTopology
func capi_CommGetTopology(comm C.uintptr_t, buf *C.char, length C.size_t, needed *C.size_t) C.int {
	return call("gocollCommGetTopology", comm, func(cs *commState) error {
		text, err := cs.c.Topology()
		if err != nil {
			return err
		}
		return putText(text, buf, length, needed)
	})
}

//export capi_CommDumpState
func capi_CommDumpState(comm C.uintptr_t, path *C.char, length C.size_t) C.int {
	return call("gocollCommDumpState", comm, func(cs *commState) error {
		if path == nil && length != 0 {
			return argErr("path is NULL but len is %d", uint64(length))
		}
		file, err := cs.c.DumpStateFile()
		if err != nil {
			return err
		}
		if path == nil {
			return nil
		}
		if uint64(length) < uint64(len(file)+1) {
			return argErr("path holds %d bytes; %s needs %d (with its NUL); the dump was written", uint64(length), file, len(file)+1)
		}
		out := unsafe.Slice((*byte)(unsafe.Pointer(path)), len(file)+1)
		copy(out, file)
		out[len(file)] = 0
		return nil
	})
}

// putText hands JSON text to C: *needed gets its size with the NUL (when
// needed is not NULL); buf NULL with len 0 asks for the size only; text
// that does not fit is an error (nothing is written to buf).
func putText(text []byte, buf *C.char, length C.size_t, needed *C.size_t) error {
	if buf == nil && length != 0 {
		return argErr("buf is NULL but len is %d", uint64(length))
	}
	if needed != nil {
		*needed = C.size_t(len(text) + 1)
	}
	if buf == nil {
		if needed == nil {
			return argErr("buf and needed are both NULL")
		}
		return nil
	}
	if uint64(length) < uint64(len(text)+1) {
		return argErr("buf holds %d bytes; the text needs %d (with its NUL)", uint64(length), len(text)+1)
	}
	out := unsafe.Slice((*byte)(unsafe.Pointer(buf)), len(text)+1)
	copy(out, text)
	out[len(text)] = 0
	return nil
}

//export capi_CommGetAsyncError
func capi_CommGetAsyncError(comm C.uintptr_t, outOK C.int, code *C.int) C.int {
	return call("gocollCommGetAsyncError", comm, func(cs *commState) error {
		return putInt(outOK != 0, code, "asyncError", resultCode(cs.c.AsyncError()))
	})
}

// ---------------------------------------------------------------------------
// Memory

//export capi_MemAlloc
func capi_MemAlloc(ptrOK C.int, out *unsafe.Pointer, size C.size_t, comm C.uintptr_t) C.int {
	return call("gocollMemAlloc", comm, func(cs *commState) error {
		if ptrOK == 0 {
			return argErr("ptr is NULL")
		}
		if size == 0 || size > maxBytes {
			return argErr("allocation size %d", uint64(size))
		}
		b, err := cs.c.MemAlloc(int(size))
		if err != nil {
			return err
		}
		p := unsafe.Pointer(unsafe.SliceData(b))
		handles.addAlloc(uintptr(p), alloc{c: cs.c, b: b})
		*out = p
		return nil
	})
}

//export capi_MemFree
func capi_MemFree(ptr unsafe.Pointer, comm C.uintptr_t) (rc C.int) {
	const name = "gocollMemFree"
	defer guard(name, &rc)
	cs, _ := handles.comm(uintptr(comm)) // only to record the error on; may be gone
	if ptr == nil {
		return fail(name, cs, argErr("ptr is NULL"))
	}
	a, err := handles.takeAlloc(uintptr(ptr))
	if err != nil {
		return fail(name, cs, err)
	}
	if err := a.c.MemFree(a.b); err != nil {
		return fail(name, cs, err)
	}
	return resSuccess
}

// ---------------------------------------------------------------------------
// Collectives

// collective is the shared body of every collective entry point: find the
// communicator and let issue convert the C arguments and call the engine's
// blocking form, or its non-blocking one (nb), whose request becomes a
// handle. issue calls the engine's plain forms rather than building an
// engine.Op: an Op holds a whole request, and handing it back through issue
// cost two copies of it, a few percent of a small call.
func collective(name string, comm C.uintptr_t, nonBlocking, reqOK C.int, out *C.uintptr_t,
	issue func(c *engine.Comm, nb bool) (*engine.Request, error)) (rc C.int) {
	defer guard(name, &rc)
	cs, err := handles.comm(uintptr(comm))
	if err != nil {
		return fail(name, nil, err)
	}
	if nonBlocking != 0 && reqOK == 0 {
		return fail(name, cs, argErr("request is NULL"))
	}
	// Blocking calls run inline: no hand-off to the communicator's
	// goroutine, which costs two thread wake-ups from a C thread.
	r, err := issue(cs.c, nonBlocking != 0)
	if err != nil {
		return fail(name, cs, err)
	}
	if nonBlocking != 0 {
		*out = C.uintptr_t(handles.addRequest(r, cs, name))
	}
	return resSuccess
}

// issueOp runs o, or starts it (nb): for the calls whose engine forms
// differ in more than blocking (a receive from any source reports its
// sender through got).
func issueOp(o engine.Op, nb bool) (*engine.Request, error) {
	if nb {
		return o.Start()
	}
	return nil, o.Run()
}

// datatype checks a gocollDataType_t (the byte sizes below need it).
func datatype(dt C.int) (engine.DataType, error) {
	t := engine.DataType(dt)
	if !t.Valid() {
		return t, argErr("unknown datatype %d", int(dt))
	}
	return t, nil
}

// buffer views count*mult elements of dt at p as a byte slice (C memory;
// nothing is copied). NULL is accepted for an empty buffer.
func buffer(what string, p unsafe.Pointer, count C.size_t, mult int, dt engine.DataType) ([]byte, error) {
	hi, n := bits.Mul64(uint64(count), uint64(mult*dt.Size()))
	if hi != 0 || n > maxBytes {
		return nil, argErr("%s: %d elements of %s (x%d) do not fit in memory", what, uint64(count), dt, mult)
	}
	if n == 0 {
		return nil, nil
	}
	if p == nil {
		return nil, argErr("%s is NULL but must hold %d elements of %s", what, uint64(count)*uint64(mult), dt)
	}
	return unsafe.Slice((*byte)(p), int(n)), nil
}

// elems converts an element count to int, rejecting values no buffer can
// hold. The argument is named prefix+name, joined only for the error (an
// alltoallv checks 2n counts per call).
func elems(prefix, name string, count C.size_t) (int, error) {
	if uint64(count) > maxBytes {
		return 0, argErr("%s%s %d is too large", prefix, name, uint64(count))
	}
	return int(count), nil
}

//export capi_AllReduce
func capi_AllReduce(send, recv unsafe.Pointer, count C.size_t, dtype, op C.int, comm C.uintptr_t, nb, reqOK C.int, out *C.uintptr_t) C.int {
	name := pick(nb, "gocollAllReduce", "gocollIAllReduce")
	return collective(name, comm, nb, reqOK, out, func(c *engine.Comm, nb bool) (*engine.Request, error) {
		dt, err := datatype(dtype)
		if err != nil {
			return nil, err
		}
		sb, err := buffer("sendbuff", send, count, 1, dt)
		if err != nil {
			return nil, err
		}
		rb, err := buffer("recvbuff", recv, count, 1, dt)
		if err != nil {
			return nil, err
		}
		if nb {
			return c.IAllReduce(sb, rb, int(count), dt, engine.RedOp(op))
		}
		return nil, c.AllReduce(sb, rb, int(count), dt, engine.RedOp(op))
	})
}

//export capi_Reduce
func capi_Reduce(send, recv unsafe.Pointer, count C.size_t, dtype, op, root C.int, comm C.uintptr_t, nb, reqOK C.int, out *C.uintptr_t) C.int {
	name := pick(nb, "gocollReduce", "gocollIReduce")
	return collective(name, comm, nb, reqOK, out, func(c *engine.Comm, nb bool) (*engine.Request, error) {
		dt, err := datatype(dtype)
		if err != nil {
			return nil, err
		}
		sb, err := buffer("sendbuff", send, count, 1, dt)
		if err != nil {
			return nil, err
		}
		var rb []byte
		if int(root) == c.Rank() || recv != nil { // recvbuff is only used on the root
			if rb, err = buffer("recvbuff", recv, count, 1, dt); err != nil {
				return nil, err
			}
		}
		if nb {
			return c.IReduce(sb, rb, int(count), dt, engine.RedOp(op), int(root))
		}
		return nil, c.Reduce(sb, rb, int(count), dt, engine.RedOp(op), int(root))
	})
}

//export capi_Broadcast
func capi_Broadcast(send, recv unsafe.Pointer, count C.size_t, dtype, root C.int, comm C.uintptr_t, nb, reqOK C.int, out *C.uintptr_t) C.int {
	name := pick(nb, "gocollBroadcast", "gocollIBroadcast")
	return collective(name, comm, nb, reqOK, out, func(c *engine.Comm, nb bool) (*engine.Request, error) {
		dt, err := datatype(dtype)
		if err != nil {
			return nil, err
		}
		var sb []byte
		if int(root) == c.Rank() || send != nil { // sendbuff is only read on the root
			if sb, err = buffer("sendbuff", send, count, 1, dt); err != nil {
				return nil, err
			}
		}
		rb, err := buffer("recvbuff", recv, count, 1, dt)
		if err != nil {
			return nil, err
		}
		if nb {
			return c.IBroadcast(sb, rb, int(count), dt, int(root))
		}
		return nil, c.Broadcast(sb, rb, int(count), dt, int(root))
	})
}

//export capi_AllGather
func capi_AllGather(send, recv unsafe.Pointer, sendcount C.size_t, dtype C.int, comm C.uintptr_t, nb, reqOK C.int, out *C.uintptr_t) C.int {
	name := pick(nb, "gocollAllGather", "gocollIAllGather")
	return collective(name, comm, nb, reqOK, out, func(c *engine.Comm, nb bool) (*engine.Request, error) {
		dt, err := datatype(dtype)
		if err != nil {
			return nil, err
		}
		sb, err := buffer("sendbuff", send, sendcount, 1, dt)
		if err != nil {
			return nil, err
		}
		rb, err := buffer("recvbuff", recv, sendcount, c.Size(), dt)
		if err != nil {
			return nil, err
		}
		if nb {
			return c.IAllGather(sb, rb, int(sendcount), dt)
		}
		return nil, c.AllGather(sb, rb, int(sendcount), dt)
	})
}

//export capi_ReduceScatter
func capi_ReduceScatter(send, recv unsafe.Pointer, recvcount C.size_t, dtype, op C.int, comm C.uintptr_t, nb, reqOK C.int, out *C.uintptr_t) C.int {
	name := pick(nb, "gocollReduceScatter", "gocollIReduceScatter")
	return collective(name, comm, nb, reqOK, out, func(c *engine.Comm, nb bool) (*engine.Request, error) {
		dt, err := datatype(dtype)
		if err != nil {
			return nil, err
		}
		sb, err := buffer("sendbuff", send, recvcount, c.Size(), dt)
		if err != nil {
			return nil, err
		}
		rb, err := buffer("recvbuff", recv, recvcount, 1, dt)
		if err != nil {
			return nil, err
		}
		if nb {
			return c.IReduceScatter(sb, rb, int(recvcount), dt, engine.RedOp(op))
		}
		return nil, c.ReduceScatter(sb, rb, int(recvcount), dt, engine.RedOp(op))
	})
}

//export capi_AllToAll
func capi_AllToAll(send, recv unsafe.Pointer, count C.size_t, dtype C.int, comm C.uintptr_t, nb, reqOK C.int, out *C.uintptr_t) C.int {
	name := pick(nb, "gocollAllToAll", "gocollIAllToAll")
	return collective(name, comm, nb, reqOK, out, func(c *engine.Comm, nb bool) (*engine.Request, error) {
		dt, err := datatype(dtype)
		if err != nil {
			return nil, err
		}
		sb, err := buffer("sendbuff", send, count, c.Size(), dt)
		if err != nil {
			return nil, err
		}
		rb, err := buffer("recvbuff", recv, count, c.Size(), dt)
		if err != nil {
			return nil, err
		}
		if nb {
			return c.IAllToAll(sb, rb, int(count), dt)
		}
		return nil, c.AllToAll(sb, rb, int(count), dt)
	})
}

// vlayout copies a counts/displacements pair of C arrays (len(cs) entries
// each) into cs and ds, which must be zero, and returns the number of
// elements the buffer must span. A displacement that goes with a zero
// count is ignored (left 0), as in MPI.
func vlayout(what string, counts, displs *C.size_t, cs, ds []int) (span C.size_t, err error) {
	n := len(cs)
	if counts == nil || displs == nil {
		return 0, argErr("%scounts or %sdispls is NULL", what, what[:1])
	}
	cc := unsafe.Slice(counts, n)
	dd := unsafe.Slice(displs, n)
	for i := range n {
		if cs[i], err = elems(what, "counts entry", cc[i]); err != nil {
			return 0, err
		}
		if cs[i] == 0 {
			continue
		}
		if ds[i], err = elems(what[:1], "displs entry", dd[i]); err != nil {
			return 0, err
		}
		span = max(span, C.size_t(ds[i]+cs[i]))
	}
	return span, nil
}

//export capi_AllToAllv
func capi_AllToAllv(send unsafe.Pointer, sendcounts, sdispls *C.size_t, recv unsafe.Pointer, recvcounts, rdispls *C.size_t,
	dtype C.int, comm C.uintptr_t, nb, reqOK C.int, out *C.uintptr_t) C.int {
	name := pick(nb, "gocollAllToAllv", "gocollIAllToAllv")
	return collective(name, comm, nb, reqOK, out, func(c *engine.Comm, nb bool) (*engine.Request, error) {
		dt, err := datatype(dtype)
		if err != nil {
			return nil, err
		}
		n := c.Size()
		// The four lists are read during the call only, also by the
		// non-blocking form: up to 8 ranks they stay on the stack.
		var small [4 * 8]int
		var v []int
		if 4*n <= len(small) {
			v = small[:4*n]
		} else {
			v = make([]int, 4*n) // (one allocation for the four lists)
		}
		sc, sd, rc, rd := v[:n:n], v[n:2*n:2*n], v[2*n:3*n:3*n], v[3*n:]
		sspan, err := vlayout("send", sendcounts, sdispls, sc, sd)
		if err != nil {
			return nil, err
		}
		rspan, err := vlayout("recv", recvcounts, rdispls, rc, rd)
		if err != nil {
			return nil, err
		}
		sb, err := buffer("sendbuff", send, sspan, 1, dt)
		if err != nil {
			return nil, err
		}
		rb, err := buffer("recvbuff", recv, rspan, 1, dt)
		if err != nil {
			return nil, err
		}
		if nb {
			return c.IAllToAllv(sb, sc, sd, rb, rc, rd, dt)
		}
		return nil, c.AllToAllv(sb, sc, sd, rb, rc, rd, dt)
	})
}

//export capi_SendRecv
func capi_SendRecv(isSend C.int, buf unsafe.Pointer, count C.size_t, dtype, peer, tag C.int, comm C.uintptr_t, nb, reqOK C.int, out *C.uintptr_t) C.int {
	var name string
	if isSend != 0 {
		name = pick(nb, "gocollSend", "gocollISend")
	} else {
		name = pick(nb, "gocollRecv", "gocollIRecv")
	}
	if tag != 0 {
		name += "Tag"
	}
	return collective(name, comm, nb, reqOK, out, func(c *engine.Comm, nb bool) (*engine.Request, error) {
		dt, err := datatype(dtype)
		if err != nil {
			return nil, err
		}
		what := "recvbuff"
		if isSend != 0 {
			what = "sendbuff"
		}
		b, err := buffer(what, buf, count, 1, dt)
		if err != nil {
			return nil, err
		}
		if isSend != 0 {
			return issueOp(c.SendTagOp(b, int(count), dt, int(peer), int(tag)), nb)
		}
		if peer == anySource {
			return issueOp(c.RecvAnyOp(b, int(count), dt, int(tag), nil), nb)
		}
		return issueOp(c.RecvTagOp(b, int(count), dt, int(peer), int(tag)), nb)
	})
}

// anySource is GOCOLL_ANY_SOURCE.
const anySource = engine.AnySource

//export capi_RecvAny
func capi_RecvAny(buf unsafe.Pointer, count C.size_t, dtype, tag C.int, source *C.int, comm C.uintptr_t, nb, reqOK C.int, out *C.uintptr_t) C.int {
	name := pick(nb, "gocollRecvAny", "gocollIRecvAny")
	return collective(name, comm, nb, reqOK, out, func(c *engine.Comm, nb bool) (*engine.Request, error) {
		dt, err := datatype(dtype)
		if err != nil {
			return nil, err
		}
		b, err := buffer("recvbuff", buf, count, 1, dt)
		if err != nil {
			return nil, err
		}
		var got func(int)
		if source != nil {
			got = func(s int) { *source = C.int(s) }
		}
		return issueOp(c.RecvAnyOp(b, int(count), dt, int(tag), got), nb)
	})
}

//export capi_Barrier
func capi_Barrier(comm C.uintptr_t, nb, reqOK C.int, out *C.uintptr_t) C.int {
	name := pick(nb, "gocollBarrier", "gocollIBarrier")
	return collective(name, comm, nb, reqOK, out, func(c *engine.Comm, nb bool) (*engine.Request, error) {
		if nb {
			return c.IBarrier()
		}
		return nil, c.Barrier()
	})
}

func pick(nb C.int, blocking, nonBlocking string) string {
	if nb != 0 {
		return nonBlocking
	}
	return blocking
}

// ---------------------------------------------------------------------------
// Requests

//export capi_Test
func capi_Test(req C.uintptr_t, done *C.int) (rc C.int) {
	const name = "gocollTest"
	defer guard(name, &rc)
	return test(name, req, 0, done)
}

//export capi_WaitTimeout
func capi_WaitTimeout(req C.uintptr_t, timeoutMs C.int, done *C.int) (rc C.int) {
	const name = "gocollWaitTimeout"
	defer guard(name, &rc)
	if timeoutMs < 0 {
		return fail(name, nil, argErr("timeout_ms %d is negative", int(timeoutMs)))
	}
	return test(name, req, time.Duration(timeoutMs)*time.Millisecond, done)
}

// test is gocollTest after waiting up to wait for the request.
func test(name string, req C.uintptr_t, wait time.Duration, done *C.int) C.int {
	if done == nil {
		return fail(name, nil, argErr("done is NULL"))
	}
	rs, err := handles.request(uintptr(req))
	if err != nil {
		return fail(name, nil, err)
	}
	if wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-rs.r.Done():
		case <-t.C:
		}
		t.Stop()
	}
	finished, opErr := rs.r.Test()
	if !finished {
		return resSuccess
	}
	// Free it; if another thread freed it meanwhile, that thread owns the result.
	if _, err := handles.takeRequest(uintptr(req)); err != nil {
		return fail(name, nil, err)
	}
	*done = 1
	if opErr != nil {
		return fail(name+" ("+rs.name+")", rs.comm, opErr)
	}
	return resSuccess
}

//export capi_Wait
func capi_Wait(req C.uintptr_t) (rc C.int) {
	const name = "gocollWait"
	defer guard(name, &rc)
	rs, err := handles.takeRequest(uintptr(req))
	if err != nil {
		return fail(name, nil, err)
	}
	if err := rs.r.Wait(); err != nil {
		return fail(name+" ("+rs.name+")", rs.comm, err)
	}
	return resSuccess
}
