/*
 * callcost.c -- what one call of each collective costs through the C ABI on a
 * one-rank communicator: no peer to wait for, so what is measured is the
 * C->Go transition, the argument checks, the engine's bookkeeping and the
 * copy of the rank's own 4 KiB block. build/bench/callcost.sh runs it.
 *
 * Build:  cc -O2 -o callcost build/bench/callcost.c -I<lib>/include -L<lib>/lib \
 *            -Wl,-rpath,<lib>/lib -lgocoll
 * Run:    callcost -i N op          N calls of op after a warm-up, then exit:
 *                                   under callgrind, the difference of two N is
 *                                   the instructions of N2-N1 calls alone
 *         callcost -t N -r R op...  R batches of N calls per op, interleaved
 *                                   op by op; prints "op ns_per_call" with the
 *                                   median over batches
 * Ops: allreduce bcast allgather reduce_scatter alltoall alltoallv (float32,
 * sum, 4 KiB; as build/bench/gocoll_bench.c calls them: bcast in place).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gocoll.h"

#define BYTES 4096
#define COUNT (BYTES / 4)

static gocollComm_t comm;
static float *sbuf, *rbuf;
static size_t counts[1] = {COUNT}, displs[1] = {0};

static void check(gocollResult_t rc, const char *what) {
    if (rc != gocollSuccess) {
        fprintf(stderr, "callcost: %s: %s: %s\n", what, gocollGetErrorString(rc), gocollGetLastError(comm));
        exit(2);
    }
}

static const char *const ops[] = {"allreduce", "bcast", "allgather", "reduce_scatter", "alltoall", "alltoallv", NULL};

static int op_index(const char *name) {
    for (int i = 0; ops[i]; i++)
        if (!strcmp(ops[i], name)) return i;
    fprintf(stderr, "callcost: unknown op %s\n", name);
    exit(2);
}

static void call(int op) {
    gocollResult_t rc = gocollSuccess;
    switch (op) {
    case 0: rc = gocollAllReduce(sbuf, rbuf, COUNT, gocollFloat32, gocollSum, comm); break;
    case 1: rc = gocollBroadcast(rbuf, rbuf, COUNT, gocollFloat32, 0, comm); break;
    case 2: rc = gocollAllGather(sbuf, rbuf, COUNT, gocollFloat32, comm); break;
    case 3: rc = gocollReduceScatter(sbuf, rbuf, COUNT, gocollFloat32, gocollSum, comm); break;
    case 4: rc = gocollAllToAll(sbuf, rbuf, COUNT, gocollFloat32, comm); break;
    case 5: rc = gocollAllToAllv(sbuf, counts, displs, rbuf, counts, displs, gocollFloat32, comm); break;
    }
    check(rc, ops[op]);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    long n = 0, reps = 11;
    int timing = 0, c;
    gocollUniqueId id;
    while ((c = getopt(argc, argv, "i:t:r:")) != -1) {
        switch (c) {
        case 'i': n = atol(optarg); break;
        case 't': n = atol(optarg); timing = 1; break;
        case 'r': reps = atol(optarg); break;
        default: fprintf(stderr, "usage: callcost -i N op | callcost -t N [-r R] op...\n"); return 2;
        }
    }
    if (n <= 0 || optind >= argc || reps <= 0) {
        fprintf(stderr, "usage: callcost -i N op | callcost -t N [-r R] op...\n");
        return 2;
    }
    if (posix_memalign((void **)&sbuf, 64, BYTES) || posix_memalign((void **)&rbuf, 64, BYTES)) return 2;
    for (int i = 0; i < COUNT; i++) sbuf[i] = rbuf[i] = (float)i;
    check(gocollGetUniqueId(&id), "gocollGetUniqueId");
    check(gocollCommInitRank(&comm, 1, id, 0), "gocollCommInitRank");

    int nops = argc - optind, *which = malloc(sizeof(int) * nops);
    for (int i = 0; i < nops; i++) which[i] = op_index(argv[optind + i]);
    for (int i = 0; i < nops; i++) /* warm-up: every path taken once before counting */
        for (int k = 0; k < 1000; k++) call(which[i]);
    if (!timing) {
        for (long k = 0; k < n; k++) call(which[0]);
    } else {
        double *t = malloc(sizeof(double) * reps * nops);
        for (long r = 0; r < reps; r++)
            for (int i = 0; i < nops; i++) {
                double t0 = now();
                for (long k = 0; k < n; k++) call(which[i]);
                t[i * reps + r] = (now() - t0) / n * 1e9;
            }
        for (int i = 0; i < nops; i++) {
            qsort(t + i * reps, reps, sizeof(double), cmp_double);
            printf("%s %.1f\n", ops[which[i]], t[i * reps + reps / 2]);
        }
        free(t);
    }
    check(gocollCommDestroy(comm), "gocollCommDestroy");
    free(which);
    return 0;
}
