/*
 * gocoll.h - C interface of libgocoll, collective communication for ML
 * training on CPUs (TCP between hosts, shared memory inside a host).
 *
 * This header is written by hand and is the contract; it is not the header
 * cgo generates. Its shape and numbering follow NCCL's nccl.h so that a
 * trainer written against NCCL maps one to one (ncclX -> gocollX).
 *
 * General rules (they apply to every function below unless it says otherwise)
 * ---------------------------------------------------------------------------
 * - Every call returns a gocollResult_t; nothing in the library aborts or
 *   exits the process. On failure gocollGetLastError() returns a text that
 *   says what was wrong.
 * - Handles (gocollComm_t, gocollRequest_t) are opaque: never dereference
 *   them. A handle that was never returned by the library, or whose object
 *   was destroyed/freed, is detected and rejected with gocollInvalidArgument
 *   (unknown value, NULL) or gocollInvalidUsage (destroyed communicator,
 *   request already freed); it never crashes the process.
 * - Counts and displacements are numbers of elements of `datatype`, not bytes.
 * - Buffers are ordinary host memory (malloc, stack, mmap, numpy/torch
 *   storage) or memory from gocollMemAlloc. A NULL buffer is accepted only
 *   when the call moves no bytes through it (count 0, or a buffer the rank
 *   does not use, such as recvbuff on a non-root rank of gocollReduce).
 * - In place: a collective runs in place when the send buffer starts at the
 *   exact address given for each call below (usually sendbuff == recvbuff).
 *   Send and receive buffers that overlap in any other way are rejected with
 *   gocollInvalidArgument, before anything is sent.
 * - Order: every rank of a communicator must issue the same collectives in
 *   the same order with the same count, datatype, op and root (NCCL's rule).
 *   A rank that calls a different collective is detected from the first
 *   message: the call fails with gocollInvalidUsage instead of mixing data
 *   (a peer that learns of it only through the failing rank's abort gets
 *   gocollRemoteError). Operations on one communicator run one after the
 *   other in issue order (like an NCCL stream); sends and receives with
 *   different peers progress independently.
 * - Failures during a collective (a peer process died, a peer aborted, the
 *   GOCOLL_TIMEOUT deadline passed) make the communicator unusable: the call
 *   that saw it returns the error, the peers are told so that they stop
 *   waiting too, gocollCommGetAsyncError reports it, and later calls on the
 *   communicator return gocollInvalidUsage. Destroy (or abort) it and build
 *   a new one.
 * - Threads: every function may be called from any thread. A communicator
 *   may be used by several threads, but the issue order must still be the
 *   same on every rank.
 * - Processes: the library starts a Go runtime when it is loaded. A process
 *   that loaded it must not fork() and keep using it in the child; start
 *   ranks with exec (or a launcher: torchrun, mpirun, srun). dlclose() is
 *   not supported.
 * - Settings come from the environment (GOCOLL_TIMEOUT, GOCOLL_ALGO,
 *   GOCOLL_DEBUG, GOCOLL_SOCKET_IFNAME, GOCOLL_TRANSPORT, ...; one entry per
 *   variable in docs/settings.md)
 *   or, per communicator, from a gocollConfig_t (gocollCommInitRankConfig),
 *   whose fields win over the variables. They are read when a communicator
 *   or unique id is created; a malformed value makes that call fail with
 *   gocollInvalidArgument. "GOCOLL_TIMEOUT" below means the communicator's
 *   timeout: its config's timeoutMs when set.
 *
 * Result codes, in general
 * ------------------------
 *   gocollSuccess          the call did what it says.
 *   gocollUnhandledError   not returned by this library (kept for NCCL's numbering).
 *   gocollSystemError      the operating system refused something (socket,
 *                          bind, shared memory, mmap).
 *   gocollInternalError    a bug in gocoll; the text says where. Please report it.
 *   gocollInvalidArgument  an argument is wrong by itself: NULL pointer,
 *                          unknown handle, datatype or op, rank out of range,
 *                          overlapping buffers, counts that do not fit.
 *   gocollInvalidUsage     the arguments are fine but the call is not
 *                          allowed now: destroyed/aborted communicator, freed
 *                          request, communicator that already failed, ranks
 *                          that issued different collectives, send to self.
 *                          At init: ranks disagree on the job's size, a rank
 *                          joined twice or out of range, or a secret differs
 *                          (GOCOLL_SECRET or the unique id): every rank the
 *                          rendezvous root told gets this same code.
 *   gocollRemoteError      another rank failed: its process died or closed
 *                          its connection, or it aborted the communicator.
 *                          At init: a rank left while the others set up.
 *   gocollInProgress       not returned by this version (kept for NCCL's
 *                          numbering; non-blocking calls report progress
 *                          through gocollTest).
 *   gocollTimeout          a wait passed GOCOLL_TIMEOUT (default 5 minutes):
 *                          some rank did not take part in time. At init: a
 *                          rank never joined (the text names the missing ranks).
 */
#ifndef GOCOLL_H_
#define GOCOLL_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Library version 0.1.0; gocollGetVersion returns
 * GOCOLL_MAJOR*10000 + GOCOLL_MINOR*100 + GOCOLL_PATCH (NCCL's encoding). */
#define GOCOLL_MAJOR 0
#define GOCOLL_MINOR 1
#define GOCOLL_PATCH 0
#define GOCOLL_VERSION_CODE (GOCOLL_MAJOR * 10000 + GOCOLL_MINOR * 100 + GOCOLL_PATCH)

/* Opaque communicator handle. Its value is an identifier, not an address. */
typedef struct gocollComm* gocollComm_t;

/* Opaque handle of a non-blocking operation (gocollI... calls). */
typedef struct gocollRequest* gocollRequest_t;

/* Names a job's rendezvous point; made by gocollGetUniqueId on one process
 * and copied byte for byte to every rank (file, socket, MPI_Bcast, ...). It
 * carries the root's address and a random secret that authenticates the
 * job's connections: treat it like a password. */
#define GOCOLL_UNIQUE_ID_BYTES 128
typedef struct { char internal[GOCOLL_UNIQUE_ID_BYTES]; } gocollUniqueId;

typedef enum {
  gocollSuccess = 0,
  gocollUnhandledError = 1,
  gocollSystemError = 2,
  gocollInternalError = 3,
  gocollInvalidArgument = 4,
  gocollInvalidUsage = 5,
  gocollRemoteError = 6,
  gocollInProgress = 7,
  gocollTimeout = 8,
  gocollRevoked = 9,  /* the communicator was revoked (gocollCommRevoke, here or on a peer) */
  gocollExcluded = 10, /* the other ranks shrank the communicator without this one */
  gocollNoQuorum = 11, /* GOCOLL_SHRINK_QUORUM=majority: half or fewer of the ranks could agree; do not retry */
  gocollNumResults = 12
} gocollResult_t;

/* Element types. float16 is IEEE 754 binary16, bfloat16 the upper half of a
 * binary32; each step of a reduction on them is computed in float32 and
 * rounded once back to nearest even. gocollBool is one byte per element
 * (C's bool, torch.bool, numpy.bool_): 0 is false, any other byte is true.
 * 10 and 11 are not types here: they are NCCL's ncclFloat8e4m3 and
 * ncclFloat8e5m2, kept free so that every number means the same type in
 * both libraries (gocollNumTypes is one past the largest type number). */
typedef enum {
  gocollInt8 = 0, gocollChar = 0,
  gocollUint8 = 1,
  gocollInt32 = 2, gocollInt = 2,
  gocollUint32 = 3,
  gocollInt64 = 4,
  gocollUint64 = 5,
  gocollFloat16 = 6, gocollHalf = 6,
  gocollFloat32 = 7, gocollFloat = 7,
  gocollFloat64 = 8, gocollDouble = 8,
  gocollBfloat16 = 9,
  gocollInt16 = 12,
  gocollBool = 13,
  gocollNumTypes = 14
} gocollDataType_t;

/* Reduction operators. Integer arithmetic wraps around (two's complement,
 * int16 included, as in torch); gocollAvg is the sum divided by the number
 * of ranks, truncated toward zero for integer types (as in C), rounded to
 * nearest for floating types. gocollBand, gocollBor and gocollBxor are
 * bitwise and, or and exclusive or (torch's BAND, BOR, BXOR), on integer
 * types and gocollBool only.
 *
 * On gocollBool the ops follow torch (ProcessGroupNCCL and Gloo): Sum, Max
 * and Bor are logical or, Prod, Min and Band logical and, Bxor logical
 * exclusive or; every result byte is 0 or 1 whatever nonzero bytes the
 * inputs held. (On a single rank nothing is combined and the input is
 * copied as it is, as NCCL and Gloo do.)
 *
 * Refused with gocollInvalidArgument, on every rank and before anything is
 * sent: the bitwise ops on floating types, gocollAvg on gocollBool. */
typedef enum {
  gocollSum = 0,
  gocollProd = 1,
  gocollMax = 2,
  gocollMin = 3,
  gocollAvg = 4,
  gocollBand = 5,
  gocollBor = 6,
  gocollBxor = 7,
  gocollNumOps = 8
} gocollRedOp_t;

/* Per-communicator settings, the counterpart of NCCL's ncclConfig_t, for
 * gocollCommInitRankConfig and gocollCommInitFromEnvConfig. Each field
 * stands for one GOCOLL_* variable, takes that variable's values, and wins
 * over it for this communicator only; a field left unset
 * (GOCOLL_CONFIG_UNDEF_INT, NULL or "") falls back to the variable, then to
 * the default. Two communicators of one process can so have different
 * timeouts, algorithms or log levels.
 *
 * Always start from GOCOLL_CONFIG_INITIALIZER, which fills the header
 * (size, magic, version) and leaves every field unset; then set the fields
 * you want:
 *
 *     gocollConfig_t config = GOCOLL_CONFIG_INITIALIZER;
 *     config.timeoutMs = 30000;
 *     config.algo = "allreduce=ring";
 *     gocollCommInitRankConfig(&comm, nranks, id, rank, &config);
 *
 * The header lets the struct grow: a program built with this header keeps
 * working with later libraries, which read only the fields its version
 * has. A header that is not one this library knows (size, magic or
 * version), as from a newer gocoll.h than the library or from a struct
 * not made with the initializer, is refused with gocollInvalidArgument.
 * The library copies what it needs during the call: the strings may be
 * freed afterwards. Each field is one entry of the settings table in
 * engine/settings.go (its values: docs/settings.md); a new field goes
 * there too, and in Python's gocoll._lib.Config (tests check all three). */
#define GOCOLL_CONFIG_MAGIC 0x60c011cfu
#define GOCOLL_CONFIG_VERSION 4
#define GOCOLL_CONFIG_UNDEF_INT (-2147483647 - 1) /* INT_MIN: "not set" for int fields */

typedef struct gocollConfig_v4 {
  size_t size;          /* sizeof(gocollConfig_t) */
  unsigned int magic;   /* GOCOLL_CONFIG_MAGIC */
  unsigned int version; /* GOCOLL_CONFIG_VERSION: the layout of the fields below */
  int timeoutMs;        /* GOCOLL_TIMEOUT: bound of every wait, in milliseconds (> 0) */
  const char* algo;     /* GOCOLL_ALGO: "ring", or "allreduce=hd,alltoall=bruck", ... */
  const char* debug;    /* GOCOLL_DEBUG: "DEBUG", "INFO", "WARN", "ERROR" or "OFF" */
  const char* debugFile;    /* GOCOLL_DEBUG_FILE: log file (%h host, %p pid) */
  const char* transport;    /* GOCOLL_TRANSPORT: "auto" or "tcp" */
  const char* socketIfname; /* GOCOLL_SOCKET_IFNAME: network interface for TCP */
  const char* netBandwidth; /* GOCOLL_NET_BANDWIDTH: a host's link, e.g. "25gbit" */
  const char* dumpDir;      /* GOCOLL_DUMP_DIR: where flight-recorder dumps go */
  int cma;              /* GOCOLL_CMA: 1, or 0 to keep ranks from reading each other's memory */
  int bruckRadix;       /* GOCOLL_BRUCK_RADIX: >= 2 */
  int hdSegments;       /* GOCOLL_HD_SEGMENTS: >= 1 */
  int flightRecords;    /* GOCOLL_FLIGHT_RECORDS: 0 (off) to 1048576 */
  /* version 2 */
  const char* shrinkQuorum; /* GOCOLL_SHRINK_QUORUM: "live" or "majority" (gocollCommShrink) */
  /* version 3 */
  const char* tune;     /* GOCOLL_TUNE: "auto", "redo" or "off" (timing schedules across hosts) */
  /* version 4 */
  const char* connect;  /* GOCOLL_CONNECT: "lazy" or "all" (when TCP connections are made) */
} gocollConfig_t;

#define GOCOLL_CONFIG_INITIALIZER {                                        \
  sizeof(gocollConfig_t), GOCOLL_CONFIG_MAGIC, GOCOLL_CONFIG_VERSION,      \
  GOCOLL_CONFIG_UNDEF_INT,                    /* timeoutMs */              \
  NULL, NULL, NULL, NULL, NULL, NULL, NULL,   /* algo ... dumpDir */       \
  GOCOLL_CONFIG_UNDEF_INT, GOCOLL_CONFIG_UNDEF_INT,  /* cma, bruckRadix */ \
  GOCOLL_CONFIG_UNDEF_INT, GOCOLL_CONFIG_UNDEF_INT,  /* hdSegments, flightRecords */ \
  NULL, NULL, NULL                            /* shrinkQuorum, tune, connect */ \
}

/* ------------------------------------------------------------------------- */
/* Library, errors                                                           */
/* ------------------------------------------------------------------------- */

/* Stores the library version, GOCOLL_VERSION_CODE of the library actually
 * loaded (compare with the header's to detect a mismatch), in *version.
 * Errors: gocollInvalidArgument if version is NULL. */
gocollResult_t gocollGetVersion(int* version);

/* Returns a short static description of a result code ("invalid argument",
 * ...); an unknown value gives "unknown result code". Never NULL; never free it. */
const char* gocollGetErrorString(gocollResult_t result);

/* Returns the human-readable detail of the last failure.
 * - comm valid: the last failing call on that communicator (including a
 *   failed gocollWait/gocollTest of one of its requests); "" if none failed.
 * - comm NULL or not a live communicator: the last failing call made by
 *   the calling thread, whatever the communicator (use this after a failed
 *   gocollCommInitRank, gocollGetUniqueId, or a call with a bad handle);
 *   "" if none.
 * The string is owned by the library: do not free it. A communicator's
 * string stays valid until the next failing call on that communicator or
 * its destruction. The thread's string is overwritten by the thread's next
 * failing call (the pointer stays valid while the thread lives). Copy it to
 * keep it. Texts longer than 1023 bytes are cut in the thread's copy.
 * Never NULL. */
const char* gocollGetLastError(gocollComm_t comm);

/* ------------------------------------------------------------------------- */
/* Communicators                                                             */
/* ------------------------------------------------------------------------- */

/* Creates a unique id for a new job and starts the job's rendezvous service
 * in this process (like ncclGetUniqueId); call it on one process (usually
 * the one that will be rank 0), then give the id to every rank, which pass
 * it to gocollCommInitRank. The service lives until every rank joined or
 * GOCOLL_TIMEOUT passed, so the process that made the id must stay alive
 * (and normally takes part as a rank). The id holds this host's address:
 * GOCOLL_SOCKET_IFNAME picks the interface.
 * Errors: gocollInvalidArgument (id NULL, bad GOCOLL_* setting),
 * gocollSystemError (no address or listening socket). */
gocollResult_t gocollGetUniqueId(gocollUniqueId* id);

/* Joins rank `rank` (0 <= rank < nranks) of an nranks job named by id and
 * stores the new communicator in *comm. Collective over the job: every rank
 * must call it, and it returns once all ranks are connected (shared memory
 * between ranks on one host, TCP otherwise).
 * Errors: gocollInvalidArgument (comm NULL, nranks < 1, rank out of range,
 * id not made by gocollGetUniqueId, bad GOCOLL_* setting),
 * gocollTimeout (not every rank joined within GOCOLL_TIMEOUT),
 * gocollSystemError (sockets or shared memory could not be set up),
 * gocollRemoteError (the root or a peer failed during setup). *comm is
 * left untouched on failure. */
gocollResult_t gocollCommInitRank(gocollComm_t* comm, int nranks, gocollUniqueId id, int rank);

/* Like gocollCommInitRank, with rank, size and rendezvous taken from the
 * launcher's environment:
 * - torchrun: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT. gocoll's
 *   rendezvous listens on MASTER_PORT+1 on rank 0 (MASTER_PORT belongs to
 *   torchrun's store), or on GOCOLL_PORT if set;
 * - Open MPI (mpirun): OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK, plus a root
 *   address (GOCOLL_ROOT_ADDR, or MASTER_ADDR/MASTER_PORT) passed with -x;
 * - Slurm (srun): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, ...;
 * - plain: GOCOLL_RANK, GOCOLL_SIZE, GOCOLL_ROOT_ADDR (host:port).
 * Rank 0 runs the rendezvous service. GOCOLL_SECRET, when set to the same
 * value on every rank, authenticates the connections.
 * Errors: as gocollCommInitRank; gocollInvalidArgument also when the
 * variables are missing, malformed or inconsistent. */
gocollResult_t gocollCommInitFromEnv(gocollComm_t* comm);

/* gocollCommInitRank and gocollCommInitFromEnv with settings of the
 * communicator's own (see gocollConfig_t), like ncclCommInitRankConfig.
 * config NULL means every field unset: the environment's settings, as the
 * calls without Config. The communicator keeps its settings for its whole
 * life; communicators made from it with gocollCommSplit have them too.
 * (The rendezvous service that gocollGetUniqueId starts follows the
 * environment's GOCOLL_TIMEOUT.)
 * Errors: as gocollCommInitRank / gocollCommInitFromEnv;
 * gocollInvalidArgument also when config's size, magic or version is not
 * one this library knows, or a field holds a value its variable would not
 * take (the text names the field). */
gocollResult_t gocollCommInitRankConfig(gocollComm_t* comm, int nranks, gocollUniqueId id, int rank,
                                        const gocollConfig_t* config);
gocollResult_t gocollCommInitFromEnvConfig(gocollComm_t* comm, const gocollConfig_t* config);

/* Splits comm: ranks passing the same color form a new communicator, ranked
 * by key (ties broken by rank in comm). Collective over comm: every rank
 * must call it. A rank passing GOCOLL_SPLIT_NOCOLOR takes part but gets
 * *newcomm = NULL. The new communicator is independent: destroy it
 * separately (before or after comm).
 * Errors: gocollInvalidArgument (comm not valid, newcomm NULL, color < -1),
 * and the errors of a collective on comm. */
#define GOCOLL_SPLIT_NOCOLOR (-1)
gocollResult_t gocollCommSplit(gocollComm_t comm, int color, int key, gocollComm_t* newcomm);

/* Waits for the operations already issued on comm to finish, then releases
 * its connections and shared memory and frees the handle. Not collective,
 * but peers still running collectives with this rank will fail; destroy
 * after the last collective on every rank. Requests issued on comm remain
 * valid handles: gocollWait/gocollTest still return their results.
 * Memory from gocollMemAlloc stays allocated (free it with gocollMemFree).
 * Errors: gocollInvalidArgument (comm NULL or unknown), gocollInvalidUsage
 * (comm already destroyed or aborted); gocollSystemError (or
 * gocollInternalError) if releasing connections or shared memory failed -
 * the handle is freed anyway. */
gocollResult_t gocollCommDestroy(gocollComm_t comm);

/* Aborts comm and frees the handle, like ncclCommAbort: every operation
 * pending on comm, on any thread, returns at once with an error
 * (gocollInvalidUsage on this rank), the peers are told (their operations
 * that need data from this rank fail with gocollRemoteError instead of
 * waiting for GOCOLL_TIMEOUT), and the handle becomes
 * invalid - do not call gocollCommDestroy afterwards. Requests issued on
 * comm stay valid: gocollWait/gocollTest return their error. Never blocks
 * on the peers.
 * Errors: gocollInvalidArgument (comm NULL or unknown), gocollInvalidUsage
 * (already destroyed or aborted). */
gocollResult_t gocollCommAbort(gocollComm_t comm);

/* ------------------------------------------------------------------------- */
/* Surviving a lost rank (docs/elastic.md)                                    */
/* ------------------------------------------------------------------------- */

/* Revokes comm, like ncclCommRevoke / MPIX_Comm_revoke: every operation
 * pending on comm, on this rank and on its peers (told through the
 * connections), and every later one fails with gocollRevoked. Not
 * collective, never blocks, idempotent. Unlike gocollCommAbort the handle
 * stays valid: comm can still be shrunk (gocollCommShrink), queried
 * (gocollCommGetFailed) and destroyed.
 * Errors: gocollInvalidArgument (comm not valid, flags not 0). */
gocollResult_t gocollCommRevoke(gocollComm_t comm, int flags);

#define GOCOLL_SHRINK_DEFAULT 0
#define GOCOLL_SHRINK_ABORT 1 /* revoke comm's pending work first */

/* Makes *newcomm of the ranks of comm that go on, renumbered densely in
 * their order in comm, like ncclCommShrink. Every such rank calls it.
 * excludeRanks NULL (excludeCount 0): the ranks agree among themselves
 * which ranks failed (a fault-tolerant agreement: ranks whose connection
 * broke, or silent past GOCOLL_TIMEOUT, are left out, and ranks dying
 * during the shrink cost one more round); this is the call after a
 * gocollRemoteError or gocollTimeout. Otherwise the excludeCount ranks of
 * comm listed are left out (they do not call it; every caller passes the
 * same list). Works on a failed or revoked comm; with GOCOLL_SHRINK_ABORT
 * it revokes comm first, so that operations still pending on it return
 * (use it after a failure). config NULL: the new communicator has comm's
 * settings; else its own, as gocollCommInitRankConfig. comm stays valid:
 * destroy it (its answers to late ranks stop then, or when newcomm is
 * destroyed, whichever is later). Bounded by 8 x GOCOLL_TIMEOUT.
 * Errors: gocollInvalidArgument (comm not valid, newcomm NULL, a rank out
 * of range or listed twice, this rank listed, excludeRanks NULL with
 * excludeCount > 0, bad flags or config), gocollExcluded (the others went
 * on without this rank: it was taken for failed - stopped or too slow -
 * and cannot rejoin; exit, or join anew with gocollCommJoin),
 * gocollNoQuorum (with GOCOLL_SHRINK_QUORUM / config shrinkQuorum
 * "majority": no more than half of comm's ranks could agree, so this side
 * of a partition must not go on; shrinking again will not help: stop),
 * gocollTimeout, gocollRemoteError or gocollSystemError (the new
 * connections could not be made). *newcomm is left untouched on failure. */
gocollResult_t gocollCommShrink(gocollComm_t comm, const int* excludeRanks, int excludeCount,
                                gocollComm_t* newcomm, const gocollConfig_t* config, int flags);

/* Stores in *n how many ranks of comm this rank knows failed, and the
 * first max of them, ascending, in ranks: ranks whose connection broke,
 * and after a shrink the ranks it left out. Ranks that only aborted or
 * revoked are not failed. ranks may be NULL with max 0 (count only).
 * Errors: gocollInvalidArgument (comm not valid, n NULL, max < 0, ranks
 * NULL with max > 0). */
gocollResult_t gocollCommGetFailed(gocollComm_t comm, int* ranks, int max, int* n);

/* Growing: a new process (a replacement for a lost rank) joins a running
 * communicator. Any rank of comm writes the join info (gocollCommJoinInfo:
 * rank 0's control address and comm's id, nothing secret) where the new
 * process finds it (a job file, or a variable the launcher sets);
 * the new process calls gocollCommJoin with it and the job's unique id (or
 * NULL with the job's GOCOLL_SECRET set) and waits; the members, at a point
 * of their choosing (a step boundary: rank 0 learns of waiting processes
 * with gocollCommJoiners and tells the others, e.g. in the step's own
 * allreduce), all call gocollCommGrow. The members keep their ranks; the
 * new processes are numbered from the old size up, in the order they
 * asked. Only communicators over sockets or shared memory between
 * processes can grow. */

/* Writes comm's join info as NUL-terminated text into buf (len bytes) and
 * the bytes it needs into *needed, as gocollCommGetTopology.
 * Errors: as gocollCommGetTopology. */
gocollResult_t gocollCommJoinInfo(gocollComm_t comm, char* buf, size_t len, size_t* needed);

/* Stores in *n how many processes wait to join comm (on rank 0; 0 on the
 * other ranks). Never blocks.
 * Errors: gocollInvalidArgument (comm not valid, n NULL). */
gocollResult_t gocollCommJoiners(gocollComm_t comm, int* n);

/* Admits nJoiners waiting processes: *newcomm holds comm's ranks (same
 * numbers) and theirs. Collective over comm, every rank passing the same
 * nJoiners; rank 0 waits up to GOCOLL_TIMEOUT for them. comm stays valid.
 * Errors: gocollInvalidArgument (comm not valid, newcomm NULL, nJoiners <
 * 1), gocollInvalidUsage (comm failed: shrink it first), gocollTimeout
 * (fewer processes asked in time), gocollRemoteError. */
gocollResult_t gocollCommGrow(gocollComm_t comm, int nJoiners, gocollComm_t* newcomm);

/* Joins the communicator named by joinInfo (gocollCommJoinInfo) as a new
 * rank, once its members call gocollCommGrow; waits up to GOCOLL_TIMEOUT
 * (or config's timeout) to be admitted. id: the job's unique id, whose
 * secret authenticates this process; NULL: the job's GOCOLL_SECRET.
 * Errors: gocollInvalidArgument (comm or joinInfo NULL, joinInfo not a
 * join info, no id and no GOCOLL_SECRET, bad config), gocollInvalidUsage
 * (the secret is not the job's), gocollTimeout (not admitted in time),
 * gocollRemoteError (the job is gone). */
gocollResult_t gocollCommJoin(gocollComm_t* comm, const char* joinInfo, const gocollUniqueId* id,
                              const gocollConfig_t* config);

/* Stores the number of ranks of comm in *count.
 * Errors: gocollInvalidArgument (comm not valid, count NULL),
 * gocollInvalidUsage (comm destroyed). */
gocollResult_t gocollCommCount(const gocollComm_t comm, int* count);

/* Stores this process's rank in comm (0 ... count-1) in *rank.
 * Errors: as gocollCommCount. */
gocollResult_t gocollCommUserRank(const gocollComm_t comm, int* rank);

/* Writes comm's topology as NUL-terminated JSON text into buf (len bytes)
 * and the bytes it needs, NUL included, into *needed (when needed is not
 * NULL). Call it with buf NULL and len 0 to learn the size first. The text
 * is one object: "rank", "ranks", "hosts" (each {"name", "ranks": [...]}, the
 * ranks that share memory), "ring" (the order the ring algorithms follow),
 * "graph" (the machine as the cost model sees it: hosts, nodes, links with
 * bandwidth in bytes/s and latency in s; schema in topology/README.md),
 * "local_host" (this host's cores, NUMA nodes and caches, detected with
 * hwloc when libhwloc is installed, /sys otherwise; "local_source" says
 * which) or "detect_error".
 * Errors: gocollInvalidArgument (comm not valid; buf NULL with len > 0;
 * buf and needed both NULL; len too small — then *needed is still set),
 * gocollInvalidUsage (comm destroyed). */
gocollResult_t gocollCommGetTopology(gocollComm_t comm, char* buf, size_t len, size_t* needed);

/* Writes comm's flight recorder - its last GOCOLL_FLIGHT_RECORDS operations
 * (default 256), oldest first, each with its sequence number, bytes,
 * datatype, algorithm, start and end times, the peer it last waited for and
 * its outcome, and those still in flight - as JSON to a file in
 * GOCOLL_DUMP_DIR (default: the temp dir) named
 * gocoll-dump-<host>-<pid>-r<rank>-c<comm id>.json, replacing this
 * communicator's earlier dump, and copies the file's path, NUL-terminated,
 * into path (len bytes). path NULL with len 0: write the file only. The
 * library writes the same file by itself on comm's first failure and, for
 * every live communicator of the process, on SIGUSR1; gocoll-doctor reads
 * the files of all ranks and says which rank did not arrive where. Safe to
 * call while operations run on other threads, and after a failure.
 * Errors: gocollInvalidArgument (comm not valid; path NULL with len > 0;
 * len too small for the path - the file is written all the same),
 * gocollInvalidUsage (comm destroyed), gocollSystemError (the file could not
 * be written). */
gocollResult_t gocollCommDumpState(gocollComm_t comm, char* path, size_t len);

/* Stores in *asyncError the error that made comm unusable (the result code
 * its failing operation returned), or gocollSuccess if it is healthy.
 * Returns gocollSuccess itself whenever comm and asyncError are valid.
 * Errors: gocollInvalidArgument (comm not valid, asyncError NULL),
 * gocollInvalidUsage (comm destroyed). */
gocollResult_t gocollCommGetAsyncError(gocollComm_t comm, gocollResult_t* asyncError);

/* ------------------------------------------------------------------------- */
/* Memory                                                                    */
/* ------------------------------------------------------------------------- */

/* Allocates size bytes of page-aligned memory (outside any garbage-collected
 * heap) for buffers used with comm, like ncclMemAlloc; stores the address
 * in *ptr. Any host memory works with every call. When every rank of comm
 * is on one host this memory is shared: as the send buffer of
 * gocollAllReduce, gocollReduce or gocollReduceScatter (64 KiB and up) the
 * peers read it in place, which saves copying it in. Otherwise, or past the
 * number of shared allocations a communicator holds, it is private memory.
 * Errors: gocollInvalidArgument (ptr NULL, size 0, comm not valid),
 * gocollInvalidUsage (comm destroyed), gocollSystemError (out of memory). */
gocollResult_t gocollMemAlloc(void** ptr, size_t size, gocollComm_t comm);

/* Frees memory from gocollMemAlloc. It works after comm was destroyed or
 * aborted too (comm may then be any value, even NULL): the pointer alone
 * says which allocation it is. Do not free memory an operation still uses.
 * Errors: gocollInvalidArgument (ptr NULL or not returned by gocollMemAlloc,
 * or already freed). */
gocollResult_t gocollMemFree(void* ptr, gocollComm_t comm);

/* ------------------------------------------------------------------------- */
/* Blocking collectives                                                      */
/* ------------------------------------------------------------------------- */
/* Each returns when this rank's part is done: its receive buffer holds the
 * result and its send buffer may be reused. Common errors for all of them:
 *   gocollInvalidArgument  comm not valid; datatype or op unknown; a NULL
 *                          buffer that must be read or written; a count
 *                          whose byte size does not fit in memory; root or
 *                          peer outside [0, nranks); buffers that overlap
 *                          without being in place.
 *   gocollInvalidUsage     comm destroyed, or failed earlier; the ranks
 *                          issued different collectives (or different
 *                          count/datatype/op/root).
 *   gocollRemoteError      a peer died or aborted during the call.
 *   gocollTimeout          a peer did not take part within GOCOLL_TIMEOUT.
 * After any error but the argument errors (which are detected before
 * anything is sent and leave comm usable), the receive buffer is undefined
 * and comm is unusable. */

/* recvbuff[i] = op over all ranks of sendbuff[i], for i < count, on every
 * rank. In place when sendbuff == recvbuff. */
gocollResult_t gocollAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                               gocollDataType_t datatype, gocollRedOp_t op, gocollComm_t comm);

/* Like gocollAllReduce, but the result lands only in root's recvbuff;
 * recvbuff is not used (may be NULL) on other ranks. In place on the root
 * when sendbuff == recvbuff. */
gocollResult_t gocollReduce(const void* sendbuff, void* recvbuff, size_t count,
                            gocollDataType_t datatype, gocollRedOp_t op, int root, gocollComm_t comm);

/* Copies count elements of sendbuff on root into recvbuff on every rank
 * (root included). sendbuff is read only on root (may be NULL elsewhere).
 * In place when sendbuff == recvbuff on root. The root may return before
 * the others received the data (on one host, once it is staged in shared
 * memory); sendbuff is free for reuse on return, as always. */
gocollResult_t gocollBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                               gocollDataType_t datatype, int root, gocollComm_t comm);

/* Gathers sendcount elements from every rank into recvbuff, which holds
 * nranks*sendcount elements in rank order, on every rank. In place when
 * sendbuff == recvbuff + rank*sendcount elements (this rank's block). */
gocollResult_t gocollAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                               gocollDataType_t datatype, gocollComm_t comm);

/* Reduces nranks*recvcount elements of sendbuff with op over all ranks and
 * leaves block r (recvcount elements starting at r*recvcount) in recvbuff of
 * rank r. In place when recvbuff == sendbuff + rank*recvcount elements. */
gocollResult_t gocollReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                   gocollDataType_t datatype, gocollRedOp_t op, gocollComm_t comm);

/* Block j (count elements at j*count) of sendbuff on rank i goes to block i
 * of recvbuff on rank j. Both buffers hold nranks*count elements. In place
 * when sendbuff == recvbuff. */
gocollResult_t gocollAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                              gocollDataType_t datatype, gocollComm_t comm);

/* Like gocollAllToAll with a count and displacement per peer: rank i sends
 * sendcounts[j] elements starting at sendbuff + sdispls[j] to rank j, which
 * stores them at recvbuff + rdispls[i]. The four arrays have nranks entries
 * and must not be NULL; a displacement that goes with a zero count is
 * ignored. sendcounts[j] on rank i must equal recvcounts[i] on rank j
 * (otherwise the call fails with gocollInvalidUsage, see "Order" above). No send block may
 * overlap a receive block and no two receive blocks may overlap (no in-place
 * form). */
gocollResult_t gocollAllToAllv(const void* sendbuff, const size_t sendcounts[], const size_t sdispls[],
                               void* recvbuff, const size_t recvcounts[], const size_t rdispls[],
                               gocollDataType_t datatype, gocollComm_t comm);

/* Sends count elements to peer, which must post a gocollRecv with the same
 * count and datatype. Messages to one peer arrive in order. A blocking send
 * may wait until the peer receives: pair blocking sends and receives so
 * that they cannot all wait (or use gocollISend/gocollIRecv).
 * Errors: the common ones; gocollInvalidUsage when peer is this rank. */
gocollResult_t gocollSend(const void* sendbuff, size_t count, gocollDataType_t datatype, int peer,
                          gocollComm_t comm);

/* Receives count elements from peer's matching gocollSend into recvbuff.
 * peer may be GOCOLL_ANY_SOURCE (see gocollRecvAny).
 * Errors: as gocollSend. */
gocollResult_t gocollRecv(void* recvbuff, size_t count, gocollDataType_t datatype, int peer,
                          gocollComm_t comm);

/* gocollSend with a message tag, 0 … INT_MAX (gocollSend is tag 0), as in
 * MPI and torch.distributed: the peer's gocollRecvTag with the same tag
 * takes it. Messages to one peer leave in issue order; the receiver takes
 * messages of different tags in whatever order it posts its receives, and
 * messages of one tag in order. A message that arrives before its receive
 * is posted is kept by the receiver (memory for its payload). Every send
 * must be received before the receiver's next collective on comm: a
 * collective that meets a message nobody received fails with
 * gocollInvalidUsage on that rank.
 * Errors: as gocollSend; gocollInvalidArgument for a negative tag. */
gocollResult_t gocollSendTag(const void* sendbuff, size_t count, gocollDataType_t datatype, int peer,
                             int tag, gocollComm_t comm);

/* Receives into recvbuff the oldest message from peer with this tag that no
 * earlier receive took. count and datatype must be the sender's: a
 * difference fails with gocollInvalidUsage (and, as every failure, leaves
 * the communicator unusable). Errors: as gocollSendTag. */
gocollResult_t gocollRecvTag(void* recvbuff, size_t count, gocollDataType_t datatype, int peer,
                             int tag, gocollComm_t comm);

/* The peer of a receive (gocollRecv, gocollRecvTag and their I-forms) that
 * takes a message from whichever rank sent one, as MPI_ANY_SOURCE; use
 * gocollRecvAny/gocollIRecvAny to learn which rank that was. */
#define GOCOLL_ANY_SOURCE (-1)

/* gocollRecvTag from any source: receives into recvbuff the first message
 * with this tag that arrives from any rank and that no receive naming its
 * sender waits for, and stores the sender's rank in *source (source may be
 * NULL; it holds GOCOLL_ANY_SOURCE until a message was taken). Messages
 * from one sender are taken in the order they were sent; which sender
 * comes first when several sent is unspecified. Receives from any source
 * with one tag complete in the order they were posted. count and datatype
 * must be the sender's: a difference fails with gocollInvalidUsage naming
 * the sender (and, as every failure, leaves the communicator unusable),
 * never a truncated message. Only the point-to-point messages sent before
 * a sender's next collective can match (as for every receive).
 * Errors: as gocollRecvTag; gocollInvalidUsage on a communicator of one
 * rank; gocollTimeout when no rank sends within GOCOLL_TIMEOUT. */
gocollResult_t gocollRecvAny(void* recvbuff, size_t count, gocollDataType_t datatype, int tag, int* source,
                             gocollComm_t comm);

/* Returns once every rank of comm called it. */
gocollResult_t gocollBarrier(gocollComm_t comm);

/* ------------------------------------------------------------------------- */
/* Non-blocking collectives                                                  */
/* ------------------------------------------------------------------------- */
/* Same arguments, rules and argument errors as the blocking form, plus
 * `request` (must not be NULL), where the handle of the started operation is
 * stored. The call returns at once; the operation runs in the background, in
 * issue order with the communicator's other operations. Until it completed
 * (gocollWait, or gocollTest reporting done) do not modify the send buffer,
 * read the receive buffer, or free either. Errors that happen while the
 * operation runs (gocollRemoteError, gocollTimeout, gocollInvalidUsage for
 * mismatched collectives or an abort) are returned by gocollWait/gocollTest.
 * When the call itself fails (argument errors, a destroyed or failed
 * communicator) no request is made and *request is left untouched.
 * Every request must be completed with gocollWait or a gocollTest that
 * reports done, which frees it. */

/* Non-blocking gocollAllReduce (in place when sendbuff == recvbuff). */
gocollResult_t gocollIAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                gocollDataType_t datatype, gocollRedOp_t op, gocollComm_t comm,
                                gocollRequest_t* request);
/* Non-blocking gocollReduce (recvbuff used only on root; in place on root
 * when sendbuff == recvbuff). */
gocollResult_t gocollIReduce(const void* sendbuff, void* recvbuff, size_t count,
                             gocollDataType_t datatype, gocollRedOp_t op, int root, gocollComm_t comm,
                             gocollRequest_t* request);
/* Non-blocking gocollBroadcast (sendbuff read only on root; in place when
 * sendbuff == recvbuff on root). */
gocollResult_t gocollIBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                gocollDataType_t datatype, int root, gocollComm_t comm,
                                gocollRequest_t* request);
/* Non-blocking gocollAllGather (in place when sendbuff == recvbuff +
 * rank*sendcount elements). */
gocollResult_t gocollIAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                gocollDataType_t datatype, gocollComm_t comm, gocollRequest_t* request);
/* Non-blocking gocollReduceScatter (in place when recvbuff == sendbuff +
 * rank*recvcount elements). */
gocollResult_t gocollIReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                    gocollDataType_t datatype, gocollRedOp_t op, gocollComm_t comm,
                                    gocollRequest_t* request);
/* Non-blocking gocollAllToAll (in place when sendbuff == recvbuff). */
gocollResult_t gocollIAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                               gocollDataType_t datatype, gocollComm_t comm, gocollRequest_t* request);
/* Non-blocking gocollAllToAllv. The four count/displacement arrays are
 * copied before gocollIAllToAllv returns: they may be freed or changed at
 * once (the buffers may not). */
gocollResult_t gocollIAllToAllv(const void* sendbuff, const size_t sendcounts[], const size_t sdispls[],
                                void* recvbuff, const size_t recvcounts[], const size_t rdispls[],
                                gocollDataType_t datatype, gocollComm_t comm, gocollRequest_t* request);
/* Non-blocking gocollSend. A non-blocking send and receive with the same
 * peer can both be pending: gocollISend + gocollIRecv + two gocollWait
 * never deadlock. */
gocollResult_t gocollISend(const void* sendbuff, size_t count, gocollDataType_t datatype, int peer,
                           gocollComm_t comm, gocollRequest_t* request);
/* Non-blocking gocollRecv. */
gocollResult_t gocollIRecv(void* recvbuff, size_t count, gocollDataType_t datatype, int peer,
                           gocollComm_t comm, gocollRequest_t* request);
/* Non-blocking gocollSendTag. */
gocollResult_t gocollISendTag(const void* sendbuff, size_t count, gocollDataType_t datatype, int peer,
                              int tag, gocollComm_t comm, gocollRequest_t* request);
/* Non-blocking gocollRecvTag. Receives with different tags from one peer
 * complete independently: each as soon as its own message arrived. */
gocollResult_t gocollIRecvTag(void* recvbuff, size_t count, gocollDataType_t datatype, int peer,
                              int tag, gocollComm_t comm, gocollRequest_t* request);
/* Non-blocking gocollRecvAny. *source (when source is not NULL) is
 * written when the receive completes, before gocollWait or gocollTest
 * reports it done: it must stay valid until then. */
gocollResult_t gocollIRecvAny(void* recvbuff, size_t count, gocollDataType_t datatype, int tag, int* source,
                              gocollComm_t comm, gocollRequest_t* request);
/* Non-blocking gocollBarrier: completes once every rank issued it. */
gocollResult_t gocollIBarrier(gocollComm_t comm, gocollRequest_t* request);

/* Checks a request without blocking (like MPI_Test).
 * - Still running: *done = 0, returns gocollSuccess; the request stays valid.
 * - Finished: *done = 1, FREES the request (its handle becomes invalid, as
 *   after gocollWait) and returns the operation's result: gocollSuccess, or
 *   its error (gocollRemoteError, gocollTimeout, gocollInvalidUsage, ...),
 *   whose text gocollGetLastError(comm) then holds.
 * Errors of the call itself: gocollInvalidArgument (request unknown or NULL
 * handle, done NULL; *done is then 0), gocollInvalidUsage (request already
 * freed). */
gocollResult_t gocollTest(gocollRequest_t request, int* done);

/* Blocks until the request finished, FREES it and returns the operation's
 * result (as gocollTest does when done). Never blocks longer than
 * GOCOLL_TIMEOUT after the operation started, and returns at once after
 * gocollCommAbort.
 * Errors of the call itself: gocollInvalidArgument (request NULL or
 * unknown), gocollInvalidUsage (request already freed). */
gocollResult_t gocollWait(gocollRequest_t request);

/* gocollTest that waits up to timeout_ms milliseconds (0: not at all) for
 * the request to finish, without spinning: *done and the result as
 * gocollTest. A request still running after the timeout stays valid, and
 * its operation goes on (what torch's Work.wait(timeout) needs).
 * Errors of the call itself: as gocollTest, and gocollInvalidArgument for
 * a negative timeout_ms. */
gocollResult_t gocollWaitTimeout(gocollRequest_t request, int timeout_ms, int* done);

/* ---------------------------------------------------------------------------
 * Redistribution: moving a distributed array from one layout to another
 * (resharding, restoring a checkpoint of another job size) with a
 * contention-free schedule: in each step no rank receives, and none sends,
 * more than one message, and messages of similar length share a step.
 *
 * A plan is computed alike on every rank from the two layouts (nothing is
 * exchanged), then run with gocollRedistribute. Processors are the
 * layouts' own numbers; by default processor i is rank i of the
 * communicator (gocollPlanPlace changes that). Each rank's buffer in a
 * layout holds the elements its processor owns, its blocks (tiles) back to
 * back in index order, each row-major; gocollPlanCounts says how many. */

/* A redistribution plan (an opaque handle, never dereferenced). */
typedef struct gocollPlan* gocollPlan_t;

/* A 1-D block-cyclic redistribution with an affine loop (the case of
 * docs/design/redistribution.md): FORALL i in 0..n-1: A(dstA·i + dstB) = B(srcA·i + srcB), where B
 * (the source) is block-cyclic(srcBlock) over srcProcs processors (element
 * g on processor (g / srcBlock) mod srcProcs) and A (the destination)
 * block-cyclic(dstBlock) over dstProcs. A plain redistribution is srcA =
 * dstA = 1, srcB = dstB = 0. The arrays are as long as the loop reaches.
 * Errors: gocollInvalidArgument (plan NULL; procs, blocks or a < 1, b < 0). */
gocollResult_t gocollPlanCyclic(gocollPlan_t* plan, int srcProcs, int srcBlock, int dstProcs, int dstBlock,
                                long srcA, long srcB, long dstA, long dstB, size_t n);

/* How a regular layout gives its tiles (numbered row-major) to devices. */
typedef enum { gocollMapBlocks = 0, gocollMapCyclic = 1 } gocollMapAssign_t;

/* A resource map: an ndims-dimensional index space of extent[], cut into
 * tiles of tile[] (0: the whole dimension; edge tiles may be smaller), the
 * tiles given to devices in contiguous runs (gocollMapBlocks; weights[],
 * one per device, make the runs proportional to device speeds; NULL:
 * equal) or in turn (gocollMapCyclic). Block along dimension d: tile 1 in
 * d, 0 elsewhere, blocks; block-cyclic(x) along d: tile x in d, 0
 * elsewhere, cyclic. */
typedef struct {
  int ndims;               /* 1..8 */
  const size_t* extent;    /* ndims entries */
  const size_t* tile;      /* ndims entries */
  int devices;
  gocollMapAssign_t assign;
  const double* weights;   /* gocollMapBlocks only; devices entries or NULL */
} gocollMap_t;

/* A redistribution between two maps of the same index space; its schedule
 * has as few steps as the busiest processor has messages.
 * Errors: gocollInvalidArgument (NULL arguments, a bad map, spaces that
 * differ). */
gocollResult_t gocollPlanMaps(gocollPlan_t* plan, const gocollMap_t* src, const gocollMap_t* dst);

/* Places the plan's processors on ranks: source processor i on
 * srcRanks[i], destination processor j on dstRanks[j] (arrays of the
 * layouts' processor counts; NULL keeps i on rank i). A rank may be a
 * source and a destination processor; its messages to itself are copies.
 * Errors: gocollInvalidArgument (plan not valid, a rank twice in one array). */
gocollResult_t gocollPlanPlace(gocollPlan_t plan, const int* srcRanks, const int* dstRanks);

/* Stores how many elements rank holds in the source and in the destination
 * layout: the sizes of the buffers it passes to gocollRedistribute.
 * Errors: gocollInvalidArgument (plan not valid, a NULL pointer). */
gocollResult_t gocollPlanCounts(gocollPlan_t plan, int rank, size_t* srcCount, size_t* dstCount);

/* Writes the plan as NUL-terminated JSON into buf (as
 * gocollCommGetTopology): {"from": the layouts, "q": senders, "p":
 * receivers, "com": [[elements sender i sends receiver j]], "steps":
 * [[{"src", "dst", "elems"}]], "method": "algorithm-1" | "algorithm-2" |
 * …coloring, "lower_bound": steps no schedule can beat}. */
gocollResult_t gocollPlanGetJSON(gocollPlan_t plan, char* buf, size_t len, size_t* needed);

/* Runs the plan: every rank of comm that plays a processor calls it with
 * the same plan; src holds this rank's elements in the source layout, dst
 * receives its elements in the destination layout (NULL where the rank
 * holds none); any datatype. Every element moves exactly once; strided
 * elements are packed and unpacked only at the two ends.
 * Errors: as the collectives (gocollInvalidArgument for a NULL buffer the
 * rank needs or an invalid plan; gocollTimeout, gocollRemoteError…). */
gocollResult_t gocollRedistribute(gocollPlan_t plan, const void* src, void* dst, gocollDataType_t datatype,
                                  gocollComm_t comm);

/* Frees a plan. Errors: gocollInvalidArgument (unknown), gocollInvalidUsage (freed). */
gocollResult_t gocollPlanDestroy(gocollPlan_t plan);

/* ---------------------------------------------------------------------------
 * Virtual devices (docs/design/virtual-devices.md): a job written against M virtual devices
 * with a logical topology, placed on the ranks of a communicator, one or
 * several per rank, and moved to other ranks (with their buffers) by a
 * migration while the job runs.
 *
 * A rank drives the devices it hosts together: every virtual collective
 * takes an array of buffer pointers with one entry per local device, entry
 * k for the k-th device gocollVCommLocal lists (devices in increasing
 * order). Results do not depend on the placement, to the bit: every
 * reduction folds the M contributions of an element in device order,
 * ((x0 op x1) op x2) ... op x(M-1), and gocollAvg divides that sum by M
 * once. A job on 8 virtual devices gives the same bits on 8, 4 or 2
 * processes, and before and after a migration.
 *
 * The virtual collectives are collectives of the ranks hosting devices;
 * creation and migration are collectives of the whole communicator. Calls
 * on a rank that hosts no device fail with gocollInvalidArgument. Errors
 * are recorded on the parent communicator (gocollGetLastError(comm)). */

/* A virtual communicator (an opaque handle, never dereferenced). */
typedef struct gocollVComm* gocollVComm_t;

/* Creates ndev virtual devices with the logical topology topology ("ring",
 * "mesh:AxB", "torus:AxB", "tree" or "full"; A·B = ndev) on comm: device v
 * on rank place[v] (ndev entries; NULL: in blocks over all ranks, block
 * sizes differing by at most one). Every rank of comm calls it with the
 * same arguments (checked: a difference fails on every rank).
 * Errors: gocollInvalidArgument (NULL, bad topology, a rank out of range,
 * ranks that disagree), and those of a collective. */
gocollResult_t gocollVCommCreate(gocollVComm_t* vcomm, gocollComm_t comm, const char* topology, int ndev,
                                 const int* place);

/* Stores the devices this rank hosts, in increasing order, into
 * devices[0..*n) (room for max entries); *n is set even when max is too
 * small (then gocollInvalidArgument). */
gocollResult_t gocollVCommLocal(gocollVComm_t vcomm, int* devices, int max, int* n);

/* Stores the rank of comm that hosts device dev now. */
gocollResult_t gocollVCommDeviceRank(gocollVComm_t vcomm, int dev, int* rank);

/* Writes, as NUL-terminated JSON into buf (as gocollCommGetTopology), the
 * topology, the placement, this rank's devices and the three routing
 * tables of the current placement on the communicator's topology:
 * {"topology", "place": [rank per device], "local": [devices],
 * "tables": {"virtual": [[neighbour devices] per device],
 * "physical": [{"from", "to", "ranks": [r, r], "link": link id, or null
 * when both devices share a rank}], "in_use": [link ids], "free": [link
 * ids]}}. */
gocollResult_t gocollVCommGetTables(gocollVComm_t vcomm, char* buf, size_t len, size_t* needed);

/* Registers size bytes at buf with local device dev under name: a
 * migration moves them with the device. The memory stays the caller's;
 * registering a name again replaces it. */
gocollResult_t gocollVCommRegister(gocollVComm_t vcomm, int dev, const char* name, void* buf, size_t size);

/* Stores the buffer registered as name with local device dev: the
 * caller's own, or, for a device that arrived in a migration, memory the
 * library allocated, valid until the device leaves this rank or
 * gocollVCommDestroy. */
gocollResult_t gocollVCommGetBuffer(gocollVComm_t vcomm, int dev, const char* name, void** buf, size_t* size);

/* Moves the devices: device v to rank place[v] (NULL: blocks over all
 * ranks). Every buffer registered with a device that changes rank is sent
 * to its new rank, the routing tables follow, and the collectives continue
 * there. Every rank of comm calls it with the same placement, also ranks
 * that host no device before or after; ranks left without devices return
 * gocollSuccess and may destroy the handle. A rank that dies during the
 * move makes the others fail (gocollRemoteError or gocollTimeout), and the
 * handle is then only good for gocollVCommDestroy. */
gocollResult_t gocollVCommMigrate(gocollVComm_t vcomm, const int* place);

/* Registers buf as state every local device holds alike (parameters,
 * momentum, a step counter), kept once on this rank: a migration or a
 * recovery sends one copy to a rank that has none. A name is either shared
 * or per device (gocollVCommRegister). */
gocollResult_t gocollVCommRegisterShared(gocollVComm_t vcomm, const char* name, void* buf, size_t size);

/* After ranks died (or joined): moves the virtual devices onto newcomm,
 * made from the handle's communicator by gocollCommShrink (or
 * gocollCommGrow), and makes it the handle's communicator. Every rank of
 * newcomm calls it. Surviving devices stay where they are (place NULL;
 * else device v goes to rank place[v] of newcomm), a lost device goes to a
 * survivor with the shared state (gocollVCommRegisterShared) it already
 * has or gets from a live holder. step is how many steps this rank's
 * shared state has completed; ranks may differ by one (a reduction that
 * reached some ranks only): every rank ends with the state of the highest,
 * stored in *agreedStep (may be NULL), and goes on from there. A lost
 * device's own buffers (gocollVCommRegister) cannot be restored:
 * gocollInvalidUsage, as are fewer than minRanks ranks in newcomm (0: any).
 * Every rank passes the same minRanks and place (ranks that differ:
 * gocollInvalidArgument on every rank, nothing moved). A rank dying
 * during it gives gocollRemoteError or gocollTimeout on the others:
 * shrink again and call it again on the smaller communicator. The handle's
 * buffers change only when it returns gocollSuccess: after a failure they
 * hold the state they held before, and step is still what to pass. The
 * old communicator stays the caller's (destroy it). */
gocollResult_t gocollVCommRecover(gocollVComm_t vcomm, gocollComm_t newcomm, uint64_t step, int minRanks,
                                  const int* place, uint64_t* agreedStep);

/* The joining process's side of gocollVCommRecover: comm is what
 * gocollCommJoin returned, the members call gocollVCommRecover on the
 * communicator their gocollCommGrow made, with the same topology, ndev,
 * minRanks and place (gocollVCommJoinPlace; gocollVCommJoin is place
 * NULL). The new handle may host devices (the balance gives joiners
 * some); their shared state arrives in memory the library allocated
 * (gocollVCommGetBuffer; register your own with gocollVCommRegisterShared
 * after copying it, if you like). *agreedStep (may be NULL) is the step
 * the job goes on from. A joiner whose topology, ndev, minRanks or place
 * differ from the members' is refused: gocollInvalidArgument here, and
 * the members' gocollVCommRecover succeeds without it (it hosts no
 * device; it leaves newcomm, so the members' next call on newcomm itself
 * fails as after a death: shrink it). */
gocollResult_t gocollVCommJoin(gocollVComm_t* vcomm, gocollComm_t comm, const char* topology, int ndev, int minRanks,
                               uint64_t* agreedStep);
gocollResult_t gocollVCommJoinPlace(gocollVComm_t* vcomm, gocollComm_t comm, const char* topology, int ndev,
                                    int minRanks, const int* place, uint64_t* agreedStep);

/* Waits for the calls in flight and frees the handle and the buffers the
 * library allocated; the communicator stays. */
gocollResult_t gocollVCommDestroy(gocollVComm_t vcomm);

/* The virtual collectives: as the plain ones, with arrays of buffers (one
 * per local device). sendbuffs and recvbuffs may be the same array (in
 * place). Broadcast reads sendbuffs only at the root device; Reduce writes
 * recvbuffs only at the root; other entries may be NULL. AllGather's
 * recvbuffs hold ndev·count elements; ReduceScatter's sendbuffs and both
 * AllToAll buffers hold ndev·count. The I forms return a request for
 * gocollTest/gocollWait; calls run in the order they were issued. */
gocollResult_t gocollVAllReduce(const void* const* sendbuffs, void* const* recvbuffs, size_t count,
                                gocollDataType_t datatype, gocollRedOp_t op, gocollVComm_t vcomm);
gocollResult_t gocollVIAllReduce(const void* const* sendbuffs, void* const* recvbuffs, size_t count,
                                 gocollDataType_t datatype, gocollRedOp_t op, gocollVComm_t vcomm,
                                 gocollRequest_t* request);
gocollResult_t gocollVReduce(const void* const* sendbuffs, void* const* recvbuffs, size_t count,
                             gocollDataType_t datatype, gocollRedOp_t op, int root, gocollVComm_t vcomm);
gocollResult_t gocollVIReduce(const void* const* sendbuffs, void* const* recvbuffs, size_t count,
                              gocollDataType_t datatype, gocollRedOp_t op, int root, gocollVComm_t vcomm,
                              gocollRequest_t* request);
gocollResult_t gocollVBroadcast(const void* const* sendbuffs, void* const* recvbuffs, size_t count,
                                gocollDataType_t datatype, int root, gocollVComm_t vcomm);
gocollResult_t gocollVIBroadcast(const void* const* sendbuffs, void* const* recvbuffs, size_t count,
                                 gocollDataType_t datatype, int root, gocollVComm_t vcomm,
                                 gocollRequest_t* request);
gocollResult_t gocollVAllGather(const void* const* sendbuffs, void* const* recvbuffs, size_t sendcount,
                                gocollDataType_t datatype, gocollVComm_t vcomm);
gocollResult_t gocollVIAllGather(const void* const* sendbuffs, void* const* recvbuffs, size_t sendcount,
                                 gocollDataType_t datatype, gocollVComm_t vcomm, gocollRequest_t* request);
gocollResult_t gocollVReduceScatter(const void* const* sendbuffs, void* const* recvbuffs, size_t recvcount,
                                    gocollDataType_t datatype, gocollRedOp_t op, gocollVComm_t vcomm);
gocollResult_t gocollVIReduceScatter(const void* const* sendbuffs, void* const* recvbuffs, size_t recvcount,
                                     gocollDataType_t datatype, gocollRedOp_t op, gocollVComm_t vcomm,
                                     gocollRequest_t* request);
gocollResult_t gocollVAllToAll(const void* const* sendbuffs, void* const* recvbuffs, size_t count,
                               gocollDataType_t datatype, gocollVComm_t vcomm);
gocollResult_t gocollVIAllToAll(const void* const* sendbuffs, void* const* recvbuffs, size_t count,
                                gocollDataType_t datatype, gocollVComm_t vcomm, gocollRequest_t* request);
gocollResult_t gocollVBarrier(gocollVComm_t vcomm);

/* Runs a redistribution plan whose processors are virtual devices (sender
 * i and receiver j are devices i and j, wherever they are placed now):
 * srcbuffs[k] and dstbuffs[k] hold local device k's elements in the source
 * and destination layouts (gocollPlanCounts's sizes for processor
 * numbers; NULL entries where a device holds none). gocollPlanPlace does
 * not apply: the placement is the virtual communicator's. Messages between
 * devices on one rank are copies.
 * Errors: as gocollRedistribute; gocollInvalidArgument when the plan has
 * more processors than there are devices. */
gocollResult_t gocollVRedistribute(gocollPlan_t plan, const void* const* srcbuffs, void* const* dstbuffs,
                                   gocollDataType_t datatype, gocollVComm_t vcomm);

/* ------------------------------------------------------------------------- */
/* All-to-all with a layout per block                                        */
/* ------------------------------------------------------------------------- */

/* The layout of one block of gocollAllToAllw: count runs of blocklen
 * elements of datatype, each run starting stride elements after the one
 * before, like MPI_Type_vector(count, blocklen, stride, datatype). count 1
 * is a contiguous block of blocklen elements (stride is then ignored);
 * count or blocklen 0 is an empty block. Runs may not overlap: stride >=
 * blocklen when count > 1. */
typedef struct {
  gocollDataType_t datatype;
  size_t count;
  size_t blocklen;
  size_t stride;
} gocollBlockType_t;

/* Like gocollAllToAllv with a layout per block on each side, as
 * MPI_Alltoallw: rank i sends rank j the block that starts sdispls[j]
 * BYTES into sendbuff, laid out as sendtypes[j]; rank j stores it
 * rdispls[i] bytes into recvbuff, laid out as recvtypes[i]. The four arrays
 * have nranks entries and must not be NULL. The two sides of a block must
 * hold as many bytes; their layouts and datatypes may differ (a strided
 * vector may arrive contiguous, or the other way round), and a difference
 * in size fails the call with gocollInvalidUsage on the rank that finds it
 * ("counts differ between ranks", naming both ranks). Blocks are packed
 * where they leave sendbuff and unpacked where they land, nowhere in
 * between. No receive block may overlap another or a send block (runs of
 * strided blocks may interleave as long as they share no byte); there is
 * no in-place form.
 * GOCOLL_ALGO alltoallw=pairwise (default), aggregate or aggregate-tree.
 * Errors: the common ones; gocollInvalidArgument for a NULL array, an
 * unknown datatype, overlapping runs or blocks, or a block past the end of
 * a buffer too large for memory. */
gocollResult_t gocollAllToAllw(const void* sendbuff, const size_t sdispls[], const gocollBlockType_t sendtypes[],
                               void* recvbuff, const size_t rdispls[], const gocollBlockType_t recvtypes[],
                               gocollComm_t comm);
/* Non-blocking gocollAllToAllw (see "Non-blocking collectives"). The four
 * arrays are copied before it returns: they may be freed or changed at once
 * (the buffers may not). */
gocollResult_t gocollIAllToAllw(const void* sendbuff, const size_t sdispls[], const gocollBlockType_t sendtypes[],
                                void* recvbuff, const size_t rdispls[], const gocollBlockType_t recvtypes[],
                                gocollComm_t comm, gocollRequest_t* request);

#ifdef __cplusplus
}
#endif

#endif /* GOCOLL_H_ */
