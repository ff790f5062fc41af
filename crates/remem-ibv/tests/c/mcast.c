/* UD multicast through libibverbs (ibv_attach_mcast / ibv_detach_mcast), two processes
 * with a soft device each:
 *
 *   mcast recv GROUP   two UD QPs attached to GROUP (::ffff:GROUP), a third not; writes
 *                      "joined GROUP" to $REMEM_RDMACM_NOTIFY, then waits for one datagram
 *                      on each attached QP and checks that the third got none; checks the
 *                      errors (EINVAL: a unicast GID, a QP not attached, an RC QP) and the
 *                      device's multicast limits (rxe's).
 *   mcast send GROUP   sends one datagram to GROUP (QPN 0xFFFFFF).
 *   mcast join GROUP IP  rdma_join_multicast on an id bound to IP (no QP): the
 *                      MULTICAST_JOIN event's ud parameters are the kernel's for RoCE v2
 *                      (MGID ::ffff:GROUP, QPN 0xFFFFFF, Q_Key RDMA_UDP_QKEY, hop limit 64,
 *                      the join's context); joining again and leaving twice fail.
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <stdint.h>
#include <unistd.h>

#include "check.h"

#define QKEY 0x11111111u
#define MSG "hello, group"
#define BUF 256

struct ud {
	struct ibv_cq *cq;
	struct ibv_qp *qp;
};

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_mr *mr;
static char mem[4][BUF];

static struct ud ud_qp(void)
{
	struct ud u;
	u.cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	REQUIRE(u.cq, "ibv_create_cq");
	struct ibv_qp_init_attr ia = {
		.send_cq = u.cq,
		.recv_cq = u.cq,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_UD,
		.sq_sig_all = 1,
	};
	u.qp = ibv_create_qp(pd, &ia);
	REQUIRE(u.qp, "ibv_create_qp");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };
	REQUIRE(ibv_modify_qp(u.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0, "INIT");
	a.qp_state = IBV_QPS_RTR;
	REQUIRE(ibv_modify_qp(u.qp, &a, IBV_QP_STATE) == 0, "RTR");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 1;
	REQUIRE(ibv_modify_qp(u.qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0, "RTS");
	return u;
}

/* The next completion of `cq` (busy polling, bounded). */
static int poll_one(struct ibv_cq *cq, struct ibv_wc *wc)
{
	for (long i = 0; i < 2000000000L; i++) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n != 0)
			return n;
	}
	return 0;
}

static union ibv_gid mgid_of(const char *group)
{
	union ibv_gid g;
	memset(&g, 0, sizeof g);
	g.raw[10] = 0xff;
	g.raw[11] = 0xff;
	inet_pton(AF_INET, group, &g.raw[12]);
	return g;
}

static void post_recv(struct ud *u, int i)
{
	struct ibv_sge sge = { (uintptr_t)mem[i], BUF, mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;
	REQUIRE(ibv_post_recv(u->qp, &wr, &bad) == 0, "ibv_post_recv");
}

static void notify(const char *group)
{
	const char *path = getenv("REMEM_RDMACM_NOTIFY");
	if (!path)
		return;
	int fd = open(path, O_WRONLY | O_APPEND | O_NONBLOCK);
	if (fd >= 0) {
		dprintf(fd, "joined %s\n", group);
		close(fd);
	}
}

static void receiver(const char *group)
{
	struct ibv_device_attr da;
	REQUIRE(ibv_query_device(ctx, &da) == 0, "ibv_query_device");
	CHECK(da.max_mcast_grp == 8192, "max_mcast_grp %d", da.max_mcast_grp);
	CHECK(da.max_mcast_qp_attach == 56, "max_mcast_qp_attach %d", da.max_mcast_qp_attach);
	CHECK(da.max_total_mcast_qp_attach == 0x70000, "max_total_mcast_qp_attach %d",
	      da.max_total_mcast_qp_attach);

	union ibv_gid mgid = mgid_of(group);
	union ibv_gid unicast = mgid_of("127.0.0.1");
	struct ud a = ud_qp(), b = ud_qp(), none = ud_qp();
	CHECK(ibv_attach_mcast(a.qp, &unicast, 0) == EINVAL, "a unicast GID");
	CHECK(ibv_detach_mcast(a.qp, &mgid, 0) == EINVAL, "a QP not attached");
	struct ibv_qp_init_attr rc_attr = {
		.send_cq = a.cq,
		.recv_cq = a.cq,
		.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *rc = ibv_create_qp(pd, &rc_attr);
	REQUIRE(rc, "RC QP");
	CHECK(ibv_attach_mcast(rc, &mgid, 0) == EINVAL, "an RC QP");
	ibv_destroy_qp(rc);

	CHECK(ibv_attach_mcast(a.qp, &mgid, 0) == 0, "attach a");
	CHECK(ibv_attach_mcast(a.qp, &mgid, 0) == 0, "attach a again");
	CHECK(ibv_attach_mcast(b.qp, &mgid, 0) == 0, "attach b");
	post_recv(&a, 0);
	post_recv(&b, 1);
	post_recv(&none, 2);
	printf("attached\n");
	fflush(stdout);
	notify(group);

	struct ud *both[2] = { &a, &b };
	for (int i = 0; i < 2; i++) {
		struct ibv_wc wc;
		REQUIRE(poll_one(both[i]->cq, &wc) == 1, "a datagram on QP %d", i);
		CHECK(wc.status == IBV_WC_SUCCESS, "status %d", wc.status);
		CHECK(wc.opcode == IBV_WC_RECV, "opcode %d", wc.opcode);
		CHECK(wc.byte_len == 40 + sizeof MSG, "byte_len %u", wc.byte_len);
		CHECK(wc.wc_flags & IBV_WC_GRH, "GRH");
		CHECK(memcmp(mem[wc.wr_id] + 40, MSG, sizeof MSG) == 0, "payload");
		/* The IPv4 header in the GRH area: to the group. */
		CHECK(memcmp(mem[wc.wr_id] + 36, &mgid.raw[12], 4) == 0, "destination address");
		printf("received on QP %d: \"%s\"\n", i, mem[wc.wr_id] + 40);
	}
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(none.cq, 1, &wc) == 0, "a QP not attached gets nothing");
	CHECK(ibv_detach_mcast(a.qp, &mgid, 0) == 0, "detach a");
	CHECK(ibv_detach_mcast(a.qp, &mgid, 0) == EINVAL, "detach a again");
	CHECK(ibv_detach_mcast(b.qp, &mgid, 0) == 0, "detach b");
}

static void sender(const char *group)
{
	struct ibv_port_attr pa;
	REQUIRE(ibv_query_port(ctx, 1, &pa) == 0, "ibv_query_port");
	int sgid = -1;
	for (int i = 0; i < pa.gid_tbl_len && sgid < 0; i++) {
		union ibv_gid g;
		static const uint8_t v4[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
		if (ibv_query_gid(ctx, 1, i, &g) == 0 && memcmp(g.raw, v4, 12) == 0)
			sgid = i;
	}
	REQUIRE(sgid >= 0, "an IPv4 GID");
	struct ud u = ud_qp();
	struct ibv_ah_attr aa = {
		.is_global = 1,
		.grh = { .dgid = mgid_of(group), .sgid_index = sgid, .hop_limit = 64 },
		.port_num = 1,
	};
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	REQUIRE(ah, "ibv_create_ah");
	memcpy(mem[3], MSG, sizeof MSG);
	struct ibv_sge sge = { (uintptr_t)mem[3], sizeof MSG, mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 9,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_SEND,
		.wr.ud = { .ah = ah, .remote_qpn = 0xffffff, .remote_qkey = QKEY },
	}, *bad;
	REQUIRE(ibv_post_send(u.qp, &wr, &bad) == 0, "ibv_post_send");
	struct ibv_wc wc;
	REQUIRE(poll_one(u.cq, &wc) == 1, "the send's completion");
	CHECK(wc.status == IBV_WC_SUCCESS, "status %d", wc.status);
	printf("sent to %s\n", group);
}

static void join(const char *group, const char *ip)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	REQUIRE(ch, "rdma_create_event_channel");
	struct rdma_cm_id *id;
	REQUIRE(rdma_create_id(ch, &id, NULL, RDMA_PS_UDP) == 0, "rdma_create_id");
	struct sockaddr_in me = { .sin_family = AF_INET };
	inet_pton(AF_INET, ip, &me.sin_addr);
	REQUIRE(rdma_bind_addr(id, (struct sockaddr *)&me) == 0, "rdma_bind_addr");
	struct sockaddr_in g = { .sin_family = AF_INET };
	inet_pton(AF_INET, group, &g.sin_addr);
	void *context = (void *)0x1234;
	REQUIRE(rdma_join_multicast(id, (struct sockaddr *)&g, context) == 0, "rdma_join_multicast");
	struct rdma_cm_event *ev;
	REQUIRE(rdma_get_cm_event(ch, &ev) == 0, "rdma_get_cm_event");
	CHECK(ev->event == RDMA_CM_EVENT_MULTICAST_JOIN, "event %s", rdma_event_str(ev->event));
	CHECK(ev->status == 0, "status %d", ev->status);
	CHECK(ev->id == id, "the id");
	struct rdma_ud_param *ud = &ev->param.ud;
	union ibv_gid mgid = mgid_of(group);
	CHECK(ud->private_data == context, "context %p", ud->private_data);
	CHECK(ud->qp_num == 0xffffff, "qp_num %#x", ud->qp_num);
	CHECK(ud->qkey == RDMA_UDP_QKEY, "qkey %#x", ud->qkey);
	CHECK(ud->ah_attr.is_global == 1, "is_global");
	CHECK(memcmp(ud->ah_attr.grh.dgid.raw, mgid.raw, 16) == 0, "dgid");
	CHECK(ud->ah_attr.grh.hop_limit == 64, "hop_limit %d", ud->ah_attr.grh.hop_limit);
	union ibv_gid sgid;
	CHECK(ibv_query_gid(id->verbs, 1, ud->ah_attr.grh.sgid_index, &sgid) == 0 &&
		      memcmp(&sgid.raw[12], &me.sin_addr, 4) == 0,
	      "sgid_index %d is the id's address", ud->ah_attr.grh.sgid_index);
	rdma_ack_cm_event(ev);
	errno = 0;
	CHECK(rdma_join_multicast(id, (struct sockaddr *)&g, NULL) == -1 && errno == EADDRINUSE,
	      "joining again");
	CHECK(rdma_leave_multicast(id, (struct sockaddr *)&g) == 0, "rdma_leave_multicast");
	errno = 0;
	CHECK(rdma_leave_multicast(id, (struct sockaddr *)&g) == -1 && errno == EADDRNOTAVAIL,
	      "leaving again");
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	printf("joined and left %s\n", group);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	REQUIRE(argc >= 3, "usage: mcast recv|send GROUP | mcast join GROUP IP");
	if (strcmp(argv[1], "join") == 0) {
		REQUIRE(argc == 4, "mcast join GROUP IP");
		join(argv[2], argv[3]);
		printf("%d failures\n", failures);
		return failures != 0;
	}
	struct ibv_device **list = ibv_get_device_list(NULL);
	REQUIRE(list && list[0], "a device");
	ctx = ibv_open_device(list[0]);
	REQUIRE(ctx, "ibv_open_device");
	pd = ibv_alloc_pd(ctx);
	REQUIRE(pd, "ibv_alloc_pd");
	mr = ibv_reg_mr(pd, mem, sizeof mem, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(mr, "ibv_reg_mr");
	if (strcmp(argv[1], "recv") == 0)
		receiver(argv[2]);
	else
		sender(argv[2]);
	printf("%d failures\n", failures);
	return failures != 0;
}
