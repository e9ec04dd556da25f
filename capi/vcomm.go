package main

/*
#include <stdint.h>
#include <stdlib.h>
#include "gocoll.h"
*/
import "C"

import (
	"encoding/json"
	"fmt"
	"sync"
	"syscall"
	"unsafe"

	"github.com/gocoll/gocoll/engine"
	"github.com/gocoll/gocoll/vppu"
)

// vcommState is a live virtual communicator handle. Buffers that arrive
// with devices in a migration are C memory the library allocated (a
// caller may keep their pointers across calls, which Go memory would not
// allow); it frees them when their device leaves or at destroy.
type vcommState struct {
	v      *vppu.Comm
	parent *commState

	mu    sync.Mutex
	owned map[unsafe.Pointer]bool
}

func (s *vcommState) alloc(_ int, _ string, n int) ([]byte, error) {
	if n == 0 {
		return []byte{}, nil
	}
	p := C.malloc(C.size_t(n))
	if p == nil {
		return nil, fmt.Errorf("malloc of %d bytes: %w", n, syscall.ENOMEM)
	}
	s.mu.Lock()
	s.owned[p] = true
	s.mu.Unlock()
	return unsafe.Slice((*byte)(p), n), nil
}

// release frees the library's buffers no local device holds any more
// (all of them when all is set).
func (s *vcommState) release(all bool) {
	live := map[unsafe.Pointer]bool{}
	if !all {
		for _, d := range s.v.Local() {
			for _, name := range s.v.Buffers(d) {
				if b, _ := s.v.Buffer(d, name); len(b) > 0 {
					live[unsafe.Pointer(unsafe.SliceData(b))] = true
				}
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for p := range s.owned {
		if !live[p] {
			C.free(p)
			delete(s.owned, p)
		}
	}
}

// placement reads m ranks (NULL: blocks over every rank of comm).
func placement(place *C.int, m, size int) vppu.Place {
	if place == nil {
		return vppu.Block(m, size)
	}
	out := make(vppu.Place, m)
	for v, r := range unsafe.Slice(place, m) {
		out[v] = int(r)
	}
	return out
}

// logicalArg checks a create or join call's output pointer and reads its
// topology of ndev devices.
func logicalArg(out *C.uintptr_t, topo *C.char, ndev C.int) (vppu.Logical, error) {
	if out == nil || topo == nil {
		return vppu.Logical{}, argErr("vcomm or topology is NULL")
	}
	if ndev < 1 || ndev > 1<<20 {
		return vppu.Logical{}, argErr("%d virtual devices", int(ndev))
	}
	l, err := vppu.ParseLogical(C.GoString(topo), int(ndev))
	if err != nil {
		return vppu.Logical{}, argErr("%v", err)
	}
	return l, nil
}

//export capi_VCommCreate
func capi_VCommCreate(out *C.uintptr_t, comm C.uintptr_t, topo *C.char, ndev C.int, place *C.int) C.int {
	return call("gocollVCommCreate", comm, func(cs *commState) error {
		l, err := logicalArg(out, topo, ndev)
		if err != nil {
			return err
		}
		v, err := vppu.New(cs.c, l, placement(place, int(ndev), cs.c.Size()))
		if err != nil {
			return err
		}
		s := &vcommState{v: v, parent: cs, owned: map[unsafe.Pointer]bool{}}
		v.SetAlloc(s.alloc)
		*out = C.uintptr_t(handles.addVComm(s))
		return nil
	})
}

// vcall is the body of an entry point on a virtual communicator: find the
// handle, run f, and turn its error (recorded on the parent communicator)
// into a result code.
func vcall(name string, vc C.uintptr_t, f func(s *vcommState) error) (rc C.int) {
	defer guard(name, &rc)
	s, err := handles.vcomm(uintptr(vc))
	if err != nil {
		return fail(name, nil, err)
	}
	if err := f(s); err != nil {
		return fail(name, s.parent, err)
	}
	return resSuccess
}

//export capi_VCommLocal
func capi_VCommLocal(vc C.uintptr_t, devices *C.int, maxDevices C.int, n *C.int) C.int {
	return vcall("gocollVCommLocal", vc, func(s *vcommState) error {
		if n == nil || devices == nil && maxDevices > 0 {
			return argErr("n is NULL, or devices is NULL with max %d", int(maxDevices))
		}
		local := s.v.Local()
		*n = C.int(len(local))
		if len(local) > int(maxDevices) {
			return argErr("%d local devices, room for %d", len(local), int(maxDevices))
		}
		if len(local) > 0 {
			out := unsafe.Slice(devices, len(local))
			for k, d := range local {
				out[k] = C.int(d)
			}
		}
		return nil
	})
}

//export capi_VCommDeviceRank
func capi_VCommDeviceRank(vc C.uintptr_t, dev C.int, rank *C.int) C.int {
	return vcall("gocollVCommDeviceRank", vc, func(s *vcommState) error {
		place := s.v.Place()
		if rank == nil || dev < 0 || int(dev) >= len(place) {
			return argErr("device %d of %d, or rank NULL", int(dev), len(place))
		}
		*rank = C.int(place[dev])
		return nil
	})
}

//export capi_VCommGetTables
func capi_VCommGetTables(vc C.uintptr_t, buf *C.char, length C.size_t, needed *C.size_t) C.int {
	return vcall("gocollVCommGetTables", vc, func(s *vcommState) error {
		t, err := s.v.Tables()
		if err != nil {
			return err
		}
		out := struct {
			Topology string      `json:"topology"`
			Place    []int       `json:"place"`
			Local    []int       `json:"local"`
			Tables   vppu.Tables `json:"tables"`
		}{s.v.Logical().String(), s.v.Place(), s.v.Local(), t}
		if out.Local == nil {
			out.Local = []int{}
		}
		text, err := json.Marshal(out)
		if err != nil {
			return err
		}
		return putText(text, buf, length, needed)
	})
}

//export capi_VCommRegister
func capi_VCommRegister(vc C.uintptr_t, dev C.int, bufName *C.char, buf unsafe.Pointer, size C.size_t) C.int {
	return vcall("gocollVCommRegister", vc, func(s *vcommState) error {
		if bufName == nil {
			return argErr("name is NULL")
		}
		b, err := buffer("buf", buf, size, 1, engine.Uint8)
		if err != nil {
			return err
		}
		return s.v.Register(int(dev), C.GoString(bufName), b)
	})
}

//export capi_VCommGetBuffer
func capi_VCommGetBuffer(vc C.uintptr_t, dev C.int, bufName *C.char, buf *unsafe.Pointer, size *C.size_t) C.int {
	return vcall("gocollVCommGetBuffer", vc, func(s *vcommState) error {
		if bufName == nil || buf == nil || size == nil {
			return argErr("name, buf or size is NULL")
		}
		b, ok := s.v.Buffer(int(dev), C.GoString(bufName))
		if !ok {
			return argErr("device %d has no buffer %q on this rank", int(dev), C.GoString(bufName))
		}
		*buf, *size = nil, C.size_t(len(b))
		if len(b) > 0 {
			*buf = unsafe.Pointer(unsafe.SliceData(b))
		}
		return nil
	})
}

//export capi_VCommMigrate
func capi_VCommMigrate(vc C.uintptr_t, place *C.int) C.int {
	return vcall("gocollVCommMigrate", vc, func(s *vcommState) error {
		if err := s.v.Migrate(placement(place, s.v.Size(), s.parent.c.Size())); err != nil {
			return err
		}
		s.release(false)
		return nil
	})
}

//export capi_VCommRegisterShared
func capi_VCommRegisterShared(vc C.uintptr_t, bufName *C.char, buf unsafe.Pointer, size C.size_t) C.int {
	return vcall("gocollVCommRegisterShared", vc, func(s *vcommState) error {
		if bufName == nil {
			return argErr("name is NULL")
		}
		b, err := buffer("buf", buf, size, 1, engine.Uint8)
		if err != nil {
			return err
		}
		return s.v.RegisterShared(C.GoString(bufName), b)
	})
}

//export capi_VCommRecover
func capi_VCommRecover(vc C.uintptr_t, newcomm C.uintptr_t, step C.uint64_t, minRanks C.int, place *C.int, agreed *C.uint64_t) C.int {
	return vcall("gocollVCommRecover", vc, func(s *vcommState) error {
		ns, err := handles.comm(uintptr(newcomm))
		if err != nil {
			return err
		}
		if minRanks < 0 {
			return argErr("minRanks %d", int(minRanks))
		}
		opts := vppu.RecoverOptions{Step: uint64(step), MinRanks: int(minRanks)}
		if place != nil {
			opts.Place = placement(place, s.v.Size(), ns.c.Size())
		}
		rec, err := s.v.Recover(ns.c, opts)
		if err != nil {
			s.release(false) // what was staged for a commit that did not happen
			return err
		}
		s.parent = ns
		s.release(false)
		if agreed != nil {
			*agreed = C.uint64_t(rec.Step)
		}
		return nil
	})
}

//export capi_VCommJoin
func capi_VCommJoin(out *C.uintptr_t, comm C.uintptr_t, topo *C.char, ndev C.int, minRanks C.int, place *C.int, agreed *C.uint64_t) C.int {
	return call("gocollVCommJoin", comm, func(cs *commState) error {
		l, err := logicalArg(out, topo, ndev)
		if err == nil && minRanks < 0 {
			err = argErr("minRanks %d", int(minRanks))
		}
		if err != nil {
			return err
		}
		s := &vcommState{parent: cs, owned: map[unsafe.Pointer]bool{}}
		opts := vppu.RecoverOptions{MinRanks: int(minRanks), Alloc: s.alloc}
		if place != nil {
			opts.Place = placement(place, l.M, cs.c.Size())
		}
		v, rec, err := vppu.Join(cs.c, l, opts)
		if err != nil {
			s.release(true)
			return err
		}
		s.v = v
		v.SetAlloc(s.alloc)
		if agreed != nil {
			*agreed = C.uint64_t(rec.Step)
		}
		*out = C.uintptr_t(handles.addVComm(s))
		return nil
	})
}

//export capi_VCommDestroy
func capi_VCommDestroy(vc C.uintptr_t) (rc C.int) {
	const name = "gocollVCommDestroy"
	defer guard(name, &rc)
	s, err := handles.takeVComm(uintptr(vc))
	if err != nil {
		return fail(name, nil, err)
	}
	err = s.v.Destroy()
	s.release(true)
	if err != nil {
		return fail(name, s.parent, err)
	}
	return resSuccess
}

// devBuffers views n C pointers (one per local device) as buffers of
// count·mult elements; NULL entries (or a NULL array) are nil buffers,
// which the virtual collective rejects where it needs them.
func devBuffers(what string, arr unsafe.Pointer, n int, count C.size_t, mult int, dt engine.DataType) ([][]byte, error) {
	out := make([][]byte, n)
	if arr == nil || n == 0 {
		return out, nil
	}
	for k, p := range unsafe.Slice((*unsafe.Pointer)(arr), n) {
		if p == nil {
			continue
		}
		b, err := buffer(fmt.Sprintf("%s[%d]", what, k), p, count, mult, dt)
		if err != nil {
			return nil, err
		}
		out[k] = b
	}
	return out, nil
}

// joinAdjacent views buffers that lie back to back in C memory as parts of
// one slice (the first's capacity reaching to the end of the last), so
// the virtual allreduce reads them in place as it does a Go caller's
// views of one array, instead of copying them together.
func joinAdjacent(bufs [][]byte) [][]byte {
	if len(bufs) < 2 || len(bufs[0]) == 0 {
		return bufs
	}
	n := len(bufs[0])
	base := unsafe.Pointer(unsafe.SliceData(bufs[0]))
	for k, b := range bufs {
		if len(b) != n || unsafe.Pointer(unsafe.SliceData(b)) != unsafe.Add(base, k*n) {
			return bufs
		}
	}
	whole := unsafe.Slice((*byte)(base), len(bufs)*n)
	out := make([][]byte, len(bufs))
	for k := range out {
		out[k] = whole[k*n : (k+1)*n]
	}
	return out
}

// sendRecv views the arrays of send and receive buffers of n local
// devices, count·smult and count·rmult elements each.
func sendRecv(send, recv unsafe.Pointer, n int, count C.size_t, smult, rmult int, dt engine.DataType) (sb, rb [][]byte, err error) {
	if sb, err = devBuffers("sendbuffs", send, n, count, smult, dt); err != nil {
		return nil, nil, err
	}
	rb, err = devBuffers("recvbuffs", recv, n, count, rmult, dt)
	return sb, rb, err
}

// vcollective is the body of every virtual collective: find the handle,
// convert the buffers, start the call, then wait or hand back a request.
func vcollective(name string, vc C.uintptr_t, dtype C.int, nonBlocking C.int, out *C.uintptr_t,
	start func(v *vppu.Comm, dt engine.DataType, n int, queue bool) (*vppu.Request, error)) (rc C.int) {
	defer guard(name, &rc)
	s, err := handles.vcomm(uintptr(vc))
	if err != nil {
		return fail(name, nil, err)
	}
	if nonBlocking != 0 && out == nil {
		return fail(name, s.parent, argErr("request is NULL"))
	}
	dt, err := datatype(dtype)
	if err != nil {
		return fail(name, s.parent, err)
	}
	r, err := start(s.v, dt, len(s.v.Local()), nonBlocking != 0)
	if err != nil {
		return fail(name, s.parent, err)
	}
	if nonBlocking != 0 {
		*out = C.uintptr_t(handles.addRequest(r, s.parent, name))
	}
	return resSuccess
}

// blockingOr is a virtual collective's blocking form for a blocking C call,
// which runs inline on the caller's thread as the engine's blocking calls
// do (queued, it waited for the worker goroutine and for its wake-up at
// every call), and its non-blocking form otherwise.
func blockingOr(queue bool, block func() error, start func() (*vppu.Request, error)) (*vppu.Request, error) {
	if queue {
		return start()
	}
	return nil, block()
}

//export capi_VAllReduce
func capi_VAllReduce(send, recv unsafe.Pointer, count C.size_t, dtype, op C.int, vc C.uintptr_t, nb C.int, out *C.uintptr_t) C.int {
	return vcollective(pick(nb, "gocollVAllReduce", "gocollVIAllReduce"), vc, dtype, nb, out, func(v *vppu.Comm, dt engine.DataType, n int, queue bool) (*vppu.Request, error) {
		sb, rb, err := sendRecv(send, recv, n, count, 1, 1, dt)
		if err != nil {
			return nil, err
		}
		return blockingOr(queue, func() error { return v.AllReduce(joinAdjacent(sb), rb, int(count), dt, engine.RedOp(op)) }, func() (*vppu.Request, error) {
			return v.IAllReduce(joinAdjacent(sb), rb, int(count), dt, engine.RedOp(op))
		})
	})
}

//export capi_VReduce
func capi_VReduce(send, recv unsafe.Pointer, count C.size_t, dtype, op, root C.int, vc C.uintptr_t, nb C.int, out *C.uintptr_t) C.int {
	return vcollective(pick(nb, "gocollVReduce", "gocollVIReduce"), vc, dtype, nb, out, func(v *vppu.Comm, dt engine.DataType, n int, queue bool) (*vppu.Request, error) {
		sb, rb, err := sendRecv(send, recv, n, count, 1, 1, dt)
		if err != nil {
			return nil, err
		}
		return blockingOr(queue, func() error { return v.Reduce(sb, rb, int(count), dt, engine.RedOp(op), int(root)) }, func() (*vppu.Request, error) { return v.IReduce(sb, rb, int(count), dt, engine.RedOp(op), int(root)) })
	})
}

//export capi_VBroadcast
func capi_VBroadcast(send, recv unsafe.Pointer, count C.size_t, dtype, root C.int, vc C.uintptr_t, nb C.int, out *C.uintptr_t) C.int {
	return vcollective(pick(nb, "gocollVBroadcast", "gocollVIBroadcast"), vc, dtype, nb, out, func(v *vppu.Comm, dt engine.DataType, n int, queue bool) (*vppu.Request, error) {
		sb, rb, err := sendRecv(send, recv, n, count, 1, 1, dt)
		if err != nil {
			return nil, err
		}
		return blockingOr(queue, func() error { return v.Broadcast(sb, rb, int(count), dt, int(root)) }, func() (*vppu.Request, error) { return v.IBroadcast(sb, rb, int(count), dt, int(root)) })
	})
}

//export capi_VAllGather
func capi_VAllGather(send, recv unsafe.Pointer, count C.size_t, dtype C.int, vc C.uintptr_t, nb C.int, out *C.uintptr_t) C.int {
	return vcollective(pick(nb, "gocollVAllGather", "gocollVIAllGather"), vc, dtype, nb, out, func(v *vppu.Comm, dt engine.DataType, n int, queue bool) (*vppu.Request, error) {
		sb, rb, err := sendRecv(send, recv, n, count, 1, v.Size(), dt)
		if err != nil {
			return nil, err
		}
		return blockingOr(queue, func() error { return v.AllGather(sb, rb, int(count), dt) }, func() (*vppu.Request, error) { return v.IAllGather(sb, rb, int(count), dt) })
	})
}

//export capi_VReduceScatter
func capi_VReduceScatter(send, recv unsafe.Pointer, count C.size_t, dtype, op C.int, vc C.uintptr_t, nb C.int, out *C.uintptr_t) C.int {
	return vcollective(pick(nb, "gocollVReduceScatter", "gocollVIReduceScatter"), vc, dtype, nb, out, func(v *vppu.Comm, dt engine.DataType, n int, queue bool) (*vppu.Request, error) {
		sb, rb, err := sendRecv(send, recv, n, count, v.Size(), 1, dt)
		if err != nil {
			return nil, err
		}
		return blockingOr(queue, func() error { return v.ReduceScatter(sb, rb, int(count), dt, engine.RedOp(op)) }, func() (*vppu.Request, error) { return v.IReduceScatter(sb, rb, int(count), dt, engine.RedOp(op)) })
	})
}

//export capi_VAllToAll
func capi_VAllToAll(send, recv unsafe.Pointer, count C.size_t, dtype C.int, vc C.uintptr_t, nb C.int, out *C.uintptr_t) C.int {
	return vcollective(pick(nb, "gocollVAllToAll", "gocollVIAllToAll"), vc, dtype, nb, out, func(v *vppu.Comm, dt engine.DataType, n int, queue bool) (*vppu.Request, error) {
		sb, rb, err := sendRecv(send, recv, n, count, v.Size(), v.Size(), dt)
		if err != nil {
			return nil, err
		}
		return blockingOr(queue, func() error { return v.AllToAll(sb, rb, int(count), dt) }, func() (*vppu.Request, error) { return v.IAllToAll(sb, rb, int(count), dt) })
	})
}

//export capi_VBarrier
func capi_VBarrier(vc C.uintptr_t) C.int {
	return vcollective("gocollVBarrier", vc, C.int(engine.Uint8), 0, nil, func(v *vppu.Comm, _ engine.DataType, _ int, queue bool) (*vppu.Request, error) {
		return blockingOr(queue, func() error { return v.Barrier() }, func() (*vppu.Request, error) { return v.IBarrier() })
	})
}

//export capi_VRedistribute
func capi_VRedistribute(plan C.uintptr_t, src, dst unsafe.Pointer, dtype C.int, vc C.uintptr_t) (rc C.int) {
	const name = "gocollVRedistribute"
	defer guard(name, &rc)
	s, err := handles.vcomm(uintptr(vc))
	if err != nil {
		return fail(name, nil, err)
	}
	p, err := handles.plan(uintptr(plan))
	if err != nil {
		return fail(name, s.parent, err)
	}
	dt, err := datatype(dtype)
	if err != nil {
		return fail(name, s.parent, err)
	}
	local := s.v.Local()
	sb, db := make([][]byte, len(local)), make([][]byte, len(local))
	for k, v := range local {
		var ns, nd int
		if v < p.Q {
			ns = p.SrcElems(v)
		}
		if v < p.P {
			nd = p.DstElems(v)
		}
		if sb[k], err = devBuffer("srcbuffs", src, k, ns, dt); err != nil {
			return fail(name, s.parent, err)
		}
		if db[k], err = devBuffer("dstbuffs", dst, k, nd, dt); err != nil {
			return fail(name, s.parent, err)
		}
	}
	if err := s.v.Redistribute(p, sb, db, dt); err != nil {
		return fail(name, s.parent, err)
	}
	return resSuccess
}

// devBuffer views entry k of an array of per-device pointers as n elements.
func devBuffer(what string, arr unsafe.Pointer, k, n int, dt engine.DataType) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	if arr == nil {
		return nil, argErr("%s is NULL but local device %d holds %d elements", what, k, n)
	}
	p := unsafe.Slice((*unsafe.Pointer)(arr), k+1)[k]
	return buffer(fmt.Sprintf("%s[%d]", what, k), p, C.size_t(n), 1, dt)
}
