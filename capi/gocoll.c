// The public C entry points of libgocoll (declared in gocoll.h). Each one
// turns opaque handles into integers and forwards to a Go function exported
// by capi.go (capi_*; hidden from the library's dynamic symbol table by the
// version script in build/). Nothing here keeps state except the calling
// thread's last-error text.

#include <stdint.h>
#include <string.h>

#include "gocoll.h"
#include "_cgo_export.h"

// ---------------------------------------------------------------------------
// Per-thread last error (gocollGetLastError(NULL)).

#define CAPI_ERRLEN 1024

static __thread char capi_thread_err[CAPI_ERRLEN];

// capi_set_thread_error is called from Go (on the calling C thread) when a
// call fails.
void capi_set_thread_error(const char* msg, size_t n) {
  if (n >= CAPI_ERRLEN) n = CAPI_ERRLEN - 1;
  memcpy(capi_thread_err, msg, n);
  capi_thread_err[n] = '\0';
}

static uintptr_t h(const void* handle) { return (uintptr_t)handle; }

// ---------------------------------------------------------------------------
// Library, errors

gocollResult_t gocollGetVersion(int* version) {
  return (gocollResult_t)capi_GetVersion(version);
}

const char* gocollGetErrorString(gocollResult_t result) {
  switch (result) {
    case gocollSuccess: return "no error";
    case gocollUnhandledError: return "unhandled error";
    case gocollSystemError: return "system error (socket, shared memory or memory setup failed)";
    case gocollInternalError: return "internal error (a bug in gocoll)";
    case gocollInvalidArgument: return "invalid argument";
    case gocollInvalidUsage: return "invalid usage";
    case gocollRemoteError: return "remote error (a peer process died or aborted)";
    case gocollInProgress: return "operation in progress";
    case gocollTimeout: return "timed out waiting for a peer";
    case gocollRevoked: return "communicator revoked (shrink it to go on)";
    case gocollExcluded: return "excluded: the other ranks went on without this one";
    case gocollNoQuorum: return "no quorum: half or fewer of the ranks could agree (majority quorum); shrinking again will not help";
    default: return "unknown result code";
  }
}

const char* gocollGetLastError(gocollComm_t comm) {
  const char* s = capi_GetLastError(h(comm));
  if (s != NULL) return s;
  return capi_thread_err;
}

// ---------------------------------------------------------------------------
// Communicators

gocollResult_t gocollGetUniqueId(gocollUniqueId* id) {
  return (gocollResult_t)capi_GetUniqueId(id == NULL ? NULL : id->internal);
}

gocollResult_t gocollCommInitRank(gocollComm_t* comm, int nranks, gocollUniqueId id, int rank) {
  uintptr_t out = 0;
  gocollResult_t rc = (gocollResult_t)capi_CommInitRank(comm != NULL, &out, nranks, id.internal, rank);
  if (rc == gocollSuccess) *comm = (gocollComm_t)out;
  return rc;
}

gocollResult_t gocollCommInitFromEnv(gocollComm_t* comm) {
  uintptr_t out = 0;
  gocollResult_t rc = (gocollResult_t)capi_CommInitFromEnv(comm != NULL, &out);
  if (rc == gocollSuccess) *comm = (gocollComm_t)out;
  return rc;
}

gocollResult_t gocollCommInitRankConfig(gocollComm_t* comm, int nranks, gocollUniqueId id, int rank,
                                        const gocollConfig_t* config) {
  uintptr_t out = 0;
  gocollResult_t rc = (gocollResult_t)capi_CommInitRankConfig(comm != NULL, &out, nranks, id.internal, rank,
                                                               (gocollConfig_t*)config);
  if (rc == gocollSuccess) *comm = (gocollComm_t)out;
  return rc;
}

gocollResult_t gocollCommInitFromEnvConfig(gocollComm_t* comm, const gocollConfig_t* config) {
  uintptr_t out = 0;
  gocollResult_t rc = (gocollResult_t)capi_CommInitFromEnvConfig(comm != NULL, &out, (gocollConfig_t*)config);
  if (rc == gocollSuccess) *comm = (gocollComm_t)out;
  return rc;
}

gocollResult_t gocollCommSplit(gocollComm_t comm, int color, int key, gocollComm_t* newcomm) {
  uintptr_t out = 0;
  gocollResult_t rc = (gocollResult_t)capi_CommSplit(h(comm), color, key, newcomm != NULL, &out);
  if (rc == gocollSuccess) *newcomm = (gocollComm_t)out;
  return rc;
}

gocollResult_t gocollCommDestroy(gocollComm_t comm) {
  return (gocollResult_t)capi_CommDestroy(h(comm));
}

gocollResult_t gocollCommRevoke(gocollComm_t comm, int flags) {
  return (gocollResult_t)capi_CommRevoke(h(comm), flags);
}

gocollResult_t gocollCommShrink(gocollComm_t comm, const int* excludeRanks, int excludeCount,
                                gocollComm_t* newcomm, const gocollConfig_t* config, int flags) {
  uintptr_t out = 0;
  gocollResult_t rc = (gocollResult_t)capi_CommShrink(h(comm), (int*)excludeRanks, excludeCount, newcomm != NULL,
                                                      &out, (gocollConfig_t*)config, flags);
  if (rc == gocollSuccess) *newcomm = (gocollComm_t)out;
  return rc;
}

gocollResult_t gocollCommGetFailed(gocollComm_t comm, int* ranks, int max, int* n) {
  return (gocollResult_t)capi_CommGetFailed(h(comm), ranks, max, n != NULL, n);
}

gocollResult_t gocollCommJoinInfo(gocollComm_t comm, char* buf, size_t len, size_t* needed) {
  return (gocollResult_t)capi_CommJoinInfo(h(comm), buf, len, needed);
}

gocollResult_t gocollCommJoiners(gocollComm_t comm, int* n) {
  return (gocollResult_t)capi_CommJoiners(h(comm), n != NULL, n);
}

gocollResult_t gocollCommGrow(gocollComm_t comm, int nJoiners, gocollComm_t* newcomm) {
  uintptr_t out = 0;
  gocollResult_t rc = (gocollResult_t)capi_CommGrow(h(comm), nJoiners, newcomm != NULL, &out);
  if (rc == gocollSuccess) *newcomm = (gocollComm_t)out;
  return rc;
}

gocollResult_t gocollCommJoin(gocollComm_t* comm, const char* joinInfo, const gocollUniqueId* id,
                              const gocollConfig_t* config) {
  uintptr_t out = 0;
  gocollResult_t rc = (gocollResult_t)capi_CommJoin(comm != NULL, &out, (char*)joinInfo,
                                                    id ? (char*)id->internal : NULL, (gocollConfig_t*)config);
  if (rc == gocollSuccess) *comm = (gocollComm_t)out;
  return rc;
}

gocollResult_t gocollCommAbort(gocollComm_t comm) {
  return (gocollResult_t)capi_CommAbort(h(comm));
}

gocollResult_t gocollCommCount(const gocollComm_t comm, int* count) {
  return (gocollResult_t)capi_CommCount(h(comm), count);
}

gocollResult_t gocollCommUserRank(const gocollComm_t comm, int* rank) {
  return (gocollResult_t)capi_CommUserRank(h(comm), rank);
}

gocollResult_t gocollCommGetTopology(gocollComm_t comm, char* buf, size_t len, size_t* needed) {
  return (gocollResult_t)capi_CommGetTopology(h(comm), buf, len, needed);
}

gocollResult_t gocollCommDumpState(gocollComm_t comm, char* path, size_t len) {
  return (gocollResult_t)capi_CommDumpState(h(comm), path, len);
}

gocollResult_t gocollCommGetAsyncError(gocollComm_t comm, gocollResult_t* asyncError) {
  int code = 0;
  gocollResult_t rc = (gocollResult_t)capi_CommGetAsyncError(h(comm), asyncError != NULL, &code);
  if (rc == gocollSuccess) *asyncError = (gocollResult_t)code;
  return rc;
}

// ---------------------------------------------------------------------------
// Memory

gocollResult_t gocollMemAlloc(void** ptr, size_t size, gocollComm_t comm) {
  void* out = NULL;
  gocollResult_t rc = (gocollResult_t)capi_MemAlloc(ptr != NULL, &out, size, h(comm));
  if (rc == gocollSuccess) *ptr = out;
  return rc;
}

gocollResult_t gocollMemFree(void* ptr, gocollComm_t comm) {
  return (gocollResult_t)capi_MemFree(ptr, h(comm));
}

// ---------------------------------------------------------------------------
// Collectives. Every blocking call and its I-form share one Go function,
// whose last three arguments say: non-blocking?, was the caller's request
// pointer non-NULL?, where to store the new request handle.

static gocollResult_t finish(gocollResult_t rc, gocollRequest_t* request, uintptr_t out) {
  if (rc == gocollSuccess) *request = (gocollRequest_t)out;
  return rc;
}

gocollResult_t gocollAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                               gocollDataType_t datatype, gocollRedOp_t op, gocollComm_t comm) {
  return (gocollResult_t)capi_AllReduce((void*)sendbuff, recvbuff, count, datatype, op, h(comm), 0, 0, NULL);
}

gocollResult_t gocollIAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                gocollDataType_t datatype, gocollRedOp_t op, gocollComm_t comm,
                                gocollRequest_t* request) {
  uintptr_t out = 0;
  gocollResult_t rc = (gocollResult_t)capi_AllReduce((void*)sendbuff, recvbuff, count, datatype, op, h(comm),
                                                     1, request != NULL, &out);
  return finish(rc, request, out);
}

gocollResult_t gocollReduce(const void* sendbuff, void* recvbuff, size_t count,
                            gocollDataType_t datatype, gocollRedOp_t op, int root, gocollComm_t comm) {
  return (gocollResult_t)capi_Reduce((void*)sendbuff, recvbuff, count, datatype, op, root, h(comm), 0, 0, NULL);
}

gocollResult_t gocollIReduce(const void* sendbuff, void* recvbuff, size_t count,
                             gocollDataType_t datatype, gocollRedOp_t op, int root, gocollComm_t comm,
                             gocollRequest_t* request) {
  uintptr_t out = 0;
  gocollResult_t rc = (gocollResult_t)capi_Reduce((void*)sendbuff, recvbuff, count, datatype, op, root, h(comm),
                                                  1, request != NULL, &out);
  return finish(rc, request, out);
}

gocollResult_t gocollBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                               gocollDataType_t datatype, int root, gocollComm_t comm) {
  return (gocollResult_t)capi_Broadcast((void*)sendbuff, recvbuff, count, datatype, root, h(comm), 0, 0, NULL);
}

gocollResult_t gocollIBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                gocollDataType_t datatype, int root, gocollComm_t comm,
                                gocollRequest_t* request) {
  uintptr_t out = 0;
  gocollResult_t rc = (gocollResult_t)capi_Broadcast((void*)sendbuff, recvbuff, count, datatype, root, h(comm),
                                                     1, request != NULL, &out);
  return finish(rc, request, out);
}

gocollResult_t gocollAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                               gocollDataType_t datatype, gocollComm_t comm) {
  return (gocollResult_t)capi_AllGather((void*)sendbuff, recvbuff, sendcount, datatype, h(comm), 0, 0, NULL);
}

gocollResult_t gocollIAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                gocollDataType_t datatype, gocollComm_t comm, gocollRequest_t* request) {
  uintptr_t out = 0;
  gocollResult_t rc = (gocollResult_t)capi_AllGather((void*)sendbuff, recvbuff, sendcount, datatype, h(comm),
                                                     1, request != NULL, &out);
  return finish(rc, request, out);
}

gocollResult_t gocollReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                   gocollDataType_t datatype, gocollRedOp_t op, gocollComm_t comm) {
  return (gocollResult_t)capi_ReduceScatter((void*)sendbuff, recvbuff, recvcount, datatype, op, h(comm), 0, 0, NULL);
}

gocollResult_t gocollIReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                    gocollDataType_t datatype, gocollRedOp_t op, gocollComm_t comm,
                                    gocollRequest_t* request) {
  uintptr_t out = 0;
  gocollResult_t rc = (gocollResult_t)capi_ReduceScatter((void*)sendbuff, recvbuff, recvcount, datatype, op,
                                                         h(comm), 1, request != NULL, &out);
  return finish(rc, request, out);
}

gocollResult_t gocollAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                              gocollDataType_t datatype, gocollComm_t comm) {
  return (gocollResult_t)capi_AllToAll((void*)sendbuff, recvbuff, count, datatype, h(comm), 0, 0, NULL);
}

gocollResult_t gocollIAllToAll(const void* sendbuff, void* recvbuff, size_t count,
                               gocollDataType_t datatype, gocollComm_t comm, gocollRequest_t* request) {
  uintptr_t out = 0;
  gocollResult_t rc = (gocollResult_t)capi_AllToAll((void*)sendbuff, recvbuff, count, datatype, h(comm),
                                                    1, request != NULL, &out);
  return finish(rc, request, out);
}

gocollResult_t gocollAllToAllv(const void* sendbuff, const size_t sendcounts[], const size_t sdispls[],
                               void* recvbuff, const size_t recvcounts[], const size_t rdispls[],
                               gocollDataType_t datatype, gocollComm_t comm) {
  return (gocollResult_t)capi_AllToAllv((void*)sendbuff, (size_t*)sendcounts, (size_t*)sdispls, recvbuff,
                                        (size_t*)recvcounts, (size_t*)rdispls, datatype, h(comm), 0, 0, NULL);
}

gocollResult_t gocollIAllToAllv(const void* sendbuff, const size_t sendcounts[], const size_t sdispls[],
                                void* recvbuff, const size_t recvcounts[], const size_t rdispls[],
                                gocollDataType_t datatype, gocollComm_t comm, gocollRequest_t* request) {
  uintptr_t out = 0;
  gocollResult_t rc = (gocollResult_t)capi_AllToAllv((void*)sendbuff, (size_t*)sendcounts, (size_t*)sdispls,
                                                     recvbuff, (size_t*)recvcounts, (size_t*)rdispls, datatype,
                                                     h(comm), 1, request != NULL, &out);
  return finish(rc, request, out);
}

gocollResult_t gocollSend(const void* sendbuff, size_t count, gocollDataType_t datatype, int peer,
                          gocollComm_t comm) {
  return (gocollResult_t)capi_SendRecv(1, (void*)sendbuff, count, datatype, peer, 0, h(comm), 0, 0, NULL);
}

gocollResult_t gocollISend(const void* sendbuff, size_t count, gocollDataType_t datatype, int peer,
                           gocollComm_t comm, gocollRequest_t* request) {
  uintptr_t out = 0;
  gocollResult_t rc = (gocollResult_t)capi_SendRecv(1, (void*)sendbuff, count, datatype, peer, 0, h(comm),
                                                    1, request != NULL, &out);
  return finish(rc, request, out);
}

gocollResult_t gocollRecv(void* recvbuff, size_t count, gocollDataType_t datatype, int peer,
                          gocollComm_t comm) {
  return (gocollResult_t)capi_SendRecv(0, recvbuff, count, datatype, peer, 0, h(comm), 0, 0, NULL);
}

gocollResult_t gocollIRecv(void* recvbuff, size_t count, gocollDataType_t datatype, int peer,
                           gocollComm_t comm, gocollRequest_t* request) {
  uintptr_t out = 0;
  gocollResult_t rc = (gocollResult_t)capi_SendRecv(0, recvbuff, count, datatype, peer, 0, h(comm),
                                                    1, request != NULL, &out);
  return finish(rc, request, out);
}

gocollResult_t gocollSendTag(const void* sendbuff, size_t count, gocollDataType_t datatype, int peer,
                             int tag, gocollComm_t comm) {
  return (gocollResult_t)capi_SendRecv(1, (void*)sendbuff, count, datatype, peer, tag, h(comm), 0, 0, NULL);
}

gocollResult_t gocollISendTag(const void* sendbuff, size_t count, gocollDataType_t datatype, int peer,
                              int tag, gocollComm_t comm, gocollRequest_t* request) {
  uintptr_t out = 0;
  gocollResult_t rc = (gocollResult_t)capi_SendRecv(1, (void*)sendbuff, count, datatype, peer, tag, h(comm),
                                                    1, request != NULL, &out);
  return finish(rc, request, out);
}

gocollResult_t gocollRecvTag(void* recvbuff, size_t count, gocollDataType_t datatype, int peer,
                             int tag, gocollComm_t comm) {
  return (gocollResult_t)capi_SendRecv(0, recvbuff, count, datatype, peer, tag, h(comm), 0, 0, NULL);
}

gocollResult_t gocollIRecvTag(void* recvbuff, size_t count, gocollDataType_t datatype, int peer,
                              int tag, gocollComm_t comm, gocollRequest_t* request) {
  uintptr_t out = 0;
  gocollResult_t rc = (gocollResult_t)capi_SendRecv(0, recvbuff, count, datatype, peer, tag, h(comm),
                                                    1, request != NULL, &out);
  return finish(rc, request, out);
}

gocollResult_t gocollRecvAny(void* recvbuff, size_t count, gocollDataType_t datatype, int tag, int* source,
                             gocollComm_t comm) {
  if (source != NULL) *source = GOCOLL_ANY_SOURCE;
  return (gocollResult_t)capi_RecvAny(recvbuff, count, datatype, tag, source, h(comm), 0, 0, NULL);
}

gocollResult_t gocollIRecvAny(void* recvbuff, size_t count, gocollDataType_t datatype, int tag, int* source,
                              gocollComm_t comm, gocollRequest_t* request) {
  uintptr_t out = 0;
  gocollResult_t rc;
  if (source != NULL) *source = GOCOLL_ANY_SOURCE;
  rc = (gocollResult_t)capi_RecvAny(recvbuff, count, datatype, tag, source, h(comm), 1, request != NULL, &out);
  return finish(rc, request, out);
}

gocollResult_t gocollBarrier(gocollComm_t comm) {
  return (gocollResult_t)capi_Barrier(h(comm), 0, 0, NULL);
}

gocollResult_t gocollIBarrier(gocollComm_t comm, gocollRequest_t* request) {
  uintptr_t out = 0;
  gocollResult_t rc = (gocollResult_t)capi_Barrier(h(comm), 1, request != NULL, &out);
  return finish(rc, request, out);
}

// ---------------------------------------------------------------------------
// Requests

gocollResult_t gocollTest(gocollRequest_t request, int* done) {
  if (done != NULL) *done = 0;
  return (gocollResult_t)capi_Test(h(request), done);
}

gocollResult_t gocollWait(gocollRequest_t request) {
  return (gocollResult_t)capi_Wait(h(request));
}

gocollResult_t gocollWaitTimeout(gocollRequest_t request, int timeout_ms, int* done) {
  if (done != NULL) *done = 0;
  return (gocollResult_t)capi_WaitTimeout(h(request), timeout_ms, done);
}

// ---------------------------------------------------------------------------
// Redistribution plans

gocollResult_t gocollPlanCyclic(gocollPlan_t* plan, int srcProcs, int srcBlock, int dstProcs, int dstBlock,
                                long srcA, long srcB, long dstA, long dstB, size_t n) {
  return (gocollResult_t)capi_PlanCyclic((uintptr_t*)plan, srcProcs, srcBlock, dstProcs, dstBlock, srcA, srcB, dstA, dstB, n);
}

gocollResult_t gocollPlanMaps(gocollPlan_t* plan, const gocollMap_t* src, const gocollMap_t* dst) {
  return (gocollResult_t)capi_PlanMaps((uintptr_t*)plan, (gocollMap_t*)src, (gocollMap_t*)dst);
}

gocollResult_t gocollPlanPlace(gocollPlan_t plan, const int* srcRanks, const int* dstRanks) {
  return (gocollResult_t)capi_PlanPlace(h(plan), (int*)srcRanks, (int*)dstRanks);
}

gocollResult_t gocollPlanCounts(gocollPlan_t plan, int rank, size_t* srcCount, size_t* dstCount) {
  return (gocollResult_t)capi_PlanCounts(h(plan), rank, srcCount, dstCount);
}

gocollResult_t gocollPlanGetJSON(gocollPlan_t plan, char* buf, size_t len, size_t* needed) {
  return (gocollResult_t)capi_PlanGetJSON(h(plan), buf, len, needed);
}

gocollResult_t gocollRedistribute(gocollPlan_t plan, const void* src, void* dst, gocollDataType_t datatype,
                                  gocollComm_t comm) {
  return (gocollResult_t)capi_Redistribute(h(plan), (void*)src, dst, (int)datatype, h(comm));
}

gocollResult_t gocollPlanDestroy(gocollPlan_t plan) { return (gocollResult_t)capi_PlanDestroy(h(plan)); }

// ---------------------------------------------------------------------------
// Virtual devices

gocollResult_t gocollVCommCreate(gocollVComm_t* vcomm, gocollComm_t comm, const char* topology, int ndev,
                                 const int* place) {
  return (gocollResult_t)capi_VCommCreate((uintptr_t*)vcomm, h(comm), (char*)topology, ndev, (int*)place);
}

gocollResult_t gocollVCommLocal(gocollVComm_t vcomm, int* devices, int max, int* n) {
  return (gocollResult_t)capi_VCommLocal(h(vcomm), devices, max, n);
}

gocollResult_t gocollVCommDeviceRank(gocollVComm_t vcomm, int dev, int* rank) {
  return (gocollResult_t)capi_VCommDeviceRank(h(vcomm), dev, rank);
}

gocollResult_t gocollVCommGetTables(gocollVComm_t vcomm, char* buf, size_t len, size_t* needed) {
  return (gocollResult_t)capi_VCommGetTables(h(vcomm), buf, len, needed);
}

gocollResult_t gocollVCommRegister(gocollVComm_t vcomm, int dev, const char* name, void* buf, size_t size) {
  return (gocollResult_t)capi_VCommRegister(h(vcomm), dev, (char*)name, buf, size);
}

gocollResult_t gocollVCommGetBuffer(gocollVComm_t vcomm, int dev, const char* name, void** buf, size_t* size) {
  return (gocollResult_t)capi_VCommGetBuffer(h(vcomm), dev, (char*)name, buf, size);
}

gocollResult_t gocollVCommRegisterShared(gocollVComm_t vcomm, const char* name, void* buf, size_t size) {
  return (gocollResult_t)capi_VCommRegisterShared(h(vcomm), (char*)name, buf, size);
}

gocollResult_t gocollVCommRecover(gocollVComm_t vcomm, gocollComm_t newcomm, uint64_t step, int minRanks,
                                  const int* place, uint64_t* agreedStep) {
  return (gocollResult_t)capi_VCommRecover(h(vcomm), h(newcomm), step, minRanks, (int*)place, agreedStep);
}

gocollResult_t gocollVCommJoin(gocollVComm_t* vcomm, gocollComm_t comm, const char* topology, int ndev, int minRanks,
                               uint64_t* agreedStep) {
  return (gocollResult_t)capi_VCommJoin((uintptr_t*)vcomm, h(comm), (char*)topology, ndev, minRanks, NULL, agreedStep);
}

gocollResult_t gocollVCommJoinPlace(gocollVComm_t* vcomm, gocollComm_t comm, const char* topology, int ndev,
                                    int minRanks, const int* place, uint64_t* agreedStep) {
  return (gocollResult_t)capi_VCommJoin((uintptr_t*)vcomm, h(comm), (char*)topology, ndev, minRanks, (int*)place,
                                        agreedStep);
}

gocollResult_t gocollVCommMigrate(gocollVComm_t vcomm, const int* place) {
  return (gocollResult_t)capi_VCommMigrate(h(vcomm), (int*)place);
}

gocollResult_t gocollVCommDestroy(gocollVComm_t vcomm) { return (gocollResult_t)capi_VCommDestroy(h(vcomm)); }

#define VBUFS(s, r) (void*)(s), (void*)(r)

gocollResult_t gocollVAllReduce(const void* const* s, void* const* r, size_t count, gocollDataType_t dt,
                                gocollRedOp_t op, gocollVComm_t vc) {
  return (gocollResult_t)capi_VAllReduce(VBUFS(s, r), count, (int)dt, (int)op, h(vc), 0, NULL);
}

gocollResult_t gocollVIAllReduce(const void* const* s, void* const* r, size_t count, gocollDataType_t dt,
                                 gocollRedOp_t op, gocollVComm_t vc, gocollRequest_t* req) {
  return (gocollResult_t)capi_VAllReduce(VBUFS(s, r), count, (int)dt, (int)op, h(vc), 1, (uintptr_t*)req);
}

gocollResult_t gocollVReduce(const void* const* s, void* const* r, size_t count, gocollDataType_t dt,
                             gocollRedOp_t op, int root, gocollVComm_t vc) {
  return (gocollResult_t)capi_VReduce(VBUFS(s, r), count, (int)dt, (int)op, root, h(vc), 0, NULL);
}

gocollResult_t gocollVIReduce(const void* const* s, void* const* r, size_t count, gocollDataType_t dt,
                              gocollRedOp_t op, int root, gocollVComm_t vc, gocollRequest_t* req) {
  return (gocollResult_t)capi_VReduce(VBUFS(s, r), count, (int)dt, (int)op, root, h(vc), 1, (uintptr_t*)req);
}

gocollResult_t gocollVBroadcast(const void* const* s, void* const* r, size_t count, gocollDataType_t dt, int root,
                                gocollVComm_t vc) {
  return (gocollResult_t)capi_VBroadcast(VBUFS(s, r), count, (int)dt, root, h(vc), 0, NULL);
}

gocollResult_t gocollVIBroadcast(const void* const* s, void* const* r, size_t count, gocollDataType_t dt, int root,
                                 gocollVComm_t vc, gocollRequest_t* req) {
  return (gocollResult_t)capi_VBroadcast(VBUFS(s, r), count, (int)dt, root, h(vc), 1, (uintptr_t*)req);
}

gocollResult_t gocollVAllGather(const void* const* s, void* const* r, size_t count, gocollDataType_t dt,
                                gocollVComm_t vc) {
  return (gocollResult_t)capi_VAllGather(VBUFS(s, r), count, (int)dt, h(vc), 0, NULL);
}

gocollResult_t gocollVIAllGather(const void* const* s, void* const* r, size_t count, gocollDataType_t dt,
                                 gocollVComm_t vc, gocollRequest_t* req) {
  return (gocollResult_t)capi_VAllGather(VBUFS(s, r), count, (int)dt, h(vc), 1, (uintptr_t*)req);
}

gocollResult_t gocollVReduceScatter(const void* const* s, void* const* r, size_t count, gocollDataType_t dt,
                                    gocollRedOp_t op, gocollVComm_t vc) {
  return (gocollResult_t)capi_VReduceScatter(VBUFS(s, r), count, (int)dt, (int)op, h(vc), 0, NULL);
}

gocollResult_t gocollVIReduceScatter(const void* const* s, void* const* r, size_t count, gocollDataType_t dt,
                                     gocollRedOp_t op, gocollVComm_t vc, gocollRequest_t* req) {
  return (gocollResult_t)capi_VReduceScatter(VBUFS(s, r), count, (int)dt, (int)op, h(vc), 1, (uintptr_t*)req);
}

gocollResult_t gocollVAllToAll(const void* const* s, void* const* r, size_t count, gocollDataType_t dt,
                               gocollVComm_t vc) {
  return (gocollResult_t)capi_VAllToAll(VBUFS(s, r), count, (int)dt, h(vc), 0, NULL);
}

gocollResult_t gocollVIAllToAll(const void* const* s, void* const* r, size_t count, gocollDataType_t dt,
                                gocollVComm_t vc, gocollRequest_t* req) {
  return (gocollResult_t)capi_VAllToAll(VBUFS(s, r), count, (int)dt, h(vc), 1, (uintptr_t*)req);
}

gocollResult_t gocollVBarrier(gocollVComm_t vc) { return (gocollResult_t)capi_VBarrier(h(vc)); }

gocollResult_t gocollVRedistribute(gocollPlan_t plan, const void* const* s, void* const* d, gocollDataType_t dt,
                                   gocollVComm_t vc) {
  return (gocollResult_t)capi_VRedistribute(h(plan), (void*)s, (void*)d, (int)dt, h(vc));
}

// ---------------------------------------------------------------------------
// All-to-all with a layout per block

gocollResult_t gocollAllToAllw(const void* sendbuff, const size_t sdispls[], const gocollBlockType_t sendtypes[],
                               void* recvbuff, const size_t rdispls[], const gocollBlockType_t recvtypes[],
                               gocollComm_t comm) {
  return (gocollResult_t)capi_AllToAllw((void*)sendbuff, (size_t*)sdispls, (gocollBlockType_t*)sendtypes, recvbuff,
                                        (size_t*)rdispls, (gocollBlockType_t*)recvtypes, h(comm), 0, 0, NULL);
}

gocollResult_t gocollIAllToAllw(const void* sendbuff, const size_t sdispls[], const gocollBlockType_t sendtypes[],
                                void* recvbuff, const size_t rdispls[], const gocollBlockType_t recvtypes[],
                                gocollComm_t comm, gocollRequest_t* request) {
  uintptr_t out = 0;
  gocollResult_t rc = (gocollResult_t)capi_AllToAllw((void*)sendbuff, (size_t*)sdispls, (gocollBlockType_t*)sendtypes,
                                                     recvbuff, (size_t*)rdispls, (gocollBlockType_t*)recvtypes, h(comm),
                                                     1, request != NULL, &out);
  return finish(rc, request, out);
}
