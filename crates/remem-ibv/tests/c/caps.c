/* Capabilities reported as rxe reports them, the verbs that change objects in place, and
 * what a UD receive carries:
 * ctx->cmd_fd an open descriptor, max_inline_data rounded up as rxe_init_sq does,
 * ibv_resize_cq (rounded sizes, completions kept in order, EINVAL below the fill) and
 * ibv_rereg_mr (translation, PD, access; the old keys revoked as by ibv_dereg_mr, so a
 * peer using the old rkey gets a remote access error). One device, QPs connected to each
 * other over GID index 1 (the IPv4 one, as in rxe's table). */
#include <infiniband/verbs.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "check.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;
static struct ibv_cq *cq;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Polls `c` until `n` completions arrived (10 s at most); returns how many it got. */
static int poll_n(struct ibv_cq *c, struct ibv_wc *wc, int n)
{
	int got = 0;
	double end = now_s() + 10;
	while (got < n && now_s() < end) {
		int r = ibv_poll_cq(c, n - got, wc + got);
		if (r < 0)
			return r;
		got += r;
	}
	return got;
}

static struct ibv_qp *qp_caps(struct ibv_pd *p, uint32_t sge, uint32_t inl,
			      struct ibv_qp_cap *granted)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = sge,
			 .max_recv_sge = 1, .max_inline_data = inl },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *qp = ibv_create_qp(p, &ia);
	if (qp && granted)
		*granted = ia.cap;
	return qp;
}

static int to_init(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
						    IBV_ACCESS_REMOTE_READ };
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					     IBV_QP_ACCESS_FLAGS);
}

static int to_rts(struct ibv_qp *qp, uint32_t dest)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = dest,
		.max_dest_rd_atomic = 1, .min_rnr_timer = 12,
		.ah_attr = { .is_global = 1,
			     .grh = { .dgid = gid, .sgid_index = 1, .hop_limit = 1 },
			     .port_num = 1 },
	};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
					  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -1;
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					     IBV_QP_MAX_QP_RD_ATOMIC);
}

/* A requester QP on `pd` connected to a responder QP on `rpd`. */
struct pair {
	struct ibv_qp *req, *resp;
};

static struct pair pair(struct ibv_pd *rpd)
{
	struct pair p = { qp_caps(pd, 1, 0, NULL), qp_caps(rpd, 1, 0, NULL) };
	REQUIRE(p.req && p.resp, "create the pair's QPs");
	REQUIRE(to_init(p.req) == 0 && to_init(p.resp) == 0, "pair to INIT");
	REQUIRE(to_rts(p.req, p.resp->qp_num) == 0 && to_rts(p.resp, p.req->qp_num) == 0,
		"pair to RTS over GID index 1");
	return p;
}

static void unpair(struct pair p)
{
	ibv_destroy_qp(p.req);
	ibv_destroy_qp(p.resp);
}

/* RDMA WRITEs `len` bytes of `src` (lkey `lkey`) to `raddr`/`rkey` over a fresh pair whose
 * responder is on `rpd`; returns the completion status. */
static enum ibv_wc_status write_to(struct ibv_pd *rpd, void *src, uint32_t len, uint32_t lkey,
				   uint64_t raddr, uint32_t rkey)
{
	struct pair p = pair(rpd);
	struct ibv_sge s = { .addr = (uintptr_t)src, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = 7, .sg_list = &s, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
				  .wr = { .rdma = { .remote_addr = raddr, .rkey = rkey } } };
	struct ibv_send_wr *bad;
	enum ibv_wc_status st = IBV_WC_GENERAL_ERR;
	if (ibv_post_send(p.req, &wr, &bad) == 0) {
		struct ibv_wc wc;
		if (poll_n(cq, &wc, 1) == 1 && wc.wr_id == 7)
			st = wc.status;
	}
	unpair(p);
	/* The responder's side may have flushed nothing; drain anything left over. */
	struct ibv_wc rest[8];
	while (ibv_poll_cq(cq, 8, rest) > 0)
		;
	return st;
}

static void cmd_fd(void)
{
	struct stat st;
	CHECK(ctx->cmd_fd >= 0 && fstat(ctx->cmd_fd, &st) == 0, "cmd_fd is an open descriptor");
	CHECK(S_ISCHR(st.st_mode), "cmd_fd is a character device (uverbs or /dev/null)");
	int fl = fcntl(ctx->cmd_fd, F_GETFL);
	CHECK(fl >= 0 && (fl & O_ACCMODE) == O_RDWR, "opened read-write");
	CHECK(fcntl(ctx->cmd_fd, F_GETFD) & FD_CLOEXEC, "close-on-exec");
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *other = ibv_open_device(list[0]);
	REQUIRE(other != NULL, "a second context");
	int fd = other->cmd_fd;
	CHECK(fd >= 0 && fd != ctx->cmd_fd, "each context has its own");
	CHECK(ibv_close_device(other) == 0, "close");
	errno = 0;
	CHECK(fcntl(fd, F_GETFD) == -1 && errno == EBADF, "closed with its context");
	ibv_free_device_list(list);
}

static void inline_caps(void)
{
	/* rxe: a send WQE is max(max_send_sge * 16, max_inline_data) bytes; what fits in it
	 * is granted. */
	static const struct { uint32_t sge, inl, want_sge, want_inl; } cases[] = {
		{ 1, 0, 1, 16 }, { 2, 0, 2, 32 }, { 1, 40, 2, 40 },
		{ 1, 17, 1, 17 }, { 4, 64, 4, 64 }, { 2, 64, 4, 64 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct ibv_qp_cap got;
		struct ibv_qp *qp = qp_caps(pd, cases[i].sge, cases[i].inl, &got);
		REQUIRE(qp != NULL, "create_qp");
		CHECK(got.max_inline_data == cases[i].want_inl &&
		      got.max_send_sge == cases[i].want_sge,
		      "sge %u inline %u: granted sge %u inline %u, want %u/%u", cases[i].sge,
		      cases[i].inl, got.max_send_sge, got.max_inline_data, cases[i].want_sge,
		      cases[i].want_inl);
		struct ibv_qp_attr a;
		struct ibv_qp_init_attr ia;
		CHECK(ibv_query_qp(qp, &a, IBV_QP_CAP, &ia) == 0 &&
		      a.cap.max_inline_data == got.max_inline_data &&
		      ia.cap.max_inline_data == got.max_inline_data &&
		      a.cap.max_send_sge == got.max_send_sge,
		      "query_qp reports the granted caps");
		ibv_destroy_qp(qp);
	}
	struct ibv_qp_init_attr_ex ex = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .pd = pd,
		.comp_mask = IBV_QP_INIT_ATTR_PD,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
			 .max_recv_sge = 1, .max_inline_data = 0 },
	};
	struct ibv_qp *qp = ibv_create_qp_ex(ctx, &ex);
	CHECK(qp && ex.cap.max_inline_data == 16, "create_qp_ex rounds too (%u)",
	      ex.cap.max_inline_data);
	if (qp)
		ibv_destroy_qp(qp);

	/* A QP asked for no inline data posts 16 bytes inline, as on rxe. */
	static char msg[16] = "sixteen bytes!!";
	char *dst = aligned_alloc(4096, 4096);
	memset(dst, 0, 4096);
	struct ibv_mr *m = ibv_reg_mr(pd, dst, 4096, IBV_ACCESS_LOCAL_WRITE |
						     IBV_ACCESS_REMOTE_WRITE);
	REQUIRE(m != NULL, "reg_mr");
	struct pair p = pair(pd);
	struct ibv_sge s = { .addr = (uintptr_t)msg, .length = 16, .lkey = 0 };
	struct ibv_send_wr wr = { .wr_id = 9, .sg_list = &s, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE,
				  .wr = { .rdma = { .remote_addr = (uintptr_t)dst,
						    .rkey = m->rkey } } };
	struct ibv_send_wr *bad;
	struct ibv_wc wc;
	CHECK(ibv_post_send(p.req, &wr, &bad) == 0, "16 bytes inline on a QP asked for 0");
	CHECK(poll_n(cq, &wc, 1) == 1 && wc.status == IBV_WC_SUCCESS &&
	      memcmp(dst, msg, 16) == 0, "and they land");
	unpair(p);
	ibv_dereg_mr(m);
	free(dst);
}

/* Posts `n` receives (wr_id from `first`) on `qp`, in ERR: each completes flushed. */
static struct ibv_mr *rmr;

static void flushed_recvs(struct ibv_qp *qp, uint64_t first, int n)
{
	static char b[8];
	if (!rmr)
		rmr = ibv_reg_mr(pd, b, sizeof(b), IBV_ACCESS_LOCAL_WRITE);
	for (int i = 0; i < n; i++) {
		struct ibv_sge s = { .addr = (uintptr_t)b, .length = 8, .lkey = rmr->lkey };
		struct ibv_recv_wr wr = { .wr_id = first + i, .sg_list = &s, .num_sge = 1 };
		struct ibv_recv_wr *bad;
		REQUIRE(ibv_post_recv(qp, &wr, &bad) == 0, "post_recv in ERR");
	}
}

static void resize(void)
{
	struct ibv_device_attr da;
	REQUIRE(ibv_query_device(ctx, &da) == 0, "query_device");
	CHECK(da.max_cqe == 32767, "max_cqe is rxe's (%d)", da.max_cqe);
	struct ibv_cq *c = ibv_create_cq(ctx, 10, NULL, NULL, 0);
	REQUIRE(c != NULL, "create_cq");
	CHECK(c->cqe == 15, "cqe 10 is granted as 15, rxe's 2^k - 1 (%d)", c->cqe);
	struct ibv_cq *big = ibv_create_cq(ctx, da.max_cqe, NULL, NULL, 0);
	CHECK(big && big->cqe == da.max_cqe, "max_cqe exactly");
	if (big)
		ibv_destroy_cq(big);
	errno = 0;
	CHECK(!ibv_create_cq(ctx, da.max_cqe + 1, NULL, NULL, 0) && errno == EINVAL,
	      "past max_cqe");

	struct ibv_qp_init_attr ia = {
		.send_cq = c, .recv_cq = c, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 16, .max_send_sge = 1,
			 .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	REQUIRE(qp && to_init(qp) == 0, "a QP on the CQ");
	struct ibv_qp_attr err = { .qp_state = IBV_QPS_ERR };
	REQUIRE(ibv_modify_qp(qp, &err, IBV_QP_STATE) == 0, "to ERR");
	flushed_recvs(qp, 0, 5);
	/* Shrinking below the completions it holds: EINVAL, nothing changes. */
	CHECK(ibv_resize_cq(c, 3) == EINVAL && c->cqe == 15, "below the fill: EINVAL");
	CHECK(ibv_resize_cq(c, 0) == EINVAL, "cqe 0");
	CHECK(ibv_resize_cq(c, da.max_cqe + 1) == EINVAL, "past max_cqe");
	CHECK(ibv_resize_cq(NULL, 4) == EINVAL, "NULL CQ");
	/* Growing with completions in it: they stay, in order, and more fit. */
	CHECK(ibv_resize_cq(c, 40) == 0 && c->cqe == 63, "grow to 40: 63 (%d)", c->cqe);
	for (int i = 0; i < 4; i++)
		flushed_recvs(qp, 5 + 10 * i, 10);
	struct ibv_wc wc[64];
	int n = poll_n(c, wc, 45);
	int in_order = n == 45;
	for (int i = 0; i < n; i++)
		in_order &= wc[i].wr_id == (uint64_t)i && wc[i].status == IBV_WC_WR_FLUSH_ERR;
	CHECK(in_order, "45 completions (more than the old 15), in posting order (%d)", n);
	/* Shrinking to what it holds (or more) works. */
	flushed_recvs(qp, 100, 3);
	CHECK(ibv_resize_cq(c, 3) == 0 && c->cqe == 3, "shrink to the fill (%d)", c->cqe);
	n = poll_n(c, wc, 3);
	CHECK(n == 3 && wc[0].wr_id == 100 && wc[2].wr_id == 102, "kept across the shrink");
	ibv_destroy_qp(qp);
	CHECK(ibv_destroy_cq(c) == 0, "destroy");
	ibv_dereg_mr(rmr);
}

static void rereg(void)
{
	enum { LEN = 4096 };
	char *src = aligned_alloc(4096, LEN), *a = aligned_alloc(4096, LEN),
	     *b = aligned_alloc(4096, LEN);
	memset(src, 0x5a, LEN);
	memset(a, 0, LEN);
	memset(b, 0, LEN);
	struct ibv_mr *smr = ibv_reg_mr(pd, src, LEN, IBV_ACCESS_LOCAL_WRITE);
	int rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	struct ibv_mr *mr = ibv_reg_mr(pd, a, LEN, rw);
	REQUIRE(smr && mr, "reg_mr");
	uint32_t handle = mr->handle, rkey0 = mr->rkey;
	CHECK(write_to(pd, src, 64, smr->lkey, (uintptr_t)a, mr->rkey) == IBV_WC_SUCCESS &&
	      a[0] == 0x5a, "a write to the MR lands");

	/* Input errors: the old registration stays valid. */
	errno = 0;
	CHECK(ibv_rereg_mr(mr, 0, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT &&
	      errno == EINVAL, "no flag");
	CHECK(ibv_rereg_mr(mr, 1 << 3, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT,
	      "unknown flag");
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, LEN, 0) ==
		      IBV_REREG_MR_ERR_INPUT, "translation without an address");
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, NULL, NULL, 0, 0) ==
		      IBV_REREG_MR_ERR_INPUT, "CHANGE_PD to NULL");
	errno = 0;
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			   IBV_ACCESS_REMOTE_WRITE) == IBV_REREG_MR_ERR_INPUT &&
		      errno == EINVAL, "REMOTE_WRITE without LOCAL_WRITE");
	CHECK(mr->rkey == rkey0 &&
	      write_to(pd, src, 64, smr->lkey, (uintptr_t)a, rkey0) == IBV_WC_SUCCESS,
	      "still registered as before after the failures");

	/* CHANGE_ACCESS: no remote write any more; new keys, same handle; the old rkey is
	 * revoked (remote access error), the new one refuses writes. */
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ) == 0, "access");
	CHECK(mr->handle == handle && mr->rkey != rkey0 && mr->addr == a && mr->pd == pd,
	      "same handle, address, PD; new rkey");
	CHECK(write_to(pd, src, 64, smr->lkey, (uintptr_t)a, rkey0) == IBV_WC_REM_ACCESS_ERR,
	      "the old rkey is NAKed: remote access error");
	CHECK(write_to(pd, src, 64, smr->lkey, (uintptr_t)a, mr->rkey) ==
		      IBV_WC_REM_ACCESS_ERR, "no remote write with the new access");
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, rw) == 0,
	      "access back");

	/* CHANGE_TRANSLATION: the MR covers b now; a is no longer reachable. */
	uint32_t rkey1 = mr->rkey;
	memset(a, 0, LEN);
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, b, LEN / 2, 0) == 0,
	      "translation");
	CHECK(mr->addr == b && mr->length == LEN / 2 && mr->rkey != rkey1, "new range, keys");
	CHECK(write_to(pd, src, 64, smr->lkey, (uintptr_t)b, mr->rkey) == IBV_WC_SUCCESS &&
	      (unsigned char)b[0] == 0x5a && a[0] == 0, "writes land in the new range");
	CHECK(write_to(pd, src, 64, smr->lkey, (uintptr_t)b + LEN / 2, mr->rkey) ==
		      IBV_WC_REM_ACCESS_ERR, "past the new length");
	CHECK(write_to(pd, src, 64, smr->lkey, (uintptr_t)a, rkey1) == IBV_WC_REM_ACCESS_ERR,
	      "the old rkey is NAKed");

	/* CHANGE_PD: usable by QPs of the new PD only. */
	struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
	REQUIRE(pd2 != NULL, "alloc_pd");
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd2, NULL, 0, 0) == 0, "PD");
	CHECK(mr->pd == pd2 && mr->addr == b, "the MR is on pd2, same range");
	CHECK(ibv_dealloc_pd(pd2) == EBUSY, "pd2 is held by the MR");
	CHECK(write_to(pd2, src, 64, smr->lkey, (uintptr_t)b, mr->rkey) == IBV_WC_SUCCESS,
	      "a responder on pd2 takes the write");
	CHECK(write_to(pd, src, 64, smr->lkey, (uintptr_t)b, mr->rkey) ==
		      IBV_WC_REM_ACCESS_ERR, "a responder on the old PD refuses it");

	/* All three at once, then deregistration. */
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_FLAGS_SUPPORTED, pd, a, LEN, rw) == 0, "all");
	CHECK(mr->pd == pd && mr->addr == a && mr->length == LEN, "back on pd, over a");
	CHECK(ibv_dealloc_pd(pd2) == 0, "pd2 released");
	CHECK(write_to(pd, src, 64, smr->lkey, (uintptr_t)a, mr->rkey) == IBV_WC_SUCCESS,
	      "works");
	CHECK(ibv_dereg_mr(mr) == 0 && ibv_dereg_mr(smr) == 0, "dereg");
	free(src);
	free(a);
	free(b);
}

/* A UD receive over RoCEv2 IPv4, as UCX's ud_verbs reads it: the GRH area holds twenty
 * zero bytes then the IPv4 header (destination address in its last four bytes), and
 * wc.sl is mlx5's packet type for RoCEv2 IPv4 (bits 2:0 = 2), from which UCX 1.13 tells
 * an IPv4 GRH area from an IPv6 one before checking the destination GID. */
static void ud_grh(void)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
			 .max_recv_sge = 1 },
	};
	struct ibv_qp *qa = ibv_create_qp(pd, &ia), *qb = ibv_create_qp(pd, &ia);
	REQUIRE(qa && qb, "UD QPs");
	for (int i = 0; i < 2; i++) {
		struct ibv_qp *q = i ? qb : qa;
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
					 .qkey = 0x11111111 };
		REQUIRE(ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
						     IBV_QP_QKEY) == 0, "UD INIT");
		a.qp_state = IBV_QPS_RTR;
		REQUIRE(ibv_modify_qp(q, &a, IBV_QP_STATE) == 0, "UD RTR");
		a.qp_state = IBV_QPS_RTS;
		REQUIRE(ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0, "UD RTS");
	}
	static unsigned char rbuf[64], sbuf[8] = "datagram";
	memset(rbuf, 0xff, sizeof(rbuf)); /* as UCX primes its receive buffers */
	struct ibv_mr *rm = ibv_reg_mr(pd, rbuf, sizeof(rbuf), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *sm = ibv_reg_mr(pd, sbuf, sizeof(sbuf), 0);
	REQUIRE(rm && sm, "reg_mr");
	struct ibv_sge rs = { .addr = (uintptr_t)rbuf, .length = sizeof(rbuf), .lkey = rm->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 1, .sg_list = &rs, .num_sge = 1 }, *rbad;
	REQUIRE(ibv_post_recv(qb, &rwr, &rbad) == 0, "post_recv");
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1,
				  .grh = { .dgid = gid, .sgid_index = 1, .hop_limit = 64 } };
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	REQUIRE(ah != NULL, "create_ah");
	struct ibv_sge ss = { .addr = (uintptr_t)sbuf, .length = sizeof(sbuf), .lkey = sm->lkey };
	struct ibv_send_wr swr = { .wr_id = 2, .sg_list = &ss, .num_sge = 1,
				   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED,
				   .wr = { .ud = { .ah = ah, .remote_qpn = qb->qp_num,
						   .remote_qkey = 0x11111111 } } },
			   *sbad;
	REQUIRE(ibv_post_send(qa, &swr, &sbad) == 0, "post_send");
	struct ibv_wc wc[2], *recv = NULL;
	CHECK(poll_n(cq, wc, 2) == 2, "send and receive complete");
	for (int i = 0; i < 2; i++)
		if (wc[i].wr_id == 1)
			recv = &wc[i];
	REQUIRE(recv && recv->status == IBV_WC_SUCCESS, "the receive");
	CHECK(recv->wc_flags & IBV_WC_GRH, "GRH present");
	CHECK((recv->sl & 0x7) == 2, "wc.sl: RoCEv2 IPv4 packet type (%u)", recv->sl);
	static const unsigned char zero[20];
	CHECK(memcmp(rbuf, zero, 20) == 0, "the first 20 bytes are zero (rxe)");
	CHECK(rbuf[20] == 0x45, "an IPv4 header at byte 20");
	CHECK(memcmp(rbuf + 36, gid.raw + 12, 4) == 0, "its destination: this GID's address");
	CHECK(memcmp(rbuf + 32, gid.raw + 12, 4) == 0, "its source: the sender's");
	CHECK(memcmp(rbuf + 40, sbuf, sizeof(sbuf)) == 0, "the payload after 40 bytes");
	struct ibv_ah_attr back;
	CHECK(ibv_init_ah_from_wc(ctx, 1, recv, (struct ibv_grh *)rbuf, &back) == 0 &&
	      back.grh.sgid_index == 1 && memcmp(&back.grh.dgid, &gid, 16) == 0,
	      "init_ah_from_wc: the reply goes from GID 1 to the sender's");
	struct ibv_ah *reply = ibv_create_ah(pd, &back);
	CHECK(reply != NULL, "an AH from the receive (sl %u) is valid", back.sl);
	if (reply)
		ibv_destroy_ah(reply);
	ibv_destroy_ah(ah);
	ibv_destroy_qp(qa);
	ibv_destroy_qp(qb);
	ibv_dereg_mr(rm);
	ibv_dereg_mr(sm);
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	struct ibv_device **list = ibv_get_device_list(NULL);
	REQUIRE(list && list[0], "a device");
	ctx = ibv_open_device(list[0]);
	REQUIRE(ctx != NULL, "open");
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	REQUIRE(pd && cq, "pd, cq");
	REQUIRE(ibv_query_gid(ctx, 1, 1, &gid) == 0, "GID 1");
	cmd_fd();
	inline_caps();
	resize();
	rereg();
	ud_grh();
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("%d failures\n", failures);
	return failures != 0;
}
