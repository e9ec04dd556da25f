// Package shmcoll runs collectives among the ranks of a communicator that
// all live on one host by reading each other's data in shared memory
// directly, instead of exchanging messages.
//
// # Segments
//
// Each rank creates one segment in an anonymous memory file (memfd_create,
// Create), and maps every peer's (Connect), opened through
// /proc/<pid>/fd/<fd> with a check of its inode. The file has no name, so
// nothing of it outlives the processes that map it, even when they are
// killed in the middle of setup. A segment holds a header page
// (identity, state, abort reason), a synchronisation page (this rank's
// arrival counter with the record of its current call, and the count of
// peers sleeping on it, on separate cache lines), and two data slots of
// SlotBytes each: buffer sets 0 and 1. The pages are allocated and touched at
// Create (shared memory has no huge pages; first-touch faults would
// otherwise land in the first collectives), and up to populateRanks ranks
// every rank maps its peers' segments populated too; beyond, peers' pages
// enter a rank's page tables as it reads them. Once every rank connected, the
// engine calls Release, which closes the descriptor peers opened.
//
// # Barriers
//
// Every step boundary is a barrier: a rank stores the phase number into
// its arrival counter and waits until every peer's counter reached it
// (shmsync.Policy.Await: spin, yield, then a process-shared futex; the
// arriving rank wakes only if someone registered as sleeping). Because a
// rank passes phase P only after everyone arrived at P, counters never
// differ by more than one, so each rank keeps two call records, for even and
// odd phases, next to its counter.
//
// Broadcast's barrier is the one exception (barrierFrom): the non-roots
// wait only for the root, and the root for nobody, so a broadcast that
// fits a slot returns on the root at once. A rank that passed a barrier
// without waiting for everyone settles before it next publishes a phase or
// writes a slot: it waits until every peer arrived at that barrier and
// checks their records of it. That keeps the invariant above at every
// point where it matters (no rank overwrites a record or a slot a peer may
// still read), and a mismatch the root could not see is reported by its
// next call. With more ranks than cores this spares a broadcast's root a
// wait for ranks that are not even scheduled.
//
// A record is (Seq, Sig, byte count, descriptor of collective, type, op and
// root). At every barrier a rank compares each peer's record for that phase
// with its own; any difference fails the call with an error wrapping
// transport.ErrMismatch. Sig is the engine's fingerprint and already covers
// the count, but the byte count and descriptor are compared as well, so
// that two ranks can never disagree on the number of pieces (and thus of
// phases) without noticing at their first barrier.
//
// # Double buffering
//
// Data moves in pieces of at most one slot, and consecutive pieces
// (across calls too) use the two buffer sets alternately. A piece writes a
// rank's own slot only before its first barrier (copy-in) or, after it, only
// the region no peer reads in that piece; peers read it only after that
// barrier and before the first barrier of the next piece. So the slot of
// set s is rewritten (piece p+2) only after every peer passed the first
// barrier of piece p+1, i.e. finished reading piece p: no call needs a
// barrier at its end. When each rank has a core, copies into a slot keep
// the lines in the cache for the peers that read them next (copyIn: Go's
// memmove would store 1 MiB or more non-temporally, to memory; measured in
// docs/tuning.md, cachedBlock). Broadcast's root, whose slot every peer
// reads, does so at any number of ranks.
//
// # Algorithms and determinism
//
// Every element of a reduction is combined in rank order 0, 1, …, n-1,
// ((x0 op x1) op x2) …, on every path, and computed once: results are
// bitwise identical on every rank, from run to run, and between the small
// and large paths and across collectives (AllReduce equals ReduceScatter
// followed by AllGather, and Reduce followed by Broadcast, bit for bit).
// Avg sums and then divides once with kernel.DivideBy.
//
//   - AllReduce while n × bytes <= 64 KiB: copy in, one barrier, every rank
//     folds all n slots into recv.
//   - AllReduce, larger: per piece, copy in everything but the own chunk,
//     barrier, rank r folds chunk r (its own part straight from send) into
//     its slot and recv, barrier, everyone copies the other chunks out of
//     their owners' slots (reduce-scatter + all-gather through shared
//     memory). Chunks are cache-line aligned; the fold runs in cache-sized
//     blocks so a chunk is read from memory once, and each block reaches
//     recv straight from L1. Measured, the one-barrier path wins below
//     n × bytes ≈ 64 KiB, the two-barrier one above.
//   - Reduce: the same, with only the root copying out (small: only the
//     root folds).
//   - Broadcast: the root copies into its slot, publishes it, and goes on;
//     the others wait for it and copy out (see Barriers).
//   - AllGather: copy in, barrier, everyone copies every block out.
//   - ReduceScatter: copy in the blocks for the others, barrier, rank r
//     folds block r of every slot into recv (one barrier per piece).
//   - AllToAll: copy in the blocks for the others, barrier, everyone copies
//     its block out of every peer's slot.
//   - AllToAllv: the same with blocks of any size: each slot has a column
//     per rank, and each column a cache line of the owner's block sizes in
//     the segment's sizes area after the slots (the peers check theirs
//     against it before they copy anything, and agree on the number of
//     pieces from it; alltoallv.go).
//
// # Registered buffers
//
// Alloc returns memory in a file of its own that peers can map. When the
// send buffer of AllReduce or Reduce (two-barrier path), ReduceScatter
// (from 64 KiB per block), AllGather (from 64 KiB per block), AllToAll (from
// 64 KiB per block, not in place) or the root's buf of Broadcast (from
// 64 KiB) lies in such memory, its owner skips the copy into its slot and
// publishes (allocation id, offset) in its call record; peers map the
// allocation on first sight (once; dropped when its owner frees it) and
// read it in place: the data moves once instead of twice. The file is a
// memory file with no name, like the segment. ReduceScatter, AllGather,
// AllToAll and Broadcast then add a closing barrier (all ranks see the same
// records, so all agree), since the peers' reads of a send buffer must end
// before its owner returns; Broadcast from registered memory copies the
// whole buffer between its first and its closing barrier, in one piece.
//
// Reading in place saves a copy of every byte (docs/performance.md
// compares plain and registered buffers). Splitting unregistered pieces
// into 16-256 KiB
// fragments (a barrier each, so that copy-in of fragment k+1 overlaps
// copy-out of fragment k) gained nothing measurable: in back-to-back calls
// the root's copy-in of the next piece or call already overlaps the
// readers' copy-out, and AllGather and AllToAll keep every rank busy with
// both copies anyway; the extra barriers and losing the non-temporal stores
// of large copies cost as much as the overlap won.
//
// An AllReduce whose recv lies in registered memory (from 64 KiB per rank)
// folds the own chunk straight into recv instead of into the slot and
// recv, and publishes recv at the second barrier; peers copy that chunk of
// the result out of it in place, and the call ends with the closing
// barrier. Reduce's root always folds straight into recv, as no peer reads
// its chunk. Either way the own chunk's result is written once, not twice.
//
// # Cross-memory reads
//
// A send buffer that is not registered memory can still be read in place:
// its owner publishes its address in the call record, and peers copy out
// of the owner's process with process_vm_readv ("CMA", as Open MPI's vader
// BTL does), one copy instead of the copy into the slot and the copy out.
// Every rank probes every peer at Connect (reading the peer's header
// through the peer's own mapping of it) and publishes the result; at the
// first barrier all ranks turn CMA on only if all probes succeeded, so a
// seccomp profile that forbids the call (Docker's default) or
// Config.NoCMA on any rank leaves everything on the slots. With CMA on,
// AllGather, AllToAll (not in place), AllToAllv and a 2-rank Broadcast may
// publish addresses when a peer's part of the piece is at least cmaFloor
// (8 KiB), and whether they do is measured, not set: the ranks time their
// calls per operation and size class at every rank count, and every rank
// follows one leader's vote, carried in its call record (choosePath; see
// docs/tuning.md). The answer depends on how far apart the cores are,
// how many ranks share a core and how the kernel pins pages, which on a VM
// changes while a job runs. These calls then close with the barrier
// registered buffers need. A 2-rank Broadcast's peer publishes its address
// too, and the root, idle otherwise, writes the second half into it with
// process_vm_writev while the peer reads the first (the store gate in the
// peer's segment keeps a failing peer from returning while the root
// writes). One copy instead of two took a 2-rank 1 MiB AllGather, AllToAll
// or Broadcast to about half its time (docs/performance.md). A 2-rank
// AllReduce may go by cross-memory copies too, chosen the same way
// (reduceDirect): both ranks publish send and recv, each reads the peer's
// part of its chunk block by block, folds it and writes the result into
// the peer's recv under the same store gate; its path is part of the
// compared record, since the two paths meet at different barriers. Not
// used: Broadcast with more than one reader (each reader's kernel copy
// pins the owner's pages; the owner's one copy into the shared slot served
// all readers better in every case measured) and the reductions with more
// than 2 ranks (an AllReduce that copies peers' chunks out of their
// processes was slower at 4).
//
// # Waiting
//
// shmsync.PolicyFor(Size): with a core per rank, a few µs of polling, then
// yielding (16 times and 100 µs), then the futex; with ranks sharing
// cores, yielding almost at once (100 times and 200 µs), unless the ranks'
// processes are in different scheduler groups (shmsync.PolicyAmong: each in
// its own session, say), where a yield cannot reach the peer and they go
// to the futex after polling. With a core per rank, a caller locked to its
// thread that finds itself sharing a core with the peers it waits for
// moves to another CPU (shmsync.Coloc). A yield is
// sched_yield plus runtime.Gosched, except for callers locked to their
// thread (Call.Locked: every call entering Go from C), where each Gosched
// hands the thread's P to another thread and back, which cost a small
// call many times its own time. Nothing on the call path allocates, the slow paths included
// (liveness probes read /proc without allocating).
//
// # Failures
//
// Every wait honours the context (deadline: an error wrapping
// context.DeadlineExceeded that names the rank waited for), a local Abort or
// Close, every peer's segment state (aborted, with origin and reason, or
// closed) and, every 100 ms of sleeping, the liveness of every peer process
// (pid and start time). Any failure inside a call aborts the arena, which
// records the failure in its segment so that every peer fails too: a peer
// then reports transport.RemoteAbortError (ErrRemoteAbort) for an abort,
// transport.PeerLostError (ErrPeerLost) for a dead rank, and additionally
// wraps transport.ErrMismatch when the origin was a mismatch.
//
// An Arena runs one call at a time (a concurrent call fails); Abort and
// Close may come from any goroutine while a call is in flight.
package shmcoll
