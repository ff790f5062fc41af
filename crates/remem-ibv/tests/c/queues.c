/* Error paths and blocking behaviour of the drop-in's queues, through the C ABI.
 *
 * Built by tests/queues_c.rs against Debian's verbs.h, linked against the system
 * libibverbs and run with LD_LIBRARY_PATH pointing at the drop-in, so that it exercises
 * exactly what an unmodified program does. Prints "ok - <what>" per check and exits 0
 * when every check passed; the first failure prints "not ok - <what>: <why>" and exits 1.
 * Every wait is bounded (a failure, never a hang). */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define FAIL(...)                                                          \
	do {                                                               \
		printf("not ok - " __VA_ARGS__);                          \
		printf("\n");                                              \
		fflush(stdout);                                            \
		exit(1);                                                   \
	} while (0)
#define OK(what) printf("ok - %s\n", what)

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;
static uint8_t sgid_index; /* the RoCE v2 GID: remem speaks RoCE v2 only */
static char *buf;
static struct ibv_mr *mr;
enum { BUF = 4096 };

/* Polls `cq` until `n` completions arrived (10 s at most); returns how many it got. */
static int poll_n(struct ibv_cq *cq, struct ibv_wc *wc, int n)
{
	int got = 0;
	double end = now_s() + 10;
	while (got < n && now_s() < end) {
		int r = ibv_poll_cq(cq, n - got, wc + got);
		if (r < 0)
			return r;
		got += r;
	}
	return got;
}

static struct ibv_qp *rc_qp(struct ibv_cq *scq, struct ibv_cq *rcq, struct ibv_srq *srq)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = scq, .recv_cq = rcq, .srq = srq,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 2,
			 .max_recv_sge = 2, .max_inline_data = 64 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp)
		FAIL("ibv_create_qp: %s", strerror(errno));
	if (ia.cap.max_inline_data < 64 || ia.cap.max_send_wr < 16)
		FAIL("create_qp wrote back smaller caps");
	if (ia.cap.max_send_sge != 4)
		FAIL("max_send_sge %u, not rxe's 4 (a 64-byte WQE)", ia.cap.max_send_sge);
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
						    IBV_ACCESS_REMOTE_READ |
						    IBV_ACCESS_REMOTE_ATOMIC };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					  IBV_QP_ACCESS_FLAGS))
		FAIL("modify to INIT");
	if (qp->state != IBV_QPS_INIT)
		FAIL("ibv_qp.state is %d after INIT", qp->state);
	return qp;
}

static void connect_qp(struct ibv_qp *qp, uint32_t dest)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = dest,
		.rq_psn = 0, .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .grh = { .dgid = gid, .sgid_index = sgid_index,
						       .hop_limit = 1 },
			     .port_num = 1 },
	};
	/* RoCE needs a GRH: the same attributes without is_global are refused. */
	struct ibv_qp_attr nogrh = a;
	nogrh.ah_attr.is_global = 0;
	int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
		   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	if (ibv_modify_qp(qp, &nogrh, mask) != EINVAL)
		FAIL("modify to RTR without a GRH is not EINVAL");
	if (ibv_modify_qp(qp, &a, mask))
		FAIL("modify to RTR: %s", strerror(errno));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					  IBV_QP_MAX_QP_RD_ATOMIC))
		FAIL("modify to RTS: %s", strerror(errno));
	if (qp->state != IBV_QPS_RTS)
		FAIL("ibv_qp.state is %d after RTS", qp->state);
}

static struct ibv_sge sge(void *addr, uint32_t len, uint32_t lkey)
{
	struct ibv_sge s = { .addr = (uintptr_t)addr, .length = len, .lkey = lkey };
	return s;
}

/* ---- blocking ibv_get_cq_event ---- */

struct waiter {
	struct ibv_comp_channel *ch;
	pid_t tid;
	int ret, err;
	struct ibv_cq *cq;
	void *cq_ctx;
	volatile int started;
};

static void *wait_event(void *p)
{
	struct waiter *w = p;
	w->tid = (pid_t)syscall(SYS_gettid);
	__atomic_store_n(&w->started, 1, __ATOMIC_SEQ_CST);
	w->ret = ibv_get_cq_event(w->ch, &w->cq, &w->cq_ctx);
	w->err = errno;
	return NULL;
}

/* Whether thread `tid` of this process is asleep in the kernel ('S' in its stat). */
static int asleep(pid_t tid)
{
	char path[64], line[512];
	snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	int n = fread(line, 1, sizeof line - 1, f);
	fclose(f);
	line[n > 0 ? n : 0] = 0;
	char *p = strrchr(line, ')');
	return p && p[1] == ' ' && p[2] == 'S';
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	struct ibv_device **list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		FAIL("no device");
	ctx = ibv_open_device(list[0]);
	if (!ctx)
		FAIL("open");
	pd = ibv_alloc_pd(ctx);
	struct ibv_port_attr pa;
	if (ibv_query_port(ctx, 1, &pa))
		FAIL("query_port");
	int found = 0;
	for (int i = 0; i < pa.gid_tbl_len && !found; i++) {
		struct ibv_gid_entry e;
		if (ibv_query_gid_ex(ctx, 1, i, &e, 0) == 0 && e.gid_type == IBV_GID_TYPE_ROCE_V2) {
			gid = e.gid;
			sgid_index = i;
			found = 1;
		}
	}
	if (!found)
		FAIL("no RoCE v2 GID");
	buf = aligned_alloc(4096, BUF);
	memset(buf, 0, BUF);
	mr = ibv_reg_mr(pd, buf, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					      IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	if (!mr)
		FAIL("reg_mr: %s", strerror(errno));

	/* Channels and CQs. */
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	if (!ch || ch->fd < 0)
		FAIL("create_comp_channel");
	if (ibv_create_cq(ctx, 16, NULL, ch, ctx->num_comp_vectors) != NULL || errno != EINVAL)
		FAIL("comp_vector out of range is not EINVAL");
	if (ibv_create_cq(ctx, 0, NULL, NULL, 0) != NULL || errno != EINVAL)
		FAIL("cqe 0 is not EINVAL");
	OK("create_cq checks comp_vector and cqe");
	int cookie;
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, &cookie, ch, 0);
	if (!cq || cq->cqe < 64 || cq->channel != ch || cq->cq_context != &cookie)
		FAIL("create_cq");
	struct ibv_cq *plain = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	if (!plain)
		FAIL("create_cq without channel");
	if (ibv_req_notify_cq(plain, 0))
		FAIL("req_notify on a CQ without a channel fails");
	if (ibv_destroy_comp_channel(ch) != EBUSY)
		FAIL("destroy_comp_channel with a CQ on it is not EBUSY");
	OK("destroy_comp_channel in use is EBUSY");

	struct ibv_qp *a = rc_qp(cq, cq, NULL), *b = rc_qp(plain, plain, NULL);
	if (ibv_destroy_cq(cq) != EBUSY)
		FAIL("destroy_cq with a QP on it is not EBUSY");
	OK("destroy_cq in use is EBUSY");
	connect_qp(a, b->qp_num);
	connect_qp(b, a->qp_num);
	OK("RC pair connected (RTR without GRH is EINVAL)");

	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qia;
	if (ibv_query_qp(a, &qa, IBV_QP_STATE | IBV_QP_CAP | IBV_QP_DEST_QPN, &qia) ||
	    qa.qp_state != IBV_QPS_RTS || qa.dest_qp_num != b->qp_num ||
	    qia.send_cq != cq || qia.qp_type != IBV_QPT_RC || qa.cap.max_inline_data < 64 ||
	    qa.ah_attr.is_global != 1 || memcmp(&qa.ah_attr.grh.dgid, &gid, 16))
		FAIL("query_qp");
	OK("query_qp");

	struct ibv_wc wc[8];
	struct ibv_send_wr *bad;

	/* A bad opcode in the second WR of a list: EINVAL, bad_wr names it, the first WR is
	 * posted and completes. */
	{
		struct ibv_sge s = sge(buf, 8, mr->lkey);
		struct ibv_send_wr w2 = { .wr_id = 2, .sg_list = &s, .num_sge = 1,
					  .opcode = 77, .send_flags = IBV_SEND_SIGNALED };
		struct ibv_send_wr w1 = { .wr_id = 1, .next = &w2, .sg_list = &s, .num_sge = 1,
					  .opcode = IBV_WR_RDMA_WRITE,
					  .send_flags = IBV_SEND_SIGNALED };
		w1.wr.rdma.remote_addr = (uintptr_t)buf + 1024;
		w1.wr.rdma.rkey = mr->rkey;
		bad = NULL;
		int r = ibv_post_send(a, &w1, &bad);
		if (r != EINVAL || bad != &w2)
			FAIL("bad opcode: ret %d bad_wr %p (want EINVAL, %p)", r, (void *)bad,
			     (void *)&w2);
		if (poll_n(cq, wc, 1) != 1 || wc[0].wr_id != 1 || wc[0].status != IBV_WC_SUCCESS ||
		    wc[0].opcode != IBV_WC_RDMA_WRITE || wc[0].qp_num != a->qp_num)
			FAIL("the WR before the bad one did not complete");
		OK("bad opcode is EINVAL with bad_wr; earlier WRs are posted");
	}
	/* Too many SGEs: EINVAL. The QP asked for 2 SGEs and 64 inline bytes; rxe grants what
	 * fits the 64-byte send WQE, 4 SGEs, so 5 are too many. */
	{
		struct ibv_sge s[5] = { sge(buf, 8, mr->lkey), sge(buf, 8, mr->lkey),
					sge(buf, 8, mr->lkey), sge(buf, 8, mr->lkey),
					sge(buf, 8, mr->lkey) };
		struct ibv_send_wr w = { .wr_id = 3, .sg_list = s, .num_sge = 5,
					 .opcode = IBV_WR_RDMA_WRITE };
		w.wr.rdma.remote_addr = (uintptr_t)buf;
		w.wr.rdma.rkey = mr->rkey;
		if (ibv_post_send(a, &w, &bad) != EINVAL || bad != &w)
			FAIL("5 SGEs on a QP granted max_send_sge 4 is not EINVAL");
		OK("too many SGEs is EINVAL");
	}
	/* A bad lkey never crashes: the post is refused (EINVAL, bad_wr) or the WR completes
	 * in error. */
	{
		struct ibv_sge s = sge(buf, 8, mr->lkey ^ 0x5a5a00);
		struct ibv_send_wr w = { .wr_id = 4, .sg_list = &s, .num_sge = 1,
					 .opcode = IBV_WR_RDMA_WRITE,
					 .send_flags = IBV_SEND_SIGNALED };
		w.wr.rdma.remote_addr = (uintptr_t)buf;
		w.wr.rdma.rkey = mr->rkey;
		bad = NULL;
		int r = ibv_post_send(a, &w, &bad);
		if (r == 0) {
			if (poll_n(cq, wc, 1) != 1 || wc[0].status == IBV_WC_SUCCESS)
				FAIL("bad lkey completed successfully");
		} else if (r != EINVAL || bad != &w) {
			FAIL("bad lkey: ret %d", r);
		}
		OK("bad lkey is refused, not a crash");
	}
	/* Inline data from unregistered memory, with immediate data in network order. */
	{
		char local[32] = "inline from the stack";
		struct ibv_sge rs = sge(buf + 2048, 64, mr->lkey);
		struct ibv_recv_wr rw = { .wr_id = 10, .sg_list = &rs, .num_sge = 1 }, *rbad;
		if (ibv_post_recv(b, &rw, &rbad))
			FAIL("post_recv");
		struct ibv_sge s = sge(local, sizeof local, 0);
		struct ibv_send_wr w = { .wr_id = 5, .sg_list = &s, .num_sge = 1,
					 .opcode = IBV_WR_SEND_WITH_IMM,
					 .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE,
					 .imm_data = htonl(0x01020304) };
		if (ibv_post_send(a, &w, &bad))
			FAIL("inline send: %s", strerror(errno));
		memset(local, 'x', sizeof local); /* reusable at once */
		if (poll_n(cq, wc, 1) != 1 || wc[0].status != IBV_WC_SUCCESS || wc[0].wr_id != 5 ||
		    wc[0].opcode != IBV_WC_SEND)
			FAIL("inline send completion");
		if (poll_n(plain, wc, 1) != 1 || wc[0].status != IBV_WC_SUCCESS ||
		    wc[0].opcode != IBV_WC_RECV || wc[0].byte_len != 32 ||
		    !(wc[0].wc_flags & IBV_WC_WITH_IMM) || wc[0].imm_data != htonl(0x01020304) ||
		    wc[0].qp_num != b->qp_num || wc[0].wr_id != 10)
			FAIL("receive of the inline send: byte_len %u flags %#x imm %#x",
			     wc[0].byte_len, wc[0].wc_flags, wc[0].imm_data);
		if (strcmp(buf + 2048, "inline from the stack"))
			FAIL("inline payload");
		OK("inline send from unregistered memory; imm_data in network order");
	}
	/* The new post API on the same QP: ibv_qp_to_qp_ex is only for QPs created with
	 * ibv_create_qp_ex, covered by the tools; here an atomic through ibv_post_send. */
	{
		uint64_t *target = (uint64_t *)(buf + 512);
		*target = 40;
		struct ibv_sge s = sge(buf + 520, 8, mr->lkey);
		struct ibv_send_wr w = { .wr_id = 6, .sg_list = &s, .num_sge = 1,
					 .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
					 .send_flags = IBV_SEND_SIGNALED };
		w.wr.atomic.remote_addr = (uintptr_t)target;
		w.wr.atomic.rkey = mr->rkey;
		w.wr.atomic.compare_add = 2;
		if (ibv_post_send(a, &w, &bad) || poll_n(cq, wc, 1) != 1 ||
		    wc[0].status != IBV_WC_SUCCESS || wc[0].opcode != IBV_WC_FETCH_ADD ||
		    wc[0].byte_len != 8)
			FAIL("fetch and add");
		if (*(uint64_t *)(buf + 520) != 40 || __atomic_load_n(target, __ATOMIC_SEQ_CST) != 42)
			FAIL("fetch and add values");
		OK("atomic fetch-and-add");
	}

	/* Blocking ibv_get_cq_event: a thread asleep in it is woken by a completion. */
	{
		if (ibv_req_notify_cq(cq, 0))
			FAIL("req_notify_cq");
		struct waiter w = { .ch = ch };
		pthread_t t;
		pthread_create(&t, NULL, wait_event, &w);
		double end = now_s() + 10;
		while (!(__atomic_load_n(&w.started, __ATOMIC_SEQ_CST) && asleep(w.tid)) &&
		       now_s() < end)
			sched_yield();
		if (now_s() >= end)
			FAIL("the waiter never blocked");
		struct ibv_sge s = sge(buf, 8, mr->lkey);
		struct ibv_send_wr wr = { .wr_id = 7, .sg_list = &s, .num_sge = 1,
					  .opcode = IBV_WR_RDMA_WRITE,
					  .send_flags = IBV_SEND_SIGNALED };
		wr.wr.rdma.remote_addr = (uintptr_t)buf + 8;
		wr.wr.rdma.rkey = mr->rkey;
		if (ibv_post_send(a, &wr, &bad))
			FAIL("post for the event");
		pthread_join(t, NULL);
		if (w.ret != 0 || w.cq != cq || w.cq_ctx != &cookie)
			FAIL("get_cq_event: ret %d errno %d", w.ret, w.err);
		if (poll_n(cq, wc, 1) != 1 || wc[0].wr_id != 7)
			FAIL("the completion behind the event");
		ibv_ack_cq_events(cq, 1);
		OK("blocking ibv_get_cq_event is woken by a completion");
	}
	/* With O_NONBLOCK set by the program, an empty channel is EAGAIN at once. */
	{
		int fl = fcntl(ch->fd, F_GETFL);
		if (fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK))
			FAIL("fcntl");
		struct ibv_cq *ecq;
		void *ectx;
		if (ibv_get_cq_event(ch, &ecq, &ectx) != -1 || errno != EAGAIN)
			FAIL("non-blocking get_cq_event on an empty channel is not EAGAIN");
		struct pollfd p = { .fd = ch->fd, .events = POLLIN };
		if (poll(&p, 1, 0) != 0)
			FAIL("an empty channel polls readable");
		OK("O_NONBLOCK channel: EAGAIN, and the fd polls");
	}

	/* CQ overrun: a CQ of one entry gets three completions. */
	{
		struct ibv_cq *tiny = ibv_create_cq(ctx, 1, NULL, NULL, 0);
		if (!tiny)
			FAIL("create tiny CQ");
		struct ibv_qp *c = rc_qp(tiny, tiny, NULL), *d = rc_qp(plain, plain, NULL);
		connect_qp(c, d->qp_num);
		connect_qp(d, c->qp_num);
		int cap = tiny->cqe;
		for (int i = 0; i <= cap + 1; i++) {
			struct ibv_sge s = sge(buf, 8, mr->lkey);
			struct ibv_send_wr w = { .wr_id = 100 + i, .sg_list = &s, .num_sge = 1,
						 .opcode = IBV_WR_RDMA_WRITE,
						 .send_flags = IBV_SEND_SIGNALED };
			w.wr.rdma.remote_addr = (uintptr_t)buf;
			w.wr.rdma.rkey = mr->rkey;
			if (ibv_post_send(c, &w, &bad))
				FAIL("post %d for overrun", i);
		}
		struct ibv_async_event ev;
		int fl = fcntl(ctx->async_fd, F_GETFL);
		fcntl(ctx->async_fd, F_SETFL, fl & ~O_NONBLOCK);
		struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
		if (poll(&p, 1, 10000) != 1 || ibv_get_async_event(ctx, &ev))
			FAIL("no async event after the overrun");
		if (ev.event_type != IBV_EVENT_CQ_ERR || ev.element.cq != tiny)
			FAIL("async event %d, not CQ_ERR on the tiny CQ", ev.event_type);
		ibv_ack_async_event(&ev);
		int got = 0, r;
		double end = now_s() + 10;
		while ((r = ibv_poll_cq(tiny, 1, wc)) >= 0 && now_s() < end)
			got += r;
		if (r >= 0 || got > cap)
			FAIL("overrun CQ: poll never failed (got %d)", got);
		OK("CQ overrun: CQ_ERR event, then ibv_poll_cq fails");
	}

	/* SRQ: posting to a QP's own receive queue when it uses an SRQ is EINVAL; limits. */
	{
		struct ibv_srq_init_attr sia = { .attr = { .max_wr = 8, .max_sge = 1 } };
		struct ibv_srq *srq = ibv_create_srq(pd, &sia);
		if (!srq || sia.attr.max_wr < 8)
			FAIL("create_srq: %s", strerror(errno));
		struct ibv_qp *e = rc_qp(plain, plain, srq);
		struct ibv_sge s = sge(buf, 8, mr->lkey);
		struct ibv_recv_wr rw = { .wr_id = 1, .sg_list = &s, .num_sge = 1 }, *rbad;
		if (ibv_post_recv(e, &rw, &rbad) != EINVAL || rbad != &rw)
			FAIL("post_recv on a QP with an SRQ is not EINVAL");
		if (ibv_post_srq_recv(srq, &rw, &rbad))
			FAIL("post_srq_recv");
		struct ibv_srq_attr sa = { .srq_limit = 100 };
		if (ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT) != EINVAL)
			FAIL("srq_limit above max_wr is not EINVAL");
		sa.srq_limit = 4;
		if (ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT) || ibv_query_srq(srq, &sa) ||
		    sa.srq_limit != 4 || sa.max_wr < 8)
			FAIL("modify/query srq");
		if (ibv_destroy_srq(srq) != EBUSY)
			FAIL("destroy_srq in use is not EBUSY");
		if (ibv_destroy_qp(e) || ibv_destroy_srq(srq))
			FAIL("destroy qp, srq");
		OK("SRQ: post, limit, EBUSY");
	}
	puts("all passed");
	return 0;
}
