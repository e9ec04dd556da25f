// Package shmsync holds the waiting and liveness primitives for ranks that
// share memory across processes on one host: a process-shared futex, the
// spin → yield → sleep policy that suits a small, often oversubscribed
// machine, and a way to tell that the process behind a peer still runs.
//
// # Waiting on a counter
//
// The unit is a 64-bit counter in shared memory that one side advances and
// the other waits on, plus a waiter count next to it (ideally on its own
// cache line). The waiter:
//
//	err := policy.Await(ctx, counter, waiters, old, check)
//
// returns as soon as counter differs from old. It first polls (Polls loads,
// then for up to Spin), then yields for up to Yield (sched_yield, for other
// processes, and runtime.Gosched when the parties include goroutines of
// this process), then sleeps on the
// futex formed by the low 32 bits of the counter for at most Sleep at a time,
// having incremented waiters. Before every sleep it re-checks the counter,
// the context (cancellation and deadline) and the caller's check function
// (abort flags, peer liveness).
//
// The side that advances the counter calls Notify after storing the new
// value: it issues FUTEX_WAKE only when a waiter registered, so the fast
// path makes no system call. Because both sides use sequentially consistent
// atomics (store counter, load waiters / increment waiters, load counter), a
// waiter either sees the new value before it sleeps or is woken.
//
// The futex is the process-shared form (no FUTEX_PRIVATE_FLAG): the kernel
// keys it by the mapped file page, so waiters in other processes, and other
// mappings of the same file in this process, meet on it.
//
// # Why these defaults
//
// A futex wake costs more than a small collective, so when every rank has
// a core, polling briefly and then yielding for a while before sleeping
// pays. When ranks outnumber cores (or other work keeps the cores busy),
// spinning only delays the rank that has to run: long PAUSE spins and
// time-based spins both made barriers far slower than yielding; yielding
// early (which hands the core to a rank with work) and then sleeping on the
// futex kept barriers cheap in both cases. PolicyFor picks the amounts.
//
// A yield hands the core over only to a task of the yielder's own
// scheduler group. Ranks launched each in its own session (setsid, ssh, some
// launchers) are each their own group when the kernel groups by session
// (autogrouping), and ranks in different cgroups likewise: oversubscribed,
// a yielding rank then burns its whole time slice while the rank it waits
// for is not run (with 16 such ranks on 2 cores, a small allreduce took
// a hundred times longer). PolicyAmong reads the groups of the ranks'
// processes (SchedGroup, from /proc; of a sample of them when there are
// many) and skips yielding for such ranks:
// they poll briefly and sleep on the futex, whose wake does hand the core
// over.
//
// With a core per rank, two ranks that yield to each other can still end
// up sharing one core while the other idles, and stay so:
// each yield runs the other, so the balancer finds both cache-hot. A waiter
// locked to its thread (every call from C) that keeps seeing its peer
// arrive during yields that ran someone else (Policy.Colocation, Coloc)
// moves its thread to another CPU: it narrows its affinity mask and
// restores it. At 2 ranks and 4 KiB, some runs spent their whole time
// sharing a core before this, none after.
//
// # Liveness
//
// Proc identifies a process by pid and start time (field 22 of
// /proc/<pid>/stat), so that a recycled pid is not taken for the original
// process; Proc.Alive combines kill(pid, 0) with that check and treats a
// zombie as dead. Reading /proc allocates nothing, so a waiter may check
// liveness from an allocation-free path.
//
// # Memory files
//
// Shared memory lives in anonymous memory files (CreateMemfd), which have
// no name anywhere: nothing of them outlives the processes that hold them
// open or mapped. Another process opens one through /proc/<pid>/fd/<fd>
// (FileRef.Open, which checks the inode), which the kernel allows only to
// a process that may inspect the owner; NewProbe makes an empty one to
// find out before anything depends on it. Opener lets tests inject a
// process that may not.
package shmsync
