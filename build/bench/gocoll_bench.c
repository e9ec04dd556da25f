/*
 * gocoll_bench.c -- ../shared/bench/mpi_bench.c ported to the gocoll C ABI
 * (gocoll.h): same ops, sizes, timing method, markdown output and CSV columns,
 * so its rows sit next to the Gloo and Open MPI anchors.
 *
 * Build (build/compare does this):
 *   build/build.sh /tmp/gocoll
 *   cc -O2 -o /tmp/gocoll_bench build/bench/gocoll_bench.c -I/tmp/gocoll/include \
 *      -L/tmp/gocoll/lib -Wl,-rpath,/tmp/gocoll/lib -lgocoll -lm
 * Run:
 *   /tmp/gocoll_bench -P 4 [options]      start 4 ranks itself (fresh processes,
 *                                         posix_spawn of this executable, never a
 *                                         bare fork) with torchrun-style variables
 *   torchrun/mpirun/srun ... /tmp/gocoll_bench [options]   one rank of a launched job
 * With -P, each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
 * MASTER_ADDR=127.0.0.1 and a MASTER_PORT whose successor is free too: as under
 * torchrun, gocollCommInitFromEnv's rendezvous root binds MASTER_PORT+1.
 *
 * Ops (float32, gocollSum where a reduction is involved), as in mpi_bench.c:
 *   allreduce       gocollAllReduce        out-of-place
 *   bcast           gocollBroadcast        root 0, in place (sendbuff == recvbuff)
 *   allgather       gocollAllGather        out-of-place
 *   reduce_scatter  gocollReduceScatter
 *   alltoall        gocollAllToAll
 *   alltoallv       gocollAllToAllv        equal counts through the v interface
 *                                          (as OSU's osu_alltoallv); not in
 *                                          mpi_bench.c
 * "bytes" follow nccl-tests (allreduce/bcast: buffer; allgather: gathered output;
 * reduce_scatter: input; alltoall(v): per-rank send buffer); algbw = bytes/time;
 * busbw = algbw x 2(n-1)/n (allreduce), (n-1)/n (allgather, reduce_scatter,
 * alltoall(v)), 1 (bcast).
 *
 * Timing, per (op, size), exactly as mpi_bench.c:
 *   1. one correctness check with exact-integer float data;
 *   2. warmup iterations; their max-over-ranks time sets the iteration count so
 *      that the timed phase takes about -t seconds (clamped to [-n, -N]); with
 *      -W s, more rounds of -w iterations follow until the warm-up took s
 *      seconds (max over ranks, so every rank runs the same calls): a process
 *      that has just started, or was idle for a while, runs its first
 *      calls beside the Go runtime's monitor thread in its fast phase,
 *      whose wakes take a spinning rank's core and make some small calls
 *      many times slower;
 *      build/compare warms every cell of every library up this way;
 *   3. per-iteration phase: gocollBarrier, then one op timed with
 *      clock_gettime(CLOCK_MONOTONIC) on every rank; iteration time = MAX over
 *      ranks (gocollReduce Max of the float64 times); median/min/p90;
 *   4. back-to-back phase: barrier, same number of iterations, elapsed/iters,
 *      MAX over ranks -> b2b_us.
 *   Both phases also keep every iteration's time (b2b: each call's time, from
 *   the end of the previous call, MAX over ranks per call), for the tails:
 *   p99_us (after a barrier) and b2b_p50_us / b2b_p99_us (back to back).
 *   With fewer than 100 iterations (the large sizes) p99 is the maximum.
 * -M takes the send and receive buffers from gocollMemAlloc instead of
 * posix_memalign (label "gocoll-memalloc" unless -l says otherwise).
 * Output: markdown tables on stdout (rank 0), optional CSV rows (-c file):
 *   label,op,np,bytes,iters,med_us,min_us,p90_us,b2b_us,algbw_GBps,busbw_GBps,check,
 *   p99_us,b2b_p50_us,b2b_p99_us
 * (the first 12 columns are mpi_bench.c's, so ../shared/bench/summarize.py reads them).
 *
 * Built with -DBENCH_MPI against an MPI (build/compare: mpicc -DBENCH_MPI, label
 * "openmpi"), the same measuring code times MPI's collectives, so the tails of
 * both libraries come from one method; it is then one rank of an mpirun job and
 * has no -P or -M.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef BENCH_MPI
#include <mpi.h>
#else
#include <gocoll.h>
#endif

extern char **environ;

enum { OP_ALLREDUCE, OP_BCAST, OP_ALLGATHER, OP_REDUCE_SCATTER, OP_ALLTOALL, OP_ALLTOALLV, NOPS };
static const char *op_names[NOPS] = {"allreduce", "bcast", "allgather", "reduce_scatter", "alltoall", "alltoallv"};

static int rank, nranks;
static float *sbuf, *rbuf;

static size_t min_bytes = 4096, max_bytes = 64u << 20;
static int factor = 4, warmup = 3, min_iters = 5, max_iters = 1000;
static double tbudget = 0.3, warm_s = 0;
static const char *label = NULL;
static const char *csv_path = NULL;
static int op_enabled[NOPS] = {1, 1, 1, 1, 1, 1};
static size_t *size_list = NULL;
static int n_size_list = 0;
static int use_memalloc = 0;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double busbw_factor(int op) {
    double n = nranks;
    switch (op) {
    case OP_ALLREDUCE: return 2.0 * (n - 1) / n;
    case OP_BCAST: return 1.0;
    default: return (n - 1) / n;
    }
}

/* per-rank element counts for a nominal size: returns actual nccl-tests bytes */
static size_t counts_for(int op, size_t bytes, size_t *cnt) {
    size_t elems = bytes / sizeof(float);
    switch (op) {
    case OP_ALLREDUCE:
    case OP_BCAST:
        *cnt = elems; return elems * sizeof(float);
    default: /* per-rank block */
        *cnt = elems / nranks; return (*cnt) * nranks * sizeof(float);
    }
}

/* ------------------------------------------------------------------ the library measured */

#ifdef BENCH_MPI
#define CK(call)                                                                                 \
    do {                                                                                         \
        int rc_ = (call);                                                                        \
        if (rc_ != MPI_SUCCESS) {                                                                \
            fprintf(stderr, "[rank %d] %s:%d: %s: MPI error %d\n", rank, __FILE__, __LINE__, #call, rc_); \
            MPI_Abort(MPI_COMM_WORLD, 3);                                                        \
        }                                                                                        \
    } while (0)

static const char *lib_default_label(void) { return "openmpi"; }
static void lib_init(int *argc, char ***argv) {
    CK(MPI_Init(argc, argv));
    CK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    CK(MPI_Comm_size(MPI_COMM_WORLD, &nranks));
}
static void lib_describe(void) {
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(v, &len);
    printf("<!-- %s | np=%d | %.*s -->\n", label, nranks, (int)strcspn(v, "\n"), v);
}
static void lib_abort(void) { MPI_Abort(MPI_COMM_WORLD, 3); }
static void lib_finish(void) { CK(MPI_Finalize()); }
static void barrier(void) { CK(MPI_Barrier(MPI_COMM_WORLD)); }
static void run_op(int op, size_t cnt) {
    switch (op) {
    case OP_ALLREDUCE: CK(MPI_Allreduce(sbuf, rbuf, (int)cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD)); break;
    case OP_BCAST: CK(MPI_Bcast(rbuf, (int)cnt, MPI_FLOAT, 0, MPI_COMM_WORLD)); break;
    case OP_ALLGATHER: CK(MPI_Allgather(sbuf, (int)cnt, MPI_FLOAT, rbuf, (int)cnt, MPI_FLOAT, MPI_COMM_WORLD)); break;
    case OP_REDUCE_SCATTER: CK(MPI_Reduce_scatter_block(sbuf, rbuf, (int)cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD)); break;
    case OP_ALLTOALL: CK(MPI_Alltoall(sbuf, (int)cnt, MPI_FLOAT, rbuf, (int)cnt, MPI_FLOAT, MPI_COMM_WORLD)); break;
    case OP_ALLTOALLV: {
        static int *counts, *displs;
        int r;
        if (!counts) counts = malloc(nranks * sizeof(int)), displs = malloc(nranks * sizeof(int));
        for (r = 0; r < nranks; r++) counts[r] = (int)cnt, displs[r] = r * (int)cnt;
        CK(MPI_Alltoallv(sbuf, counts, displs, MPI_FLOAT, rbuf, counts, displs, MPI_FLOAT, MPI_COMM_WORLD));
        break;
    }
    }
}
static double max_over_ranks(double v) {
    double out;
    CK(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    return out;
}
static void max_to_root(double *in, double *out, int n) {
    CK(MPI_Reduce(in, out, n, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD));
}
static long long sum_over_ranks(long long v) {
    long long out;
    CK(MPI_Allreduce(&v, &out, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD));
    return out;
}
#else
static gocollComm_t comm;
#define CK(call)                                                                                 \
    do {                                                                                         \
        gocollResult_t rc_ = (call);                                                             \
        if (rc_ != gocollSuccess) {                                                              \
            fprintf(stderr, "[rank %d] %s:%d: %s: %s (%s)\n", rank, __FILE__, __LINE__, #call,    \
                    gocollGetErrorString(rc_), gocollGetLastError(comm));                        \
            if (comm) gocollCommAbort(comm);                                                     \
            exit(3);                                                                             \
        }                                                                                        \
    } while (0)

static const char *lib_default_label(void) { return use_memalloc ? "gocoll-memalloc" : "gocoll"; }
static void lib_init(int *argc, char ***argv) {
    (void)argc, (void)argv;
    CK(gocollCommInitFromEnv(&comm));
    CK(gocollCommUserRank(comm, &rank));
    CK(gocollCommCount(comm, &nranks));
}
static void lib_describe(void) {
    const char *algo = getenv("GOCOLL_ALGO"), *tr = getenv("GOCOLL_TRANSPORT");
    int version = 0;
    CK(gocollGetVersion(&version));
    printf("<!-- %s | np=%d | gocoll %d.%d.%d (libgocoll version code %d, header %d) | buffers %s | "
           "GOCOLL_ALGO=%s GOCOLL_TRANSPORT=%s -->\n", label, nranks, version / 10000, version / 100 % 100,
           version % 100, version, GOCOLL_VERSION_CODE, use_memalloc ? "gocollMemAlloc" : "posix_memalign",
           algo ? algo : "(auto)", tr ? tr : "(auto)");
}
static void lib_abort(void) { gocollCommAbort(comm); }
static void lib_finish(void) {
    CK(gocollCommDestroy(comm));
    comm = NULL;
}
static void barrier(void) { CK(gocollBarrier(comm)); }
static void run_op(int op, size_t cnt) {
    switch (op) {
    case OP_ALLREDUCE: CK(gocollAllReduce(sbuf, rbuf, cnt, gocollFloat32, gocollSum, comm)); break;
    case OP_BCAST: CK(gocollBroadcast(rbuf, rbuf, cnt, gocollFloat32, 0, comm)); break;
    case OP_ALLGATHER: CK(gocollAllGather(sbuf, rbuf, cnt, gocollFloat32, comm)); break;
    case OP_REDUCE_SCATTER: CK(gocollReduceScatter(sbuf, rbuf, cnt, gocollFloat32, gocollSum, comm)); break;
    case OP_ALLTOALL: CK(gocollAllToAll(sbuf, rbuf, cnt, gocollFloat32, comm)); break;
    case OP_ALLTOALLV: {
        static size_t *counts, *displs;
        int r;
        if (!counts) counts = malloc(nranks * sizeof(size_t)), displs = malloc(nranks * sizeof(size_t));
        for (r = 0; r < nranks; r++) counts[r] = cnt, displs[r] = (size_t)r * cnt;
        CK(gocollAllToAllv(sbuf, counts, displs, rbuf, counts, displs, gocollFloat32, comm));
        break;
    }
    }
}
static double max_over_ranks(double v) {
    double out;
    CK(gocollAllReduce(&v, &out, 1, gocollFloat64, gocollMax, comm));
    return out;
}
static void max_to_root(double *in, double *out, int n) {
    CK(gocollReduce(in, out, n, gocollFloat64, gocollMax, 0, comm));
}
static long long sum_over_ranks(long long v) {
    long long out;
    CK(gocollAllReduce(&v, &out, 1, gocollInt64, gocollSum, comm));
    return out;
}
#endif

/* Fill inputs with exact-integer patterns, run once, verify. Returns #wrong (global). */
static long check_op(int op, size_t cnt) {
    const int n = nranks;
    size_t i, r, nin = 0, nout = 0;
    long long wrong = 0, gwrong = 0;
    switch (op) {
    case OP_ALLREDUCE: nin = cnt; nout = cnt;
        for (i = 0; i < nin; i++) sbuf[i] = (float)((rank + 1) * ((i % 13) + 1));
        break;
    case OP_BCAST: nout = cnt;
        for (i = 0; i < nout; i++) rbuf[i] = rank == 0 ? (float)((i % 251) + 1) : -1.0f;
        break;
    case OP_ALLGATHER: nin = cnt; nout = cnt * n;
        for (i = 0; i < nin; i++) sbuf[i] = (float)(rank * 1000 + (i % 97));
        break;
    case OP_REDUCE_SCATTER: nin = cnt * n; nout = cnt;
        for (i = 0; i < nin; i++) sbuf[i] = (float)((rank + 1) + (i % 17));
        break;
    case OP_ALLTOALL: case OP_ALLTOALLV: nin = cnt * n; nout = cnt * n;
        for (r = 0; r < (size_t)n; r++)
            for (i = 0; i < cnt; i++) sbuf[r * cnt + i] = (float)(rank * 1000 + r * 10 + (i % 7));
        break;
    }
    if (op != OP_BCAST) for (i = 0; i < nout; i++) rbuf[i] = -7.0f;
    run_op(op, cnt);
    for (i = 0; i < nout; i++) {
        float e = 0;
        switch (op) {
        case OP_ALLREDUCE: e = (float)(((i % 13) + 1) * (size_t)(n * (n + 1) / 2)); break;
        case OP_BCAST: e = (float)((i % 251) + 1); break;
        case OP_ALLGATHER: r = i / cnt; e = (float)(r * 1000 + ((i % cnt) % 97)); break;
        case OP_REDUCE_SCATTER: e = (float)(n * (n + 1) / 2 + n * (((size_t)rank * cnt + i) % 17)); break;
        case OP_ALLTOALL: case OP_ALLTOALLV: r = i / cnt; e = (float)(r * 1000 + rank * 10 + ((i % cnt) % 7)); break;
        }
        if (rbuf[i] != e) {
            if (wrong < 3) fprintf(stderr, "[rank %d] %s cnt=%zu: out[%zu]=%g expected %g\n",
                                   rank, op_names[op], cnt, i, rbuf[i], e);
            wrong++;
        }
    }
    gwrong = sum_over_ranks(wrong);
    return (long)gwrong;
}

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void parse_ops(const char *s) {
    int i;
    char *dup = strdup(s), *tok, *save;
    for (i = 0; i < NOPS; i++) op_enabled[i] = 0;
    for (tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int found = 0;
        for (i = 0; i < NOPS; i++) if (!strcmp(tok, op_names[i])) { op_enabled[i] = 1; found = 1; }
        if (!strcmp(tok, "broadcast")) { op_enabled[OP_BCAST] = 1; found = 1; }
        if (!strcmp(tok, "all")) { for (i = 0; i < NOPS; i++) op_enabled[i] = 1; found = 1; }
        if (!found) { fprintf(stderr, "unknown op %s\n", tok); exit(2); }
    }
    free(dup);
}

static size_t parse_size(const char *s) {
    char *end; double v = strtod(s, &end);
    if (*end == 'K' || *end == 'k') v *= 1024; else if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
    else if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024;
    return (size_t)v;
}

static void parse_size_list(const char *s) {
    char *dup = strdup(s), *tok, *save;
    n_size_list = 0; size_list = malloc(64 * sizeof(size_t));
    for (tok = strtok_r(dup, ",", &save); tok && n_size_list < 64; tok = strtok_r(NULL, ",", &save))
        size_list[n_size_list++] = parse_size(tok);
    free(dup);
}

static void usage(void) {
    fprintf(stderr,
        "gocoll_bench [-P nprocs] [-T launch_timeout_s] [-M] [-b min] [-e max] [-f factor] [-s sizes,comma,list]\n"
        "             [-o ops] [-w warmup] [-W warmup_s] [-n min_iters] [-N max_iters] [-t seconds_per_size] [-l label] [-c csv_file]\n"
        "ops: allreduce,bcast,allgather,reduce_scatter,alltoall,alltoallv (default all); sizes accept K/M/G\n"
        "-P N: start N ranks (torchrun-style environment, MASTER_PORT+1 is gocoll's); without it, be one rank\n"
        "      of a job whose launcher set RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (or OMPI_*, SLURM_*, GOCOLL_*)\n"
        "-M:   buffers from gocollMemAlloc instead of posix_memalign\n");
}

#ifndef BENCH_MPI
/* ------------------------------------------------------------------ launcher */

static int port_free(int port) {
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM, 0), ok;
    if (fd < 0) return 0;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)port);
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* a port P with P and P+1 free: MASTER_PORT and gocoll's MASTER_PORT+1 */
static int free_port_pair(void) {
    int tries;
    for (tries = 0; tries < 100; tries++) {
        struct sockaddr_in a;
        socklen_t len = sizeof a;
        int fd = socket(AF_INET, SOCK_STREAM, 0), p;
        if (fd < 0) return -1;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &len)) {
            close(fd);
            return -1;
        }
        p = ntohs(a.sin_port);
        close(fd);
        if (p < 65535 && port_free(p) && port_free(p + 1)) return p;
    }
    return -1;
}

static volatile sig_atomic_t got_signal;
static void on_signal(int s) { got_signal = s; }

static int starts_with_any(const char *kv, const char *const *keys) {
    for (; *keys; keys++) {
        size_t l = strlen(*keys);
        if (!strncmp(kv, *keys, l) && kv[l] == '=') return 1;
    }
    return 0;
}

/* Start n ranks of this program (argv without -P) and wait for them. */
static int launch(int n, double timeout_s, char **argv) {
    static const char *const drop[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
        "MASTER_PORT", "GOCOLL_RANK", "GOCOLL_SIZE", "GOCOLL_LOCAL_RANK", "GOCOLL_LOCAL_SIZE", "GOCOLL_ROOT_ADDR",
        "GOCOLL_PORT", "GOCOLL_SECRET", "GOCOLL_BENCH_LAUNCHER", NULL};
    int port = free_port_pair(), i, r, rc = 0, left = n;
    pid_t *pids = calloc(n, sizeof(pid_t));
    int *done = calloc(n, sizeof(int));
    size_t nenv = 0, k;
    char **env, secret[33], buf[8][64];
    unsigned char rnd[16];
    double t0 = now(), grace_until = 0;
    FILE *ur;
    struct sigaction sa;

    if (port < 0) { fprintf(stderr, "gocoll_bench: no free port pair\n"); return 2; }
    memset(rnd, 0, sizeof rnd);
    if ((ur = fopen("/dev/urandom", "rb"))) { if (fread(rnd, 1, sizeof rnd, ur) != sizeof rnd) {} fclose(ur); }
    for (i = 0; i < 16; i++) sprintf(secret + 2 * i, "%02x", rnd[i]);
    while (environ[nenv]) nenv++;
    env = calloc(nenv + 16, sizeof(char *));

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    for (r = 0; r < n; r++) {
        size_t m = 0;
        for (k = 0; k < nenv; k++) if (!starts_with_any(environ[k], drop)) env[m++] = environ[k];
        snprintf(buf[0], 64, "RANK=%d", r);
        snprintf(buf[1], 64, "LOCAL_RANK=%d", r);
        snprintf(buf[2], 64, "WORLD_SIZE=%d", n);
        snprintf(buf[3], 64, "LOCAL_WORLD_SIZE=%d", n);
        snprintf(buf[4], 64, "MASTER_ADDR=127.0.0.1");
        snprintf(buf[5], 64, "MASTER_PORT=%d", port);
        snprintf(buf[6], 64, "GOCOLL_SECRET=%s", secret);
        snprintf(buf[7], 64, "GOCOLL_BENCH_LAUNCHER=%d", (int)getpid());
        for (i = 0; i < 8; i++) env[m++] = buf[i];
        env[m] = NULL;
        if ((errno = posix_spawn(&pids[r], "/proc/self/exe", NULL, NULL, argv, env)) != 0) {
            perror("gocoll_bench: posix_spawn");
            for (i = 0; i < r; i++) { kill(pids[i], SIGKILL); waitpid(pids[i], NULL, 0); }
            return 2;
        }
    }
    while (left > 0) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        for (r = 0; r < n; r++) {
            int st;
            if (done[r] || waitpid(pids[r], &st, WNOHANG) != pids[r]) continue;
            done[r] = 1;
            left--;
            if (WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
            if (WIFEXITED(st)) {
                if (WEXITSTATUS(st) > rc) rc = WEXITSTATUS(st);
                if (WEXITSTATUS(st) == 1) continue; /* wrong elements: the others finish normally */
            } else {
                fprintf(stderr, "gocoll_bench: rank %d killed by signal %d\n", r, WTERMSIG(st));
                if (rc < 2) rc = 2;
            }
            if (grace_until == 0) grace_until = now() + 5; /* let the others report, then stop them */
        }
        if (left == 0) break;
        if (got_signal || (timeout_s > 0 && now() - t0 > timeout_s) || (grace_until > 0 && now() > grace_until)) {
            fprintf(stderr, "gocoll_bench: %s; killing the remaining ranks\n",
                    got_signal ? "signal" : grace_until > 0 && now() > grace_until ? "a rank failed" : "launch timeout");
            for (r = 0; r < n; r++) if (!done[r]) kill(pids[r], SIGKILL);
            for (r = 0; r < n; r++) if (!done[r]) { waitpid(pids[r], NULL, 0); done[r] = 1; }
            if (rc < 2) rc = 2;
            if (!got_signal && timeout_s > 0 && now() - t0 > timeout_s) rc = 124;
            break;
        }
        nanosleep(&ts, NULL);
    }
    free(pids); free(done); free(env);
    return rc;
}

#endif /* !BENCH_MPI */

/* Sorted ascending: the value below which a fraction q of them lie. */
static double quantile(const double *sorted, int n, double q) {
    return sorted[(int)floor(q * (n - 1))];
}

static double median(const double *sorted, int n) {
    return n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
}

static int alloc_buffers(size_t bytes) {
#ifndef BENCH_MPI
    if (use_memalloc) {
        CK(gocollMemAlloc((void **)&sbuf, bytes, comm));
        CK(gocollMemAlloc((void **)&rbuf, bytes, comm));
        return 0;
    }
#endif
    return posix_memalign((void **)&sbuf, 4096, bytes) || posix_memalign((void **)&rbuf, 4096, bytes);
}

static void free_buffers(void) {
#ifndef BENCH_MPI
    if (use_memalloc) {
        CK(gocollMemFree(sbuf, NULL));
        CK(gocollMemFree(rbuf, NULL));
        return;
    }
#endif
    free(sbuf);
    free(rbuf);
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv) {
    int c, op, si, nprocs = 0;
    long total_wrong = 0;
    double launch_timeout = 0;
    FILE *csv = NULL;
    char **child_argv;
    const char *launcher = getenv("GOCOLL_BENCH_LAUNCHER");

    child_argv = calloc(argc + 1, sizeof(char *));
    {   /* argv without -P N / -T S (the ranks must not launch again) */
        int i, m = 0;
        for (i = 0; i < argc; i++) {
            if ((!strcmp(argv[i], "-P") || !strcmp(argv[i], "-T")) && i + 1 < argc) { i++; continue; }
            if (!strncmp(argv[i], "-P", 2) || !strncmp(argv[i], "-T", 2)) continue;
            child_argv[m++] = argv[i];
        }
    }
    while ((c = getopt(argc, argv, "P:T:Mb:e:f:s:o:w:W:n:N:t:l:c:h")) != -1) {
        switch (c) {
        case 'P': nprocs = atoi(optarg); break;
        case 'T': launch_timeout = atof(optarg); break;
        case 'M': use_memalloc = 1; break;
        case 'b': min_bytes = parse_size(optarg); break;
        case 'e': max_bytes = parse_size(optarg); break;
        case 'f': factor = atoi(optarg); break;
        case 's': parse_size_list(optarg); break;
        case 'o': parse_ops(optarg); break;
        case 'w': warmup = atoi(optarg); break;
        case 'W': warm_s = atof(optarg); break;
        case 'n': min_iters = atoi(optarg); break;
        case 'N': max_iters = atoi(optarg); break;
        case 't': tbudget = atof(optarg); break;
        case 'l': label = optarg; break;
        case 'c': csv_path = optarg; break;
        default: usage(); return c == 'h' ? 0 : 2;
        }
    }
    if (optind < argc) { usage(); return 2; }
    if (factor < 2) factor = 2;
    if (!label) label = lib_default_label();
#ifdef BENCH_MPI
    if (nprocs > 0 || use_memalloc) {
        fprintf(stderr, "-P and -M are gocoll's: run this build under mpirun\n");
        return 2;
    }
    (void)launch_timeout, (void)launcher, (void)child_argv;
#else
    if (nprocs > 0 && !launcher) return launch(nprocs, launch_timeout, child_argv);
    if (launcher) {
        /* started by -P: die with the launcher, never outlive it */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != atoi(launcher)) return 2;
    }
#endif
    lib_init(&argc, &argv);

    if (!size_list) {
        size_t s;
        size_list = malloc(64 * sizeof(size_t));
        for (s = min_bytes; s <= max_bytes && n_size_list < 64; s *= factor) size_list[n_size_list++] = s;
    }
    {   /* buffers sized for the largest case: alltoall/allgather use n*cnt == bytes/4 elements */
        size_t maxb = 0, elems; int i;
        for (i = 0; i < n_size_list; i++) if (size_list[i] > maxb) maxb = size_list[i];
        elems = maxb / sizeof(float) + 64;
        if (alloc_buffers(elems * sizeof(float))) {
            fprintf(stderr, "alloc failed\n");
            lib_abort();
            return 3;
        }
        memset(sbuf, 0, elems * sizeof(float)); memset(rbuf, 0, elems * sizeof(float));
    }
    if (rank == 0) {
        lib_describe();
        if (csv_path) csv = fopen(csv_path, "a");
    }

    for (op = 0; op < NOPS; op++) {
        if (!op_enabled[op]) continue;
        if (rank == 0) {
            printf("\n#### %s %s np=%d\n\n", label, op_names[op], nranks);
            printf("| bytes | iters | med_us | min_us | p90_us | p99_us | b2b_us | b2b_p50_us | b2b_p99_us | algbw GB/s | busbw GB/s | check |\n");
            printf("|------:|------:|-------:|-------:|-------:|-------:|-------:|-----------:|-----------:|-----------:|-----------:|:-----:|\n");
            fflush(stdout);
        }
        for (si = 0; si < n_size_list; si++) {
            size_t cnt, bytes = counts_for(op, size_list[si], &cnt);
            long wrong;
            double t0, t1, dt, dtmax, *loc, *glob = NULL, *bloc, *bglob, med, mn, p90, p99, b2b, bmed, b99, algbw, busbw;
            int i, iters;
            if (cnt == 0) continue;
            wrong = check_op(op, cnt);
            total_wrong += wrong;
            /* warmup; also decides the iteration count (identical on all ranks) */
            barrier();
            t0 = now();
            for (i = 0; i < warmup; i++) run_op(op, cnt);
            dt = (now() - t0) / (warmup > 0 ? warmup : 1);
            dtmax = max_over_ranks(dt);
            if (warm_s > 0 && warmup > 0)
                while (max_over_ranks(now() - t0) < warm_s)
                    for (i = 0; i < warmup; i++) run_op(op, cnt);
            iters = (int)ceil(tbudget / (dtmax > 1e-9 ? dtmax : 1e-9));
            if (iters < min_iters) iters = min_iters;
            if (iters > max_iters) iters = max_iters;
            loc = malloc(iters * sizeof(double));
            glob = malloc(iters * sizeof(double));
            bloc = malloc(iters * sizeof(double));
            bglob = malloc(iters * sizeof(double));
            /* touched here, so that no first write to a page (a fault) lands
               between two timed calls */
            memset(loc, 0, iters * sizeof(double));
            memset(glob, 0, iters * sizeof(double));
            memset(bloc, 0, iters * sizeof(double));
            memset(bglob, 0, iters * sizeof(double));
            for (i = 0; i < iters; i++) {
                barrier();
                t0 = now();
                run_op(op, cnt);
                loc[i] = now() - t0;
            }
            max_to_root(loc, glob, iters);
            barrier();
            t0 = t1 = now();
            for (i = 0; i < iters; i++) {
                double t2;
                run_op(op, cnt);
                t2 = now();
                bloc[i] = t2 - t1;
                t1 = t2;
            }
            dt = (t1 - t0) / iters;
            max_to_root(&dt, &b2b, 1);
            max_to_root(bloc, bglob, iters);
            if (rank == 0 && getenv("GOCOLL_BENCH_SAMPLES")) {
                /* every iteration's time in order, to see where a tail comes from */
                FILE *sf = fopen(getenv("GOCOLL_BENCH_SAMPLES"), "a");
                if (sf) {
                    for (i = 0; i < iters; i++)
                        fprintf(sf, "%s,%d,%zu,%d,%.3f,%.3f\n", op_names[op], nranks, bytes, i, glob[i] * 1e6,
                                bglob[i] * 1e6);
                    fclose(sf);
                }
            }
            if (rank == 0) {
                qsort(glob, iters, sizeof(double), cmp_dbl);
                qsort(bglob, iters, sizeof(double), cmp_dbl);
                med = median(glob, iters);
                mn = glob[0];
                p90 = quantile(glob, iters, 0.9);
                p99 = quantile(glob, iters, 0.99);
                bmed = median(bglob, iters);
                b99 = quantile(bglob, iters, 0.99);
                algbw = bytes / med / 1e9;
                busbw = algbw * busbw_factor(op);
                printf("| %zu | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.3f | %.3f | %s |\n", bytes, iters,
                       med * 1e6, mn * 1e6, p90 * 1e6, p99 * 1e6, b2b * 1e6, bmed * 1e6, b99 * 1e6, algbw, busbw,
                       wrong ? "FAIL" : "ok");
                fflush(stdout);
                if (csv) {
                    fprintf(csv, "%s,%s,%d,%zu,%d,%.3f,%.3f,%.3f,%.3f,%.4f,%.4f,%s,%.3f,%.3f,%.3f\n", label,
                            op_names[op], nranks, bytes, iters, med * 1e6, mn * 1e6, p90 * 1e6, b2b * 1e6, algbw,
                            busbw, wrong ? "FAIL" : "ok", p99 * 1e6, bmed * 1e6, b99 * 1e6);
                    fflush(csv);
                }
            }
            free(glob);
            free(loc);
            free(bglob);
            free(bloc);
        }
    }
    if (csv) fclose(csv);
    if (rank == 0 && total_wrong) fprintf(stderr, "%s: %ld wrong elements in total\n", label, total_wrong);
    barrier();
#ifdef BENCH_MPI
    free_buffers();
    lib_finish();
#else
    lib_finish(); /* gocollMemFree of memory whose communicator is gone is allowed */
    free_buffers();
#endif
    return total_wrong ? 1 : 0;
}
