/* Open MPI over UCX over the soft NIC: every byte checked.
 *
 * Ping-pong between rank 0 and every other rank, 1 B to 4 MiB (powers of two and a few odd
 * sizes), each message a pattern of (rank, size, iteration) checked on arrival; then
 * MPI_Allreduce (sum of known vectors), MPI_Alltoall (each block names its sender and
 * receiver), and one-sided MPI_Put / MPI_Get in a window (fence epochs), each result checked.
 * Exits non-zero on the first mismatch, naming it. Usage: mpirun -np N mpi_check [MAX_BYTES]
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size;

#define FAIL(...)                                                                      \
    do {                                                                               \
        fprintf(stderr, "rank %d: ", rank);                                            \
        fprintf(stderr, __VA_ARGS__);                                                  \
        fprintf(stderr, "\n");                                                         \
        MPI_Abort(MPI_COMM_WORLD, 1);                                                  \
    } while (0)

static unsigned char pattern(int from, size_t len, int iter, size_t i) {
    return (unsigned char)(from * 31 + len * 7 + iter * 13 + i * 101 + (i >> 8));
}

static void fill(unsigned char *b, int from, size_t len, int iter) {
    for (size_t i = 0; i < len; i++) b[i] = pattern(from, len, iter, i);
}

static void check(const unsigned char *b, int from, size_t len, int iter, const char *what) {
    for (size_t i = 0; i < len; i++)
        if (b[i] != pattern(from, len, iter, i))
            FAIL("%s: %zu B from rank %d, iteration %d: byte %zu is %u, expected %u", what, len,
                 from, iter, i, b[i], pattern(from, len, iter, i));
}

static void pingpong(size_t max) {
    unsigned char *buf = malloc(max);
    if (!buf) FAIL("malloc");
    size_t sizes[64];
    int n = 0;
    for (size_t s = 1; s <= max; s *= 2) {
        sizes[n++] = s;
        if (s > 4 && s + 3 <= max) sizes[n++] = s + 3;
    }
    for (int peer = 1; peer < size; peer++) {
        for (int k = 0; k < n; k++) {
            size_t len = sizes[k];
            int iters = len >= (1 << 20) ? 3 : 10;
            for (int it = 0; it < iters; it++) {
                if (rank == 0) {
                    fill(buf, 0, len, it);
                    MPI_Send(buf, (int)len, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
                    memset(buf, 0, len);
                    MPI_Recv(buf, (int)len, MPI_BYTE, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    check(buf, peer, len, it, "pong");
                } else if (rank == peer) {
                    memset(buf, 0, len);
                    MPI_Recv(buf, (int)len, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    check(buf, 0, len, it, "ping");
                    fill(buf, peer, len, it);
                    MPI_Send(buf, (int)len, MPI_BYTE, 0, 2, MPI_COMM_WORLD);
                }
            }
        }
        if (rank == 0) printf("ping-pong 0 <-> %d: %d sizes, 1 B to %zu B, every byte checked\n", peer, n, max);
    }
    free(buf);
}

static void allreduce(void) {
    enum { N = 100000 };
    int64_t *in = malloc(N * sizeof *in), *out = malloc(N * sizeof *out);
    for (int i = 0; i < N; i++) in[i] = (int64_t)(rank + 1) * i;
    MPI_Allreduce(in, out, N, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    int64_t ranks = (int64_t)size * (size + 1) / 2;
    for (int i = 0; i < N; i++)
        if (out[i] != ranks * i) FAIL("allreduce: element %d is %lld, expected %lld", i, (long long)out[i], (long long)(ranks * i));
    if (rank == 0) printf("allreduce: %d int64 summed over %d ranks, checked\n", N, size);
    free(in);
    free(out);
}

static void alltoall(void) {
    enum { B = 8192 };
    int32_t *in = malloc((size_t)size * B * sizeof *in), *out = malloc((size_t)size * B * sizeof *out);
    for (int to = 0; to < size; to++)
        for (int i = 0; i < B; i++) in[to * B + i] = (rank << 24) | (to << 16) | (i & 0xffff);
    MPI_Alltoall(in, B, MPI_INT32_T, out, B, MPI_INT32_T, MPI_COMM_WORLD);
    for (int from = 0; from < size; from++)
        for (int i = 0; i < B; i++) {
            int32_t want = (from << 24) | (rank << 16) | (i & 0xffff);
            if (out[from * B + i] != want) FAIL("alltoall: block from %d, element %d is %x, expected %x", from, i, out[from * B + i], want);
        }
    if (rank == 0) printf("alltoall: %d x %d int32 blocks, checked\n", size, B);
    free(in);
    free(out);
}

static void onesided(void) {
    enum { W = 1 << 20 };
    unsigned char *base;
    MPI_Win win;
    MPI_Win_allocate(W, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
    memset(base, 0, W);
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    unsigned char *mine = malloc(W), *got = malloc(W);
    fill(mine, rank, W, 7);
    MPI_Win_fence(0, win);
    MPI_Put(mine, W, MPI_BYTE, right, 0, W, MPI_BYTE, win); /* into my right neighbour */
    MPI_Win_fence(0, win);
    check(base, left, W, 7, "MPI_Put (window)");
    MPI_Win_fence(0, win);
    MPI_Get(got, W, MPI_BYTE, right, 0, W, MPI_BYTE, win); /* the right's window holds my bytes */
    MPI_Win_fence(0, win);
    check(got, rank, W, 7, "MPI_Get");
    if (rank == 0) printf("one-sided: MPI_Put and MPI_Get of %d B around a ring of %d, checked\n", W, size);
    MPI_Win_free(&win);
    free(mine);
    free(got);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    size_t max = argc > 1 ? strtoull(argv[1], NULL, 0) : (4u << 20);
    pingpong(max);
    allreduce();
    alltoall();
    onesided();
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) printf("mpi_check: all checks passed on %d ranks\n", size);
    MPI_Finalize();
    return 0;
}
