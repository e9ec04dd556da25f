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
	// Measured on EPYC, 2026-11-27, 2 ranks, 16 KiB allgather, cores close
	// and far (figures: docs/tuning.md).
	cmaFloor = 8 << 10

	// exploreEvery: the exploreEvery-th call of a size class tries the
	// path not agreed on, so that the leader's estimate of it stays fresh,
	// and again exploreEvery calls after each change of the agreed path;
	// while the agreement holds, the gap doubles after each exploration up
	// to exploreMax (pathClass.pick). Chooser rules, not measurements: the
	// exploration costs at most one call in exploreEvery, one in
	// exploreMax once the choice has been stable for a while.
	exploreEvery = 8
	exploreMax   = 64

	// cachedBlock is copyIn's piece size with a core per rank, below
	// memmove's non-temporal threshold (1 MiB) so that a slot's lines stay
	// in the cache for the peers that read them next. Measured on EPYC,
	// 2026-11-27, goroutines, 16 MiB, 2 ranks, AllReduce p50 in one copy per
	// chunk against 512 KiB pieces (docs/tuning.md).
	cachedBlock = 512 << 10

	// directBlock is reduceDirect's block: the peer's part read, folded
	// and written back while it is in the cache, so the block and the own
	// operand fit a core's L2 (1 MiB on EPYC) with room to spare. Set from
	// the cache size, not timed against other sizes (docs/tuning.md).
	directBlock = 256 << 10

	// AllReduce and Reduce take the one-barrier path while n × bytes <=
	// smallBytes (smallBytes2 at 2 ranks); above, the two-barrier
	// reduce-scatter path, which measured faster from there on EPYC at 2
	// and 4 ranks (docs/tuning.md). smallBytes also bounds where
	// registered buffers are read in place (below, the closing barrier
	// costs more than the copy it saves).
	smallBytes = 64 << 10
	// EPYC, 2026-11-27, gocoll_bench p50, one- against two-barrier, cores
	// close and far (docs/tuning.md): below 16 KiB the one-barrier path
	// keeps one round trip's latency where the cores are close.
	smallBytes2 = 16 << 10

	// chainPieces is how many pieces ChainAllReduce cuts a vector into:
	// the second rank folds piece t while the first folds piece t+1, so
	// the call takes about (pieces+1)/pieces of one rank's folds, and each
	// piece adds a barrier. EPYC, 2026-11-28, goroutines, 8 devices of
	// 814 KiB on 2 ranks: 4 pieces against 8 (docs/tuning.md).
	chainPieces = 4
	// chainMinPiece keeps the pieces of small vectors large enough that a
	// piece's folds, not its barrier, are what the call waits on. Not
	// timed against other sizes.
	chainMinPiece = 32 << 10
)

// The leader votes for the slots only when its estimate for them is at
// least 10 % below the cross-memory one (slotsNum/slotsDen): where the two
// are about even, the vote would otherwise flip on noise (a chooser rule,
// like exploreEvery).
const slotsNum, slotsDen = 9, 10
