/* Memory windows through the drop-in's C ABI: ibv_alloc_mw / ibv_bind_mw (type 1) /
 * IBV_WR_BIND_MW / ibv_wr_bind_mw / IBV_WR_LOCAL_INV / ibv_wr_local_inv (type 2), remote
 * invalidation by a SEND with invalidate, the device caps, and the rules rxe keeps (a
 * region with windows bound is not deregistered, a type 2 window is not bound by
 * ibv_bind_mw).
 *
 * Built by tests/mw_c.rs against Debian's verbs.h, linked against the system libibverbs
 * and run with LD_LIBRARY_PATH pointing at the drop-in. One process; `a` accesses the
 * windows `b` binds over its buffer, on RC QPs connected to each other. Prints one line
 * per check; exits 1 on a failure. */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <stdint.h>
#include <time.h>

#include "check.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;
static uint8_t sgid_index;
enum { LEN = 8192 };
static char *abuf, *bbuf;
static struct ibv_mr *amr, *bmr;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int poll1(struct ibv_cq *cq, struct ibv_wc *wc)
{
	double end = now_s() + 10;
	while (now_s() < end) {
		int r = ibv_poll_cq(cq, 1, wc);
		if (r != 0)
			return r;
	}
	return 0;
}

struct pair {
	struct ibv_cq *acq, *bcq;
	struct ibv_qp *a, *b;
};

static enum ibv_qp_type qp_type = IBV_QPT_RC;

static struct ibv_qp *make_qp(struct ibv_cq *cq)
{
	struct ibv_qp_init_attr_ex ia = {
		.send_cq = cq, .recv_cq = cq,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.qp_type = qp_type,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE |
				  IBV_QP_EX_WITH_BIND_MW |
				  (qp_type == IBV_QPT_RC ? IBV_QP_EX_WITH_LOCAL_INV |
							   IBV_QP_EX_WITH_SEND_WITH_INV
							 : 0),
	};
	struct ibv_qp *qp = ibv_create_qp_ex(ctx, &ia);
	REQUIRE(qp != NULL, "create_qp_ex with BIND_MW (and LOCAL_INV on RC)");
	return qp;
}

static void to_rts(struct ibv_qp *qp, uint32_t dest)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
				   (qp_type == IBV_QPT_RC ? IBV_ACCESS_REMOTE_READ : 0),
	};
	REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					      IBV_QP_ACCESS_FLAGS) == 0, "INIT");
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.max_dest_rd_atomic = qp_type == IBV_QPT_RC ? 4 : 0;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.sgid_index = sgid_index;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	int rc = qp_type == IBV_QPT_RC;
	REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
					      IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					      (rc ? IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER
						  : 0)) == 0,
		"RTR");
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 4;
	REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN |
					      (rc ? IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
							    IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC
						  : 0)) == 0,
		"RTS");
}

static struct pair connect_pair(void)
{
	struct pair p;
	p.acq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	p.bcq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	REQUIRE(p.acq && p.bcq, "create_cq");
	p.a = make_qp(p.acq);
	p.b = make_qp(p.bcq);
	to_rts(p.a, p.b->qp_num);
	to_rts(p.b, p.a->qp_num);
	return p;
}

static void drop_pair(struct pair *p)
{
	ibv_destroy_qp(p->a);
	ibv_destroy_qp(p->b);
	ibv_destroy_cq(p->acq);
	ibv_destroy_cq(p->bcq);
}

/* `a` WRITEs (or READs) 16 bytes at `off` of b's buffer through `rkey`: the status. */
static enum ibv_wc_status rdma(struct pair *p, enum ibv_wr_opcode op, uint32_t rkey,
			       size_t off)
{
	struct ibv_sge s = { .addr = (uintptr_t)abuf, .length = 16, .lkey = amr->lkey };
	struct ibv_send_wr wr = { .wr_id = 77, .sg_list = &s, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED };
	wr.wr.rdma.remote_addr = (uintptr_t)bbuf + off;
	wr.wr.rdma.rkey = rkey;
	struct ibv_send_wr *bad;
	REQUIRE(ibv_post_send(p->a, &wr, &bad) == 0, "post RDMA");
	struct ibv_wc wc;
	REQUIRE(poll1(p->acq, &wc) == 1, "no RDMA completion");
	return wc.status;
}

/* One completion on b's CQ: it must be `opcode`, success, `wr_id`. */
static void bind_done(struct pair *p, enum ibv_wc_opcode opcode, uint64_t wr_id, const char *what)
{
	struct ibv_wc wc;
	REQUIRE(poll1(p->bcq, &wc) == 1, "no completion for %s", what);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == opcode && wc.wr_id == wr_id,
	      "%s: %s, opcode %d, wr_id %llu", what, ibv_wc_status_str(wc.status), wc.opcode,
	      (unsigned long long)wc.wr_id);
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	struct ibv_device **list = ibv_get_device_list(NULL);
	REQUIRE(list && list[0], "no device");
	ctx = ibv_open_device(list[0]);
	REQUIRE(ctx != NULL, "open");
	pd = ibv_alloc_pd(ctx);
	REQUIRE(pd != NULL, "alloc_pd");
	struct ibv_port_attr pa;
	REQUIRE(ibv_query_port(ctx, 1, &pa) == 0, "query_port");
	int found = 0;
	for (int i = 0; i < pa.gid_tbl_len && !found; i++) {
		struct ibv_gid_entry e;
		if (ibv_query_gid_ex(ctx, 1, i, &e, 0) == 0 && e.gid_type == IBV_GID_TYPE_ROCE_V2) {
			gid = e.gid;
			sgid_index = i;
			found = 1;
		}
	}
	REQUIRE(found, "no RoCE v2 GID");

	/* Caps as rxe reports them. */
	struct ibv_device_attr da;
	REQUIRE(ibv_query_device(ctx, &da) == 0, "query_device");
	CHECK(da.max_mw > 0, "max_mw is %d", da.max_mw);
	CHECK(da.device_cap_flags & IBV_DEVICE_MEM_WINDOW, "no MEM_WINDOW cap");
	CHECK(da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B, "no MEM_WINDOW_TYPE_2B cap");

	abuf = aligned_alloc(4096, LEN);
	bbuf = aligned_alloc(4096, LEN);
	memset(abuf, 0x5c, LEN);
	memset(bbuf, 0, LEN);
	amr = ibv_reg_mr(pd, abuf, LEN, IBV_ACCESS_LOCAL_WRITE);
	/* b's region grants nothing remote itself: only its windows do. */
	bmr = ibv_reg_mr(pd, bbuf, LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	REQUIRE(amr && bmr, "reg_mr");
	errno = 0;
	CHECK(ibv_alloc_mw(pd, (enum ibv_mw_type)3) == NULL && errno == EINVAL,
	      "alloc_mw of an unknown type is not EINVAL");

	/* ---- type 1: ibv_bind_mw ---- */
	struct pair p = connect_pair();
	struct ibv_mw *mw1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	REQUIRE(mw1 != NULL, "alloc_mw type 1");
	CHECK(mw1->type == IBV_MW_TYPE_1 && mw1->pd == pd && mw1->context == ctx, "ibv_mw fields");
	CHECK(rdma(&p, IBV_WR_RDMA_WRITE, bmr->rkey, 0) == IBV_WC_REM_ACCESS_ERR,
	      "the region's own rkey grants nothing");
	drop_pair(&p);
	p = connect_pair();
	uint32_t before = mw1->rkey;
	struct ibv_mw_bind bind = {
		.wr_id = 11, .send_flags = IBV_SEND_SIGNALED,
		.bind_info = { .mr = bmr, .addr = (uintptr_t)bbuf + 1024, .length = 1024,
			       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ },
	};
	REQUIRE(ibv_bind_mw(p.b, mw1, &bind) == 0, "ibv_bind_mw");
	CHECK(mw1->rkey == ibv_inc_rkey(before), "mw->rkey is ibv_inc_rkey of the old one");
	bind_done(&p, IBV_WC_BIND_MW, 11, "ibv_bind_mw");
	CHECK(rdma(&p, IBV_WR_RDMA_WRITE, mw1->rkey, 1024 + 16) == IBV_WC_SUCCESS,
	      "WRITE through the window");
	CHECK(memcmp(bbuf + 1024 + 16, abuf, 16) == 0, "the WRITE landed");
	CHECK(rdma(&p, IBV_WR_RDMA_READ, mw1->rkey, 1024 + 16) == IBV_WC_SUCCESS,
	      "READ through the window");
	errno = 0;
	CHECK(ibv_dereg_mr(bmr) == EINVAL, "dereg of a region with a window bound is not EINVAL");
	CHECK(ibv_dealloc_pd(pd) == EBUSY, "dealloc_pd with objects is not EBUSY");
	/* Outside the window (inside the region): remote access error. */
	CHECK(rdma(&p, IBV_WR_RDMA_WRITE, mw1->rkey, 2048 - 8) == IBV_WC_REM_ACCESS_ERR,
	      "a WRITE across the window's end is not REM_ACCESS_ERR");
	CHECK(bbuf[2048] == 0, "the refused WRITE landed");
	drop_pair(&p);

	/* A zero-length bind unbinds it: the old rkey is dead. */
	p = connect_pair();
	uint32_t old = mw1->rkey;
	struct ibv_mw_bind unbind = { .wr_id = 12, .send_flags = IBV_SEND_SIGNALED };
	REQUIRE(ibv_bind_mw(p.b, mw1, &unbind) == 0, "unbind");
	bind_done(&p, IBV_WC_BIND_MW, 12, "unbind");
	CHECK(rdma(&p, IBV_WR_RDMA_WRITE, old, 1024) == IBV_WC_REM_ACCESS_ERR,
	      "the unbound rkey still works");
	drop_pair(&p);
	CHECK(ibv_dealloc_mw(mw1) == 0, "dealloc_mw");

	/* ---- type 2: IBV_WR_BIND_MW, SEND with invalidate, IBV_WR_LOCAL_INV ---- */
	struct ibv_mw *mw2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	REQUIRE(mw2 != NULL, "alloc_mw type 2");
	p = connect_pair();
	CHECK(ibv_bind_mw(p.b, mw2, &bind) == EINVAL, "ibv_bind_mw of a type 2 window");
	uint32_t k2 = ibv_inc_rkey(mw2->rkey);
	struct ibv_send_wr wr = { .wr_id = 21, .opcode = IBV_WR_BIND_MW,
				  .send_flags = IBV_SEND_SIGNALED };
	wr.bind_mw.mw = mw2;
	wr.bind_mw.rkey = k2;
	wr.bind_mw.bind_info = bind.bind_info;
	struct ibv_send_wr *bad;
	REQUIRE(ibv_post_send(p.b, &wr, &bad) == 0, "post IBV_WR_BIND_MW");
	bind_done(&p, IBV_WC_BIND_MW, 21, "IBV_WR_BIND_MW");
	CHECK(rdma(&p, IBV_WR_RDMA_WRITE, k2, 1024) == IBV_WC_SUCCESS, "WRITE through type 2");
	/* A peer's SEND with invalidate frees it; the receive says so. */
	struct ibv_sge rs = { .addr = (uintptr_t)bbuf + 4096, .length = 64, .lkey = bmr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 31, .sg_list = &rs, .num_sge = 1 }, *rbad;
	REQUIRE(ibv_post_recv(p.b, &rwr, &rbad) == 0, "post_recv");
	struct ibv_sge ss = { .addr = (uintptr_t)abuf, .length = 8, .lkey = amr->lkey };
	struct ibv_send_wr swr = { .wr_id = 32, .sg_list = &ss, .num_sge = 1,
				   .opcode = IBV_WR_SEND_WITH_INV, .send_flags = IBV_SEND_SIGNALED };
	swr.invalidate_rkey = k2;
	REQUIRE(ibv_post_send(p.a, &swr, &bad) == 0, "post SEND_WITH_INV");
	struct ibv_wc wc;
	REQUIRE(poll1(p.acq, &wc) == 1, "no SEND completion");
	CHECK(wc.status == IBV_WC_SUCCESS, "SEND with invalidate: %s", ibv_wc_status_str(wc.status));
	REQUIRE(poll1(p.bcq, &wc) == 1, "no receive completion");
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.byte_len == 8,
	      "receive: %s", ibv_wc_status_str(wc.status));
	CHECK((wc.wc_flags & IBV_WC_WITH_INV) && wc.invalidated_rkey == k2,
	      "receive without WITH_INV / the rkey: %x %x", wc.wc_flags, wc.invalidated_rkey);
	CHECK(rdma(&p, IBV_WR_RDMA_WRITE, k2, 1024) == IBV_WC_REM_ACCESS_ERR,
	      "the invalidated rkey still works");
	drop_pair(&p);

	/* Bound again (ibv_wr_bind_mw), then IBV_WR_LOCAL_INV (ibv_wr_local_inv). */
	p = connect_pair();
	struct ibv_qp_ex *bx = ibv_qp_to_qp_ex(p.b);
	REQUIRE(bx != NULL, "qp_to_qp_ex");
	mw2->rkey = k2; /* the program keeps a type 2 window's rkey */
	uint32_t k3 = ibv_inc_rkey(k2);
	ibv_wr_start(bx);
	bx->wr_id = 41;
	bx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(bx, mw2, k3, &bind.bind_info);
	CHECK(ibv_wr_complete(bx) == 0, "ibv_wr_bind_mw");
	bind_done(&p, IBV_WC_BIND_MW, 41, "ibv_wr_bind_mw");
	CHECK(rdma(&p, IBV_WR_RDMA_WRITE, k3, 1024) == IBV_WC_SUCCESS, "WRITE after rebinding");
	ibv_wr_start(bx);
	bx->wr_id = 42;
	bx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(bx, k3);
	CHECK(ibv_wr_complete(bx) == 0, "ibv_wr_local_inv");
	bind_done(&p, IBV_WC_LOCAL_INV, 42, "ibv_wr_local_inv");
	CHECK(rdma(&p, IBV_WR_RDMA_WRITE, k3, 1024) == IBV_WC_REM_ACCESS_ERR,
	      "the locally invalidated rkey still works");
	drop_pair(&p);

	/* A bind the window's rules refuse (outside the region) fails the QP. */
	p = connect_pair();
	mw2->rkey = k3;
	wr.wr_id = 51;
	wr.bind_mw.rkey = ibv_inc_rkey(k3);
	wr.bind_mw.bind_info.length = 2 * LEN;
	REQUIRE(ibv_post_send(p.b, &wr, &bad) == 0, "post a bad bind");
	REQUIRE(poll1(p.bcq, &wc) == 1, "no completion for the bad bind");
	CHECK(wc.status == IBV_WC_MW_BIND_ERR, "bad bind: %s", ibv_wc_status_str(wc.status));
	drop_pair(&p);

	/* ---- UC takes binds too (rxe's UC does): a WRITE with immediate through it ---- */
	qp_type = IBV_QPT_UC;
	p = connect_pair();
	struct ibv_mw *mw3 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
	REQUIRE(mw3 != NULL, "alloc_mw for UC");
	bind.wr_id = 61;
	REQUIRE(ibv_bind_mw(p.b, mw3, &bind) == 0, "ibv_bind_mw on UC");
	bind_done(&p, IBV_WC_BIND_MW, 61, "ibv_bind_mw on UC");
	memset(bbuf + 1024, 0, 16);
	struct ibv_recv_wr urwr = { .wr_id = 62 }, *urbad;
	REQUIRE(ibv_post_recv(p.b, &urwr, &urbad) == 0, "post_recv on UC");
	struct ibv_sge us = { .addr = (uintptr_t)abuf, .length = 16, .lkey = amr->lkey };
	struct ibv_send_wr uw = { .wr_id = 63, .sg_list = &us, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
				  .send_flags = IBV_SEND_SIGNALED };
	uw.wr.rdma.remote_addr = (uintptr_t)bbuf + 1024;
	uw.wr.rdma.rkey = mw3->rkey;
	REQUIRE(ibv_post_send(p.a, &uw, &bad) == 0, "UC WRITE with immediate");
	REQUIRE(poll1(p.bcq, &wc) == 1, "no UC receive");
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM,
	      "UC WRITE through the window: %s", ibv_wc_status_str(wc.status));
	CHECK(memcmp(bbuf + 1024, abuf, 16) == 0, "the UC WRITE landed");
	drop_pair(&p);
	CHECK(ibv_dealloc_mw(mw3) == 0, "dealloc_mw UC");

	CHECK(ibv_dealloc_mw(mw2) == 0, "dealloc_mw type 2");
	CHECK(ibv_dereg_mr(bmr) == 0, "dereg once no window is bound");
	ibv_dereg_mr(amr);
	CHECK(ibv_dealloc_pd(pd) == 0, "dealloc_pd");
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("%d failures\n", failures);
	return failures ? 1 : 0;
}
