/* Virtual devices through gocoll.h: 8 devices of a ring, placed in blocks
 * over the ranks, each with a registered weight vector; allreduce (blocking
 * and non-blocking), allgather, broadcast, the routing tables, a migration
 * onto the first half of the ranks (the others leave), and the allreduce
 * again, which must give the same bits as before. Run with the launcher
 * environment; prints "OK rank R of N".
 *
 *   vcomm env */
#include "common.h"

#define NDEV 8
#define COUNT 4099

static gocollComm_t comm;
static int rank, nranks;

/* Device v's weights: values whose float sum depends on the order. */
static float weight(int v, int i) { return (float)((v + 1) * 0.1 + i * 1e-3) * (v % 2 ? -1.0f : 1.0f) + 1e7f * (v == 3); }

static float reference(int i) {
  float acc = weight(0, i);
  for (int v = 1; v < NDEV; v++) acc += weight(v, i);
  return acc;
}

static int local_devices(gocollVComm_t vc, int* devs) {
  int n = 0;
  CHECK_COMM(gocollVCommLocal(vc, devs, NDEV, &n), comm);
  return n;
}

/* Allreduces the registered "w" buffers into fresh ones and checks every
 * element against the fold in device order. */
static void check_allreduce(gocollVComm_t vc, const char* when) {
  int devs[NDEV];
  int n = local_devices(vc, devs);
  const void* send[NDEV];
  void* recv[NDEV];
  for (int k = 0; k < n; k++) {
    void* buf;
    size_t size;
    CHECK_COMM(gocollVCommGetBuffer(vc, devs[k], "w", &buf, &size), comm);
    if (size != COUNT * sizeof(float)) FAIL("%s: device %d buffer of %zu bytes", when, devs[k], size);
    send[k] = buf;
    recv[k] = malloc(COUNT * sizeof(float));
  }
  CHECK_COMM(gocollVAllReduce(send, recv, COUNT, gocollFloat32, gocollSum, vc), comm);
  for (int k = 0; k < n; k++) {
    const float* r = recv[k];
    for (int i = 0; i < COUNT; i++)
      if (memcmp(&r[i], &(float){reference(i)}, sizeof(float)) != 0)
        FAIL("%s: device %d element %d = %.9g, want %.9g", when, devs[k], i, r[i], reference(i));
    free(recv[k]);
  }
  /* The same with the send vectors back to back in one allocation (read in
   * place) and one result buffer for every device (written once). */
  float* all = malloc((size_t)n * COUNT * sizeof(float));
  float* one = malloc(COUNT * sizeof(float));
  for (int k = 0; k < n; k++) {
    memcpy(all + (size_t)k * COUNT, send[k], COUNT * sizeof(float));
    send[k] = all + (size_t)k * COUNT;
    recv[k] = one;
  }
  CHECK_COMM(gocollVAllReduce(send, recv, COUNT, gocollFloat32, gocollSum, vc), comm);
  for (int i = 0; i < COUNT; i++)
    if (memcmp(&one[i], &(float){reference(i)}, sizeof(float)) != 0)
      FAIL("%s, contiguous send: element %d = %.9g, want %.9g", when, i, one[i], reference(i));
  free(all);
  free(one);
}

int main(int argc, char** argv) {
  if (argc < 2 || strcmp(argv[1], "env") != 0) {
    fprintf(stderr, "usage: %s env\n", argv[0]);
    return 64;
  }
  CHECK(gocollCommInitFromEnv(&comm));
  CHECK_COMM(gocollCommCount(comm, &nranks), comm);
  CHECK_COMM(gocollCommUserRank(comm, &rank), comm);
  g_rank = rank;

  gocollVComm_t vc;
  if (gocollVCommCreate(&vc, comm, "torus:3x3", NDEV, NULL) != gocollInvalidArgument)
    FAIL("a 3x3 torus of 8 devices was accepted");
  CHECK_COMM(gocollVCommCreate(&vc, comm, "ring", NDEV, NULL), comm);
  int devs[NDEV];
  int n = local_devices(vc, devs);
  float* mine[NDEV];
  for (int k = 0; k < n; k++) {
    int at = -1;
    CHECK_COMM(gocollVCommDeviceRank(vc, devs[k], &at), comm);
    if (at != rank) FAIL("device %d is on rank %d, listed here", devs[k], at);
    mine[k] = malloc(COUNT * sizeof(float));
    for (int i = 0; i < COUNT; i++) mine[k][i] = weight(devs[k], i);
    CHECK_COMM(gocollVCommRegister(vc, devs[k], "w", mine[k], COUNT * sizeof(float)), comm);
  }
  if (nranks > 1 && gocollVCommRegister(vc, (devs[n - 1] + 1) % NDEV, "w", mine[0], 4) != gocollInvalidArgument)
    FAIL("registering with another rank's device was accepted");
  check_allreduce(vc, "before");

  /* Non-blocking, in place. */
  void* inplace[NDEV];
  for (int k = 0; k < n; k++) {
    inplace[k] = malloc(COUNT * sizeof(float));
    memcpy(inplace[k], mine[k], COUNT * sizeof(float));
  }
  gocollRequest_t req;
  CHECK_COMM(gocollVIAllReduce((const void* const*)inplace, inplace, COUNT, gocollFloat32, gocollSum, vc, &req), comm);
  CHECK_COMM(gocollWait(req), comm);
  for (int k = 0; k < n; k++) {
    if (memcmp(&((float*)inplace[k])[7], &(float){reference(7)}, sizeof(float)) != 0) FAIL("in-place allreduce");
    free(inplace[k]);
  }

  /* Allgather of each device's id, broadcast from device 5. */
  int ids[NDEV], gathered[NDEV][NDEV];
  const void* s[NDEV];
  void* r[NDEV];
  for (int k = 0; k < n; k++) ids[k] = 100 + devs[k], s[k] = &ids[k], r[k] = gathered[k];
  CHECK_COMM(gocollVAllGather(s, r, 1, gocollInt32, vc), comm);
  for (int k = 0; k < n; k++)
    for (int v = 0; v < NDEV; v++)
      if (gathered[k][v] != 100 + v) FAIL("allgather: device %d slot %d = %d", devs[k], v, gathered[k][v]);
  int got[NDEV];
  for (int k = 0; k < n; k++) r[k] = &got[k];
  CHECK_COMM(gocollVBroadcast(s, r, 1, gocollInt32, 5, vc), comm);
  for (int k = 0; k < n; k++)
    if (got[k] != 105) FAIL("broadcast: device %d got %d", devs[k], got[k]);
  CHECK_COMM(gocollVBarrier(vc), comm);

  size_t need = 0;
  CHECK_COMM(gocollVCommGetTables(vc, NULL, 0, &need), comm);
  char* text = malloc(need);
  CHECK_COMM(gocollVCommGetTables(vc, text, need, &need), comm);
  if (!strstr(text, "\"virtual\":[[1,7],[0,2]") || !strstr(text, "\"in_use\":")) FAIL("tables: %.300s", text);
  free(text);

  /* Move every device onto the first half of the ranks. */
  int half = nranks / 2 > 0 ? nranks / 2 : 1;
  int place[NDEV];
  for (int v = 0; v < NDEV; v++) place[v] = v * half / NDEV;
  CHECK_COMM(gocollVCommMigrate(vc, place), comm);
  int m = local_devices(vc, devs);
  if ((rank < half) != (m > 0)) FAIL("after the migration rank %d hosts %d devices", rank, m);
  if (m > 0) {
    check_allreduce(vc, "after");
  } else if (gocollVBarrier(vc) != gocollInvalidArgument) {
    FAIL("a collective on a rank without devices was accepted");
  }
  CHECK_COMM(gocollVCommDestroy(vc), comm);
  if (gocollVCommDestroy(vc) != gocollInvalidUsage) FAIL("destroying a virtual communicator twice");
  for (int k = 0; k < n; k++) free(mine[k]);
  CHECK_COMM(gocollCommDestroy(comm), NULL);
  printf("OK rank %d of %d\n", rank, nranks);
  return 0;
}
