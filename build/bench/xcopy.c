/*
 * xcopy.c -- the cross-core copy-in rate of this machine: one thread copies S
 * bytes out of its own buffer into a shared one whose lines a thread on
 * another core read last, as a rank copies its part of a plain buffer into
 * the shared-memory slot its peers read. memcpy_bw's single-core copy writes
 * lines its own core holds; here every store must first take the line away
 * from the other core, which is what a collective's copy-in pays.
 *
 * Build: gcc -O3 -pthread -o xcopy xcopy.c
 * Run:   xcopy [-b 64K] [-e 64M] [-f 4] [-t seconds_per_size]
 *
 * Per size S (from -b to -e, times -f): the copier (first allowed CPU) waits
 * for its turn, memcpy's S bytes from its warm buffer into the shared one,
 * and hands over; the reader (second allowed CPU) loads one word of every
 * cache line of the shared buffer and hands back. Only the copy is timed. For
 * about t seconds (at least 5 copies), the median copy is reported as
 * GB/s = S / time (best in parens), the convention of memcpy_bw and of algbw.
 * Output: a markdown table, | bytes | xcopy GB/s |.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static size_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k': case 'K': v *= 1 << 10; break;
    case 'm': case 'M': v *= 1 << 20; break;
    case 'g': case 'G': v *= 1 << 30; break;
    }
    return (size_t)v;
}

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* turn: 0 the copier's, 1 the reader's, 2 stop. */
static _Atomic int turn;
static unsigned char *shared;
static size_t cur;
static int cpus[2];

static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void *reader(void *arg) {
    (void)arg;
    pin(cpus[1]);
    unsigned long sink = 0;
    for (;;) {
        int t;
        while ((t = atomic_load_explicit(&turn, memory_order_acquire)) == 0)
            ;
        if (t == 2)
            break;
        for (size_t i = 0; i < cur; i += 64)
            sink += *(volatile unsigned long *)(shared + i);
        atomic_store_explicit(&turn, 0, memory_order_release);
    }
    return (void *)sink;
}

int main(int argc, char **argv) {
    size_t lo = 64 << 10, hi = 64 << 20;
    double per = 0.05;
    int factor = 4, opt;
    while ((opt = getopt(argc, argv, "b:e:f:t:")) != -1) {
        switch (opt) {
        case 'b': lo = parse_size(optarg); break;
        case 'e': hi = parse_size(optarg); break;
        case 'f': factor = atoi(optarg); break;
        case 't': per = atof(optarg); break;
        default:
            fprintf(stderr, "usage: xcopy [-b 64K] [-e 64M] [-f 4] [-t seconds_per_size]\n");
            return 2;
        }
    }
    if (lo < 64 || hi < lo || factor < 2 || per <= 0) {
        fprintf(stderr, "xcopy: bad arguments\n");
        return 2;
    }
    cpu_set_t allowed;
    sched_getaffinity(0, sizeof allowed, &allowed);
    int n = 0;
    for (int c = 0; c < CPU_SETSIZE && n < 2; c++)
        if (CPU_ISSET(c, &allowed))
            cpus[n++] = c;
    if (n < 2) {
        fprintf(stderr, "xcopy: needs two CPUs, has %d\n", n);
        return 1;
    }
    unsigned char *src;
    if (posix_memalign((void **)&src, 4096, hi) || posix_memalign((void **)&shared, 4096, hi)) {
        fprintf(stderr, "xcopy: out of memory\n");
        return 1;
    }
    memset(src, 1, hi);
    memset(shared, 2, hi);
    pin(cpus[0]);
    atomic_store(&turn, 0);
    pthread_t th;
    if (pthread_create(&th, NULL, reader, NULL)) {
        fprintf(stderr, "xcopy: cannot start the reader\n");
        return 1;
    }
    printf("<!-- xcopy: GB/s = bytes / copy time (1e9 B/s) into lines the other core read last (CPUs %d -> %d); "
           "median copy (best in parens); %gs per size -->\n\n", cpus[0], cpus[1], per);
    printf("| bytes | xcopy GB/s |\n|------:|------:|\n");
    for (size_t s = lo; s <= hi; s *= factor) {
        size_t cap = 1 << 20, k = 0;
        double *t = malloc(cap * sizeof *t), start = now();
        cur = s;
        /* One copy and read untimed, so that the lines start where they will stay. */
        for (int warm = 0; warm < 2 || (k < 5 || now() - start < per); warm++) {
            while (atomic_load_explicit(&turn, memory_order_acquire) != 0)
                ;
            double t0 = now();
            memcpy(shared, src, s);
            double t1 = now();
            atomic_store_explicit(&turn, 1, memory_order_release);
            if (warm >= 2 && k < cap)
                t[k++] = t1 - t0;
            if (warm == 1)
                start = now();
        }
        while (atomic_load_explicit(&turn, memory_order_acquire) != 0)
            ;
        qsort(t, k, sizeof *t, cmp_dbl);
        printf("| %zu | %.2f (%.2f) |\n", s, s / t[k / 2] / 1e9, s / t[0] / 1e9);
        free(t);
    }
    atomic_store(&turn, 2);
    pthread_join(th, NULL);
    return 0;
}
