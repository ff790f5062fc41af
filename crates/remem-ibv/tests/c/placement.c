/* The RoCEv2 memory placement extensions through the ex API: ATOMIC WRITE and FLUSH.
 *
 * Built by tests/placement_c.rs against Debian's verbs.h (rdma-core 44, which has ATOMIC
 * WRITE but not FLUSH: the FLUSH names and `ibv_qp_ex::wr_flush` of rdma-core 45+ are
 * spelled out below with upstream's values), linked against the system libibverbs and
 * run with LD_LIBRARY_PATH pointing at the drop-in. One process, two RC QPs connected
 * to each other on the soft device. Prints one line per check; exits 1 on a failure. */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "check.h"

/* rdma-core 45+ / <rdma/ib_user_verbs.h> values (absent from rdma-core 44's headers). */
#define DEVICE_FLUSH_GLOBAL (1ULL << 38)
#define DEVICE_FLUSH_PERSISTENT (1ULL << 39)
#define DEVICE_ATOMIC_WRITE (1ULL << 40)
#define ACCESS_FLUSH_GLOBAL (1 << 8)
#define ACCESS_FLUSH_PERSISTENT (1 << 9)
#define QP_EX_WITH_FLUSH (1 << 11)
#define WC_FLUSH 8
#define FLUSH_GLOBAL 1
#define FLUSH_PERSISTENT 2
#define FLUSH_RANGE 0
#define FLUSH_MR 1

typedef void (*wr_flush_fn)(struct ibv_qp_ex *qp, uint32_t rkey, uint64_t remote_addr,
			    size_t len, uint8_t type, uint8_t level);

/* `ibv_qp_ex::wr_flush`: the member right after `wr_atomic_write` (where rdma-core 45+
 * declares it; reading it this way works with either header). */
static wr_flush_fn flush_of(struct ibv_qp_ex *qx)
{
	wr_flush_fn f;
	memcpy(&f, (char *)qx + offsetof(struct ibv_qp_ex, wr_atomic_write) + sizeof(void *),
	       sizeof f);
	return f;
}

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;
static uint8_t sgid_index;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* One completion from `cq` (10 s at most). */
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
	struct ibv_cq *cq;
	struct ibv_qp *a, *b;
	struct ibv_qp_ex *ax;
};

static struct ibv_qp *make_qp(struct ibv_cq *cq, uint64_t ops)
{
	struct ibv_qp_init_attr_ex ia = {
		.send_cq = cq, .recv_cq = cq,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
			 .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = ops,
	};
	return ibv_create_qp_ex(ctx, &ia);
}

static void to_rts(struct ibv_qp *qp, uint32_t dest)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_ATOMIC | ACCESS_FLUSH_GLOBAL |
				   ACCESS_FLUSH_PERSISTENT,
	};
	REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					      IBV_QP_ACCESS_FLAGS) == 0,
		"INIT");
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.sgid_index = sgid_index;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
					      IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0,
		"RTR");
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 4;
	REQUIRE(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					      IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					      IBV_QP_MAX_QP_RD_ATOMIC) == 0,
		"RTS");
}

/* A connected pair: `a` has the ATOMIC WRITE and FLUSH builders. */
static struct pair connect_pair(void)
{
	struct pair p;
	p.cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	REQUIRE(p.cq != NULL, "create_cq");
	p.a = make_qp(p.cq, IBV_QP_EX_WITH_ATOMIC_WRITE | QP_EX_WITH_FLUSH |
				    IBV_QP_EX_WITH_RDMA_WRITE);
	REQUIRE(p.a != NULL, "create_qp_ex with ATOMIC_WRITE | FLUSH");
	p.b = make_qp(p.cq, IBV_QP_EX_WITH_SEND);
	REQUIRE(p.b != NULL, "create_qp_ex");
	to_rts(p.a, p.b->qp_num);
	to_rts(p.b, p.a->qp_num);
	p.ax = ibv_qp_to_qp_ex(p.a);
	REQUIRE(p.ax != NULL && p.ax->wr_atomic_write != NULL && flush_of(p.ax) != NULL,
		"ibv_qp_ex has wr_atomic_write and wr_flush");
	return p;
}

static void drop_pair(struct pair *p)
{
	ibv_destroy_qp(p->a);
	ibv_destroy_qp(p->b);
	ibv_destroy_cq(p->cq);
}

static struct ibv_wc atomic_write(struct pair *p, uint32_t rkey, uint64_t addr, uint64_t v)
{
	uint64_t value = v;
	ibv_wr_start(p->ax);
	p->ax->wr_id = 7;
	p->ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_write(p->ax, rkey, addr, &value);
	int r = ibv_wr_complete(p->ax);
	/* The value was copied by the call: changing it now changes nothing. */
	value = 0xdeadbeef;
	CHECK(r == 0, "ibv_wr_complete (atomic write): %d", r);
	struct ibv_wc wc = { 0 };
	CHECK(poll1(p->cq, &wc) == 1, "no completion for the atomic write");
	return wc;
}

static struct ibv_wc flush(struct pair *p, uint32_t rkey, uint64_t addr, size_t len,
			   uint8_t type, uint8_t level)
{
	ibv_wr_start(p->ax);
	p->ax->wr_id = 9;
	p->ax->wr_flags = IBV_SEND_SIGNALED;
	flush_of(p->ax)(p->ax, rkey, addr, len, type, level);
	int r = ibv_wr_complete(p->ax);
	CHECK(r == 0, "ibv_wr_complete (flush): %d", r);
	struct ibv_wc wc = { 0 };
	CHECK(poll1(p->cq, &wc) == 1, "no completion for the flush");
	return wc;
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

	/* The device reports the extensions, as rxe does. */
	struct ibv_device_attr_ex dx;
	REQUIRE(ibv_query_device_ex(ctx, NULL, &dx) == 0, "query_device_ex");
	CHECK(dx.device_cap_flags_ex & DEVICE_ATOMIC_WRITE, "no ATOMIC_WRITE cap: %llx",
	      (unsigned long long)dx.device_cap_flags_ex);
	CHECK(dx.device_cap_flags_ex & DEVICE_FLUSH_GLOBAL, "no FLUSH_GLOBAL cap");
	CHECK(dx.device_cap_flags_ex & DEVICE_FLUSH_PERSISTENT, "no FLUSH_PERSISTENT cap");
	CHECK((dx.device_cap_flags_ex & 0xffffffffULL) == dx.orig_attr.device_cap_flags,
	      "the low bits are device_cap_flags");

	/* Only RC offers them. */
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_qp_init_attr_ex ud = {
		.send_cq = cq, .recv_cq = cq,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_UD,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_ATOMIC_WRITE,
	};
	errno = 0;
	CHECK(ibv_create_qp_ex(ctx, &ud) == NULL && errno == EOPNOTSUPP,
	      "UD with ATOMIC_WRITE is not EOPNOTSUPP");
	ud.send_ops_flags = IBV_QP_EX_WITH_SEND | QP_EX_WITH_FLUSH;
	errno = 0;
	CHECK(ibv_create_qp_ex(ctx, &ud) == NULL && errno == EOPNOTSUPP,
	      "UD with FLUSH is not EOPNOTSUPP");
	ibv_destroy_cq(cq);

	enum { LEN = 4096 };
	uint64_t *mem = aligned_alloc(4096, LEN);
	memset(mem, 0, LEN);
	/* Persistence needs persistent memory: rxe refuses FLUSH_PERSISTENT for other
	 * memory, and so does the drop-in (program memory is never durable). */
	errno = 0;
	CHECK(ibv_reg_mr(pd, mem, LEN, IBV_ACCESS_LOCAL_WRITE | ACCESS_FLUSH_PERSISTENT) == NULL &&
		      errno == EINVAL,
	      "FLUSH_PERSISTENT on anonymous memory is not EINVAL");
	struct ibv_mr *mr = ibv_reg_mr(pd, mem, LEN,
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					       IBV_ACCESS_REMOTE_READ | ACCESS_FLUSH_GLOBAL);
	REQUIRE(mr != NULL, "reg_mr with FLUSH_GLOBAL");

	struct pair p = connect_pair();

	/* ATOMIC WRITE lands the 8 bytes. */
	struct ibv_wc wc = atomic_write(&p, mr->rkey, (uintptr_t)&mem[3], 0x0123456789abcdefULL);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_ATOMIC_WRITE && wc.wr_id == 7,
	      "atomic write completion: status %d opcode %d", wc.status, wc.opcode);
	CHECK(__atomic_load_n(&mem[3], __ATOMIC_SEQ_CST) == 0x0123456789abcdefULL,
	      "atomic write did not land: %llx", (unsigned long long)mem[3]);
	CHECK(mem[2] == 0 && mem[4] == 0, "atomic write touched its neighbours");

	/* FLUSH, of a range and of the whole region. */
	wc = flush(&p, mr->rkey, (uintptr_t)mem, 64, FLUSH_GLOBAL, FLUSH_RANGE);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == WC_FLUSH && wc.wr_id == 9,
	      "global range flush: status %d opcode %d", wc.status, wc.opcode);
	wc = flush(&p, mr->rkey, (uintptr_t)mem, 0, FLUSH_GLOBAL, FLUSH_MR);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == WC_FLUSH,
	      "global region flush: status %d opcode %d", wc.status, wc.opcode);

	/* Bad arguments are refused by ibv_wr_complete, nothing posted. */
	ibv_wr_start(p.ax);
	flush_of(p.ax)(p.ax, mr->rkey, (uintptr_t)mem, 64, 4, FLUSH_RANGE);
	CHECK(ibv_wr_complete(p.ax) == EINVAL, "flush of an unknown type is not EINVAL");
	ibv_wr_start(p.ax);
	flush_of(p.ax)(p.ax, mr->rkey, (uintptr_t)mem, 64, FLUSH_GLOBAL, 2);
	CHECK(ibv_wr_complete(p.ax) == EINVAL, "flush of an unknown level is not EINVAL");
	ibv_wr_start(p.ax);
	ibv_wr_atomic_write(p.ax, mr->rkey, (uintptr_t)mem, NULL);
	CHECK(ibv_wr_complete(p.ax) == EINVAL, "atomic write of NULL is not EINVAL");
	CHECK(ibv_poll_cq(p.cq, 1, &wc) == 0, "a refused batch completed something");

	/* ATOMIC WRITE into a region without REMOTE_WRITE: remote access error (rxe checks
	 * the region's remote write right). */
	uint64_t *ro = aligned_alloc(4096, LEN);
	memset(ro, 0, LEN);
	struct ibv_mr *romr = ibv_reg_mr(pd, ro, LEN, IBV_ACCESS_LOCAL_WRITE |
						      IBV_ACCESS_REMOTE_READ);
	REQUIRE(romr != NULL, "reg_mr read-only");
	wc = atomic_write(&p, romr->rkey, (uintptr_t)ro, 42);
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR, "atomic write without REMOTE_WRITE: %s",
	      ibv_wc_status_str(wc.status));
	CHECK(ro[0] == 0, "the refused atomic write landed");
	drop_pair(&p);

	/* FLUSH of a region registered without the FLUSH access bits: remote access error. */
	p = connect_pair();
	wc = flush(&p, romr->rkey, (uintptr_t)ro, 64, FLUSH_GLOBAL, FLUSH_RANGE);
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR, "flush without FLUSH_GLOBAL access: %s",
	      ibv_wc_status_str(wc.status));
	drop_pair(&p);

	/* A region with FLUSH_GLOBAL only refuses a persistent FLUSH. */
	struct ibv_mr *gmr = ibv_reg_mr(pd, ro, LEN, IBV_ACCESS_REMOTE_READ |
						     ACCESS_FLUSH_GLOBAL);
	REQUIRE(gmr != NULL, "reg_mr FLUSH_GLOBAL");
	p = connect_pair();
	wc = flush(&p, gmr->rkey, (uintptr_t)ro, 64, FLUSH_GLOBAL, FLUSH_RANGE);
	CHECK(wc.status == IBV_WC_SUCCESS, "global flush with FLUSH_GLOBAL: %s",
	      ibv_wc_status_str(wc.status));
	wc = flush(&p, gmr->rkey, (uintptr_t)ro, 64, FLUSH_PERSISTENT, FLUSH_RANGE);
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR, "persistent flush with FLUSH_GLOBAL only: %s",
	      ibv_wc_status_str(wc.status));
	drop_pair(&p);

	ibv_dereg_mr(gmr);
	ibv_dereg_mr(romr);
	ibv_dereg_mr(mr);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("%d failures\n", failures);
	return failures ? 1 : 0;
}
