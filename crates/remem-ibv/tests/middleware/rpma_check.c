/* librpma's scenarios on the drop-in, both sides judged.
 *
 * Usage: rpma_check server|client ADDR PORT SCENARIO
 * SCENARIO is one of
 *   connect   connect, exchange private data both ways, disconnect
 *   read      the client reads the server's 1 MiB region into volatile memory
 *   read-pmem the client reads it into a file mapped MAP_SHARED (its "persistent" memory)
 *             and msyncs it, then checks the file's bytes
 *   write     the client writes 1 MiB into the server's region, flush for visibility
 *   flush     the client writes and flushes to the persistent domain: the server's region
 *             is a mapped file and the server says (peer configuration) that direct writes
 *             reach it; the server checks the file
 *   atomic    8-byte atomic writes then a persistent flush; the server checks every value.
 *             librpma posts the native ATOMIC WRITE where it was built with it (rdma-core
 *             45's headers) and a plain 8-byte WRITE elsewhere (Debian 12's librpma
 *             1.2.0); the client says which completions it saw
 *   messages  a 200-message send/receive ping-pong, every message checked on both sides
 *   conns     three connections at once, each writing its own slice of the server's region
 *   srq       two connections sharing the server's shared receive queue (and its CQ)
 *   rcq       messages received on a separate receive CQ, sends completed on the main one
 * Each side checks what it should see and exits 0 only when everything matched; any
 * mismatch or error prints one line naming it and exits 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <librpma.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define REGION (1u << 20)
#define CHUNK (64u << 10)
#define MSGS 200
#define MSG 64
#define CONNS 3

static const char *role = "?";

#define DIE(...)                                                                       \
    do {                                                                               \
        fprintf(stderr, "rpma_check %s: ", role);                                      \
        fprintf(stderr, __VA_ARGS__);                                                  \
        fprintf(stderr, "\n");                                                         \
        exit(1);                                                                       \
    } while (0)
#define TRY(call)                                                                      \
    do {                                                                               \
        int ret_ = (call);                                                             \
        if (ret_) DIE("%s failed: %d (%s)", #call, ret_, rpma_err_2str(ret_));         \
    } while (0)

static unsigned char pat(size_t i, unsigned seed) { return (unsigned char)(i * 131 + seed * 7 + (i >> 9)); }

static void fill(unsigned char *p, size_t off, size_t len, unsigned seed) {
    for (size_t i = 0; i < len; i++) p[i] = pat(off + i, seed);
}

static void check(const unsigned char *p, size_t off, size_t len, unsigned seed, const char *what) {
    for (size_t i = 0; i < len; i++)
        if (p[i] != pat(off + i, seed))
            DIE("%s: byte %zu is %u, expected %u", what, off + i, p[i], pat(off + i, seed));
}

/* A region: anonymous, or a mapped temporary file (the stand-in for persistent memory). */
static unsigned char *region(bool file, size_t len) {
    if (!file) {
        void *p = NULL;
        if (posix_memalign(&p, 4096, len)) DIE("posix_memalign");
        memset(p, 0, len);
        return p;
    }
    char path[] = "/tmp/rpma_check.XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0 || unlink(path) || ftruncate(fd, (off_t)len)) DIE("temporary file: %s", strerror(errno));
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) DIE("mmap: %s", strerror(errno));
    close(fd);
    return p;
}

/* The opcode of the last completion taken. */
static enum ibv_wc_opcode last_opcode;

/* One completion on `cq`, which must be a success of `op` (or of `alt` when that is not -1). */
static void complete_either(struct rpma_cq *cq, enum ibv_wc_opcode op, int alt, const char *what) {
    struct ibv_wc wc;
    int n = 0, ret;
    for (;;) {
        ret = rpma_cq_get_wc(cq, 1, &wc, &n);
        if (ret == 0 && n == 1) break;
        if (ret != RPMA_E_NO_COMPLETION) DIE("%s: rpma_cq_get_wc: %s", what, rpma_err_2str(ret));
        TRY(rpma_cq_wait(cq));
    }
    if (wc.status != IBV_WC_SUCCESS) DIE("%s: completion status %s", what, ibv_wc_status_str(wc.status));
    if (wc.opcode != op && (int)wc.opcode != alt) DIE("%s: completion opcode %d, expected %d", what, wc.opcode, op);
    last_opcode = wc.opcode;
}

static void complete(struct rpma_cq *cq, enum ibv_wc_opcode op, const char *what) { complete_either(cq, op, -1, what); }

/* IBV_WC_FLUSH (rdma-core 45's verbs.h; Debian 12 has 44, whose librpma emulates every
 * flush with a small READ after the writes). */
enum { WC_FLUSH = 8 };

/* A flush's completion: the native FLUSH where librpma was built with it, else the READ
 * that emulates it. Either way the server then checks that the bytes are there. */
static void flushed(struct rpma_cq *cq, enum rpma_flush_type type) {
    complete_either(cq, IBV_WC_RDMA_READ, WC_FLUSH,
                    type == RPMA_FLUSH_TYPE_PERSISTENT ? "persistent flush" : "visibility flush");
}

static void expect_event(struct rpma_conn *conn, enum rpma_conn_event want) {
    enum rpma_conn_event ev;
    TRY(rpma_conn_next_event(conn, &ev));
    if (ev != want) DIE("connection event %s, expected %s", rpma_utils_conn_event_2str(ev), rpma_utils_conn_event_2str(want));
}

static struct rpma_peer *peer_for(const char *addr, enum rpma_util_ibv_context_type type) {
    struct ibv_context *ctx;
    struct rpma_peer *peer;
    TRY(rpma_utils_get_ibv_context(addr, type, &ctx));
    TRY(rpma_peer_new(ctx, &peer));
    return peer;
}

/* What the server sends in its connection response: its region's descriptor and its
 * peer configuration (whether direct writes reach persistent memory). */
struct offer {
    uint8_t mr_len, cfg_len;
    uint8_t bytes[190];
};

/* ---- the server ---------------------------------------------------------------------- */

struct served {
    struct rpma_conn *conn;
    struct rpma_cq *cq, *rcq;
};

static struct served accept_one(struct rpma_ep *ep, struct rpma_conn_cfg *cfg, struct rpma_mr_local *mr,
                                bool pmem, struct rpma_mr_local *recv_mr, size_t recv_off, struct rpma_srq *srq) {
    struct rpma_conn_req *req;
    TRY(rpma_ep_next_conn_req(ep, cfg, &req));
    struct rpma_conn_private_data in;
    TRY(rpma_conn_req_get_private_data(req, &in));
    if (in.len < 5 || memcmp(in.ptr, "hello", 5)) DIE("the client's private data is missing or wrong");
    if (recv_mr && !srq) TRY(rpma_conn_req_recv(req, recv_mr, recv_off, MSG, NULL));
    struct offer o = {0};
    size_t len;
    TRY(rpma_mr_get_descriptor_size(mr, &len));
    o.mr_len = (uint8_t)len;
    TRY(rpma_mr_get_descriptor(mr, o.bytes));
    struct rpma_peer_cfg *pcfg;
    TRY(rpma_peer_cfg_new(&pcfg));
    TRY(rpma_peer_cfg_set_direct_write_to_pmem(pcfg, pmem));
    TRY(rpma_peer_cfg_get_descriptor_size(pcfg, &len));
    o.cfg_len = (uint8_t)len;
    TRY(rpma_peer_cfg_get_descriptor(pcfg, o.bytes + o.mr_len));
    TRY(rpma_peer_cfg_delete(&pcfg));
    struct rpma_conn_private_data out = {&o, (uint8_t)(2 + o.mr_len + o.cfg_len)};
    struct served s;
    TRY(rpma_conn_req_connect(&req, &out, &s.conn));
    expect_event(s.conn, RPMA_CONN_ESTABLISHED);
    TRY(rpma_conn_get_cq(s.conn, &s.cq));
    TRY(rpma_conn_get_rcq(s.conn, &s.rcq));
    return s;
}

static void close_served(struct served *s) {
    expect_event(s->conn, RPMA_CONN_CLOSED);
    TRY(rpma_conn_disconnect(s->conn));
    TRY(rpma_conn_delete(&s->conn));
}

static int server(const char *addr, const char *port, const char *scenario) {
    struct rpma_peer *peer = peer_for(addr, RPMA_UTIL_IBV_CONTEXT_LOCAL);
    struct rpma_ep *ep;
    TRY(rpma_ep_listen(peer, addr, port, &ep));
    printf("listening\n");
    fflush(stdout);
    bool pmem = !strcmp(scenario, "flush") || !strcmp(scenario, "atomic");
    unsigned char *mem = region(pmem, REGION);
    bool serves_reads = !strncmp(scenario, "read", 4);
    if (serves_reads) fill(mem, 0, REGION, 1);
    int usage = RPMA_MR_USAGE_READ_SRC | RPMA_MR_USAGE_WRITE_DST | RPMA_MR_USAGE_FLUSH_TYPE_VISIBILITY |
                (pmem ? RPMA_MR_USAGE_FLUSH_TYPE_PERSISTENT : 0);
    struct rpma_mr_local *mr;
    TRY(rpma_mr_reg(peer, mem, REGION, usage, &mr));
    struct rpma_conn_cfg *cfg;
    TRY(rpma_conn_cfg_new(&cfg));

    if (!strcmp(scenario, "messages") || !strcmp(scenario, "rcq")) {
        if (!strcmp(scenario, "rcq")) TRY(rpma_conn_cfg_set_rcq_size(cfg, 16));
        unsigned char *msgs = region(false, 2 * MSG);
        struct rpma_mr_local *mm;
        TRY(rpma_mr_reg(peer, msgs, 2 * MSG, RPMA_MR_USAGE_SEND | RPMA_MR_USAGE_RECV, &mm));
        struct served s = accept_one(ep, cfg, mr, false, mm, 0, NULL);
        struct rpma_cq *rcq = s.rcq ? s.rcq : s.cq;
        if (!strcmp(scenario, "rcq") && !s.rcq) DIE("no separate receive CQ although one was configured");
        for (unsigned i = 0; i < MSGS; i++) {
            complete(rcq, IBV_WC_RECV, "receive");
            check(msgs, 0, MSG, 100 + i, "a client message");
            if (i + 1 < MSGS) TRY(rpma_recv(s.conn, mm, 0, MSG, NULL));
            fill(msgs + MSG, 0, MSG, 500 + i);
            TRY(rpma_send(s.conn, mm, MSG, MSG, RPMA_F_COMPLETION_ALWAYS, NULL));
            complete(s.cq, IBV_WC_SEND, "send");
        }
        close_served(&s);
        TRY(rpma_mr_dereg(&mm));
        printf("server: %d messages received and answered, each checked%s\n", MSGS,
               s.rcq ? " (receives on their own CQ)" : "");
    } else if (!strcmp(scenario, "srq")) {
        struct rpma_srq_cfg *scfg;
        TRY(rpma_srq_cfg_new(&scfg));
        TRY(rpma_srq_cfg_set_rq_size(scfg, 64));
        TRY(rpma_srq_cfg_set_rcq_size(scfg, 64));
        struct rpma_srq *srq;
        TRY(rpma_srq_new(peer, scfg, &srq));
        TRY(rpma_srq_cfg_delete(&scfg));
        TRY(rpma_conn_cfg_set_srq(cfg, srq));
        unsigned char *msgs = region(false, 32 * MSG);
        struct rpma_mr_local *mm;
        TRY(rpma_mr_reg(peer, msgs, 32 * MSG, RPMA_MR_USAGE_RECV, &mm));
        for (int i = 0; i < 32; i++) TRY(rpma_srq_recv(srq, mm, (size_t)i * MSG, MSG, (void *)(uintptr_t)i));
        struct served s[2];
        for (int c = 0; c < 2; c++) s[c] = accept_one(ep, cfg, mr, false, mm, 0, srq);
        struct rpma_cq *rcq;
        TRY(rpma_srq_get_rcq(srq, &rcq));
        unsigned seen[2] = {0, 0};
        uint32_t qpn[2];
        for (int c = 0; c < 2; c++) TRY(rpma_conn_get_qp_num(s[c].conn, &qpn[c]));
        for (int n = 0; n < 20; n++) {
            struct ibv_wc wc;
            int got = 0, ret;
            while ((ret = rpma_cq_get_wc(rcq, 1, &wc, &got)) == RPMA_E_NO_COMPLETION) TRY(rpma_cq_wait(rcq));
            TRY(ret);
            if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV) DIE("an SRQ receive failed: %s", ibv_wc_status_str(wc.status));
            int c = wc.qp_num == qpn[0] ? 0 : wc.qp_num == qpn[1] ? 1 : -1;
            if (c < 0) DIE("an SRQ receive names QP %u, neither connection's", wc.qp_num);
            size_t slot = (size_t)(uintptr_t)wc.wr_id;
            check(msgs + slot * MSG, 0, MSG, 1000u * (unsigned)c + seen[c], "an SRQ message");
            seen[c]++;
            TRY(rpma_srq_recv(srq, mm, slot * MSG, MSG, (void *)(uintptr_t)slot));
        }
        if (seen[0] != 10 || seen[1] != 10) DIE("SRQ: %u and %u messages, expected 10 each", seen[0], seen[1]);
        for (int c = 0; c < 2; c++) close_served(&s[c]);
        TRY(rpma_mr_dereg(&mm));
        TRY(rpma_srq_delete(&srq));
        printf("server: 2 connections, 20 messages through one shared receive queue, each checked\n");
    } else {
        int n = !strcmp(scenario, "conns") ? CONNS : 1;
        struct served s[CONNS];
        for (int c = 0; c < n; c++) s[c] = accept_one(ep, cfg, mr, pmem, NULL, 0, NULL);
        for (int c = 0; c < n; c++) close_served(&s[c]);
        if (serves_reads) {
            check(mem, 0, REGION, 1, "the served region (must be unchanged)");
        } else if (!strcmp(scenario, "connect")) {
            for (size_t i = 0; i < REGION; i++)
                if (mem[i]) DIE("the region changed at byte %zu although nothing was written", i);
        } else if (!strcmp(scenario, "atomic")) {
            for (size_t i = 0; i < 64; i++) {
                uint64_t v;
                memcpy(&v, mem + i * 4096, 8);
                if (v != 0x1122334455667700ull + i) DIE("atomic write %zu: %" PRIx64, i, v);
            }
        } else if (!strcmp(scenario, "conns")) {
            for (int c = 0; c < n; c++) check(mem + c * (REGION / CONNS), 0, REGION / CONNS, 20 + c, "a connection's slice");
        } else {
            check(mem, 0, REGION, 2, "the written region");
            if (pmem && msync(mem, REGION, MS_SYNC)) DIE("msync: %s", strerror(errno));
        }
        printf("server: %s: %d connection(s), region checked\n", scenario, n);
    }
    TRY(rpma_conn_cfg_delete(&cfg));
    TRY(rpma_mr_dereg(&mr));
    TRY(rpma_ep_shutdown(&ep));
    TRY(rpma_peer_delete(&peer));
    return 0;
}

/* ---- the client ---------------------------------------------------------------------- */

struct link {
    struct rpma_conn *conn;
    struct rpma_cq *cq, *rcq;
    struct rpma_mr_remote *remote;
    size_t remote_size;
};

static struct link connect_one(struct rpma_peer *peer, const char *addr, const char *port, struct rpma_conn_cfg *cfg,
                               struct rpma_mr_local *recv_mr) {
    struct rpma_conn_req *req;
    TRY(rpma_conn_req_new(peer, addr, port, cfg, &req));
    if (recv_mr) TRY(rpma_conn_req_recv(req, recv_mr, 0, MSG, NULL));
    struct rpma_conn_private_data hello = {"hello", 6};
    struct link l;
    TRY(rpma_conn_req_connect(&req, &hello, &l.conn));
    expect_event(l.conn, RPMA_CONN_ESTABLISHED);
    struct rpma_conn_private_data pd;
    TRY(rpma_conn_get_private_data(l.conn, &pd));
    const struct offer *o = pd.ptr;
    if (pd.len < 2 || pd.len < 2 + o->mr_len + o->cfg_len) DIE("the server's private data is short (%u bytes)", pd.len);
    TRY(rpma_mr_remote_from_descriptor(o->bytes, o->mr_len, &l.remote));
    struct rpma_peer_cfg *pcfg;
    TRY(rpma_peer_cfg_from_descriptor(o->bytes + o->mr_len, o->cfg_len, &pcfg));
    TRY(rpma_conn_apply_remote_peer_cfg(l.conn, pcfg));
    TRY(rpma_peer_cfg_delete(&pcfg));
    TRY(rpma_mr_remote_get_size(l.remote, &l.remote_size));
    if (l.remote_size != REGION) DIE("the remote region is %zu bytes, expected %u", l.remote_size, REGION);
    TRY(rpma_conn_get_cq(l.conn, &l.cq));
    TRY(rpma_conn_get_rcq(l.conn, &l.rcq));
    return l;
}

static void hang_up(struct link *l) {
    TRY(rpma_mr_remote_delete(&l->remote));
    TRY(rpma_conn_disconnect(l->conn));
    expect_event(l->conn, RPMA_CONN_CLOSED);
    TRY(rpma_conn_delete(&l->conn));
}

static void write_and_flush(struct link *l, struct rpma_mr_local *src, size_t off, size_t len,
                            enum rpma_flush_type type) {
    for (size_t o = 0; o < len; o += CHUNK) {
        size_t n = len - o < CHUNK ? len - o : CHUNK;
        TRY(rpma_write(l->conn, l->remote, off + o, src, o, n, RPMA_F_COMPLETION_ON_ERROR, NULL));
    }
    TRY(rpma_flush(l->conn, l->remote, off, len, type, RPMA_F_COMPLETION_ALWAYS, NULL));
    flushed(l->cq, type);
}

static int client(const char *addr, const char *port, const char *scenario) {
    struct rpma_peer *peer = peer_for(addr, RPMA_UTIL_IBV_CONTEXT_REMOTE);
    struct rpma_conn_cfg *cfg;
    TRY(rpma_conn_cfg_new(&cfg));
    /* Room for a region's writes (unsignaled, REGION / CHUNK of them) and the flush. */
    TRY(rpma_conn_cfg_set_sq_size(cfg, 2 * REGION / CHUNK));
    if (!strncmp(scenario, "read", 4)) {
        bool pmem = !strcmp(scenario, "read-pmem");
        unsigned char *dst = region(pmem, REGION);
        struct rpma_mr_local *mr;
        TRY(rpma_mr_reg(peer, dst, REGION, RPMA_MR_USAGE_READ_DST, &mr));
        struct link l = connect_one(peer, addr, port, cfg, NULL);
        for (size_t o = 0; o < REGION; o += CHUNK) {
            TRY(rpma_read(l.conn, mr, o, l.remote, o, CHUNK, RPMA_F_COMPLETION_ALWAYS, NULL));
            complete(l.cq, IBV_WC_RDMA_READ, "read");
        }
        if (pmem && msync(dst, REGION, MS_SYNC)) DIE("msync: %s", strerror(errno));
        check(dst, 0, REGION, 1, "the bytes read");
        hang_up(&l);
        TRY(rpma_mr_dereg(&mr));
        printf("client: read %u bytes into %s memory, checked\n", REGION, pmem ? "file-backed (persistent)" : "volatile");
    } else if (!strcmp(scenario, "write") || !strcmp(scenario, "flush") || !strcmp(scenario, "conns")) {
        int n = !strcmp(scenario, "conns") ? CONNS : 1;
        unsigned char *src = region(false, REGION);
        struct rpma_mr_local *mr;
        TRY(rpma_mr_reg(peer, src, REGION, RPMA_MR_USAGE_WRITE_SRC, &mr));
        struct link l[CONNS];
        for (int c = 0; c < n; c++) l[c] = connect_one(peer, addr, port, cfg, NULL);
        enum rpma_flush_type type = strcmp(scenario, "flush") ? RPMA_FLUSH_TYPE_VISIBILITY : RPMA_FLUSH_TYPE_PERSISTENT;
        if (n == 1) {
            fill(src, 0, REGION, 2);
            write_and_flush(&l[0], mr, 0, REGION, type);
        } else {
            size_t slice = REGION / CONNS;
            for (int c = 0; c < n; c++) fill(src + c * slice, 0, slice, 20 + c);
            for (int c = 0; c < n; c++) {
                for (size_t o = 0; o < slice; o += CHUNK) {
                    size_t len = slice - o < CHUNK ? slice - o : CHUNK;
                    TRY(rpma_write(l[c].conn, l[c].remote, c * slice + o, mr, c * slice + o, len, RPMA_F_COMPLETION_ON_ERROR, NULL));
                }
            }
            for (int c = 0; c < n; c++) {
                TRY(rpma_flush(l[c].conn, l[c].remote, c * slice, slice, type, RPMA_F_COMPLETION_ALWAYS, NULL));
                flushed(l[c].cq, type);
            }
        }
        for (int c = 0; c < n; c++) hang_up(&l[c]);
        TRY(rpma_mr_dereg(&mr));
        printf("client: %s: wrote %u bytes over %d connection(s), flushed (%s)\n", scenario, REGION, n,
               type == RPMA_FLUSH_TYPE_PERSISTENT ? "persistent" : "visibility");
    } else if (!strcmp(scenario, "atomic")) {
        struct link l = connect_one(peer, addr, port, cfg, NULL);
        for (size_t i = 0; i < 64; i++) {
            uint64_t v = 0x1122334455667700ull + i;
            char bytes[8];
            memcpy(bytes, &v, 8);
            TRY(rpma_atomic_write(l.conn, l.remote, i * 4096, bytes, RPMA_F_COMPLETION_ALWAYS, NULL));
            complete_either(l.cq, IBV_WC_ATOMIC_WRITE, IBV_WC_RDMA_WRITE, "atomic write");
        }
        bool native = last_opcode == IBV_WC_ATOMIC_WRITE;
        TRY(rpma_flush(l.conn, l.remote, 0, REGION, RPMA_FLUSH_TYPE_PERSISTENT, RPMA_F_COMPLETION_ALWAYS, NULL));
        flushed(l.cq, RPMA_FLUSH_TYPE_PERSISTENT);
        hang_up(&l);
        printf("client: 64 atomic writes (%s) and a persistent flush\n",
               native ? "native ATOMIC WRITE" : "librpma's plain-WRITE fallback");
    } else if (!strcmp(scenario, "messages") || !strcmp(scenario, "rcq")) {
        bool sep = !strcmp(scenario, "rcq");
        if (sep) TRY(rpma_conn_cfg_set_rcq_size(cfg, 16));
        unsigned char *msgs = region(false, 2 * MSG);
        struct rpma_mr_local *mm;
        TRY(rpma_mr_reg(peer, msgs, 2 * MSG, RPMA_MR_USAGE_SEND | RPMA_MR_USAGE_RECV, &mm));
        struct link l = connect_one(peer, addr, port, cfg, mm);
        if (sep && !l.rcq) DIE("no separate receive CQ although one was configured");
        struct rpma_cq *rcq = l.rcq ? l.rcq : l.cq;
        for (unsigned i = 0; i < MSGS; i++) {
            fill(msgs + MSG, 0, MSG, 100 + i);
            TRY(rpma_send(l.conn, mm, MSG, MSG, RPMA_F_COMPLETION_ALWAYS, NULL));
            complete(l.cq, IBV_WC_SEND, "send");
            complete(rcq, IBV_WC_RECV, "receive");
            check(msgs, 0, MSG, 500 + i, "a server message");
            if (i + 1 < MSGS) TRY(rpma_recv(l.conn, mm, 0, MSG, NULL));
        }
        hang_up(&l);
        TRY(rpma_mr_dereg(&mm));
        printf("client: %d messages sent and answered, each checked\n", MSGS);
    } else if (!strcmp(scenario, "srq")) {
        unsigned char *msgs = region(false, MSG);
        struct rpma_mr_local *mm;
        TRY(rpma_mr_reg(peer, msgs, MSG, RPMA_MR_USAGE_SEND, &mm));
        struct link l[2];
        for (int c = 0; c < 2; c++) l[c] = connect_one(peer, addr, port, cfg, NULL);
        for (unsigned i = 0; i < 10; i++)
            for (int c = 0; c < 2; c++) {
                fill(msgs, 0, MSG, 1000u * (unsigned)c + i);
                TRY(rpma_send(l[c].conn, mm, 0, MSG, RPMA_F_COMPLETION_ALWAYS, NULL));
                complete(l[c].cq, IBV_WC_SEND, "send");
            }
        for (int c = 0; c < 2; c++) hang_up(&l[c]);
        TRY(rpma_mr_dereg(&mm));
        printf("client: 20 messages over 2 connections to a shared receive queue\n");
    } else if (!strcmp(scenario, "connect")) {
        struct link l = connect_one(peer, addr, port, cfg, NULL);
        hang_up(&l);
        printf("client: connected, private data exchanged both ways, disconnected\n");
    } else {
        DIE("unknown scenario %s", scenario);
    }
    TRY(rpma_conn_cfg_delete(&cfg));
    TRY(rpma_peer_delete(&peer));
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: rpma_check server|client ADDR PORT SCENARIO\n");
        return 2;
    }
    role = argv[1];
    if (!strcmp(role, "server")) return server(argv[2], argv[3], argv[4]);
    if (!strcmp(role, "client")) return client(argv[2], argv[3], argv[4]);
    fprintf(stderr, "usage: rpma_check server|client ADDR PORT SCENARIO\n");
    return 2;
}
