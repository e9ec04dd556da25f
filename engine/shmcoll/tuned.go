package shmcoll

// The constants that remain from measurements on one machine, in one
// place, with where they come from. Everything else about the choice
// between the slots and cross-memory copies is measured on the machine the
// job runs on (choosePath); docs/tuning.md lists this table for users.
// Provenance "EPYC" is the project's 2-vCPU VM (AMD EPYC, 2 vCPUs, a
// process per rank through the C ABI unless noted); dates are when the
// figures were taken.
const (
	// cmaFloor is the least data per peer for which a call's path is
	// chosen by timing (below, always the slots): under it the system call
	// per peer costs more than the copy it saves on every machine measured,
	// and the clock reads to time a call would be a visible part of it.
	// EPYC, 2026-11-27, 2 ranks, 16 KiB allgather: slots 0.9 µs against
	// 2.6 µs cross-memory with the cores close, 2.4 against 3.4 far.
	cmaFloor = 8 << 10

	// exploreEvery: every exploreEvery-th call of a size class tries the
	// path not agreed on, so that the leader's estimate of it stays fresh
	// (a chooser rule, not a measurement: the exploration costs at most
	// one call in exploreEvery).
	exploreEvery = 8

	// cachedBlock is copyIn's piece size with a core per rank, below
	// memmove's non-temporal threshold (1 MiB) so that a slot's lines stay
	// in the cache for the peers that read them next. EPYC, 2026-11-27,
	// goroutines, 16 MiB, 2 ranks, p50: AllReduce 2170-2230 µs in one copy
	// per chunk against 1830-1980 in 512 KiB pieces.
	cachedBlock = 512 << 10

	// AllReduce and Reduce take the one-barrier path while n × bytes <=
	// smallBytes (smallBytes2 at 2 ranks); above, the two-barrier
	// reduce-scatter path. EPYC at 64 KiB: 2 ranks 8.4 µs two-barrier
	// against 12.5 one-barrier, 4 ranks 18-20 against 34-46. smallBytes
	// also bounds where registered buffers are read in place (below, the
	// closing barrier costs more than the copy it saves).
	smallBytes = 64 << 10
	// EPYC, 2026-11-27, gocoll_bench p50, one- against two-barrier: cores
	// close 16 KiB 1.53 vs 1.47 µs, 32 KiB 3.49 vs 2.39; far 16 KiB 5.43
	// vs 4.70; below 16 KiB the one-barrier path keeps one round trip's
	// latency where the cores are close (4 KiB 0.6 µs).
	smallBytes2 = 16 << 10
)

// The leader votes for the slots only when its estimate for them is at
// least 10 % below the cross-memory one (slotsNum/slotsDen): where the two
// are about even, the vote would otherwise flip on noise (a chooser rule,
// like exploreEvery).
const slotsNum, slotsDen = 9, 10
