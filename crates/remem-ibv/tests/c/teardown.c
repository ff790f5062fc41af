/* What a program posts or owes at teardown is not lost (tests/teardown_c.rs runs it as
 * a server process and a client process on the drop-in, one soft device each):
 *
 *   teardown server IP PORT MODE
 *                             accepts one connection, with receives posted; reports
 *                             the first receive's completion (MODE "send") and whether
 *                             RDMA_CM_EVENT_DISCONNECTED came (within 10 s).
 *   teardown client IP PORT MODE
 *                             connects to IP:PORT; MODE "send": posts one SEND and
 *                             disconnects at once; MODE "quiet": disconnects at once.
 *                             Then rdma_destroy_qp, rdma_destroy_id and exit, as
 *                             librpma-style clients do. MODE "exit": exits at once,
 *                             connected, closing nothing (kernel rdma_cm then destroys
 *                             its ids and sends the DREQ).
 *
 * On a NIC or kernel rxe the SEND reaches the server before the disconnection (the
 * server's receive completes with IBV_WC_SUCCESS), and the DREQ has left before
 * rdma_disconnect returns (the server gets DISCONNECTED even though the client exits).
 * Prints one line per check; exits 1 if any failed. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>

#include "check.h"

static const char MESSAGE[] = "the last message before the disconnection";

#include "inet.h"

/* The next event of `ch` within `ms` milliseconds, or NULL. */
static struct rdma_cm_event *next_event(struct rdma_event_channel *ch, int ms)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	if (poll(&p, 1, ms) != 1)
		return NULL;
	struct rdma_cm_event *ev = NULL;
	if (rdma_get_cm_event(ch, &ev))
		return NULL;
	return ev;
}

/* The next event of `ch`, within 10 s; it must be `want`. */
static struct rdma_cm_event *expect(struct rdma_event_channel *ch,
				    enum rdma_cm_event_type want)
{
	struct rdma_cm_event *ev = next_event(ch, 10000);
	REQUIRE(ev != NULL, "an event within 10 s (waiting for %s)", rdma_event_str(want));
	REQUIRE(ev->event == want, "got %s (status %d), want %s",
		rdma_event_str(ev->event), ev->status, rdma_event_str(want));
	return ev;
}

/* The next completion of `cq`, waiting on its channel (armed) up to 10 s. */
static int next_wc(struct ibv_cq *cq, struct ibv_comp_channel *cc, struct ibv_wc *wc)
{
	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n)
			return n;
		if (ibv_req_notify_cq(cq, 0))
			return -1;
		n = ibv_poll_cq(cq, 1, wc);
		if (n)
			return n;
		struct pollfd p = { .fd = cc->fd, .events = POLLIN };
		if (poll(&p, 1, 10000) != 1)
			return 0;
		struct ibv_cq *ev_cq;
		void *ev_ctx;
		if (ibv_get_cq_event(cc, &ev_cq, &ev_ctx))
			return -1;
		ibv_ack_cq_events(ev_cq, 1);
	}
}

static int server(const char *ip, int port, const char *mode)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	REQUIRE(ch != NULL, "channel");
	struct rdma_cm_id *lid = NULL;
	REQUIRE(rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP) == 0, "listener id");
	struct sockaddr_in sa = addr(ip, port);
	REQUIRE(rdma_bind_addr(lid, (struct sockaddr *)&sa) == 0, "bind %s:%d", ip, port);
	REQUIRE(rdma_listen(lid, 4) == 0, "listen");

	struct rdma_cm_event *req = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *id = req->id;
	struct ibv_qp_init_attr qa = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	REQUIRE(rdma_create_qp(id, NULL, &qa) == 0, "rdma_create_qp");
	static char buf[2][256];
	struct ibv_mr *mr = ibv_reg_mr(id->pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(mr != NULL, "MR");
	/* Two receives: the first for the message; the second is flushed at the
	 * disconnection, as on any device. */
	for (int i = 0; i < 2; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)buf[i], .length = 256, .lkey = mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = 100 + i, .sg_list = &sge, .num_sge = 1 }, *bad;
		REQUIRE(ibv_post_recv(id->qp, &wr, &bad) == 0, "post receive %d", i);
	}
	struct rdma_conn_param ap = { .responder_resources = 1, .initiator_depth = 1,
				      .rnr_retry_count = 7 };
	REQUIRE(rdma_accept(id, &ap) == 0, "accept");
	rdma_ack_cm_event(req);
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ESTABLISHED));
	printf("established\n");
	fflush(stdout);

	/* The server reports what it saw; the test judges it. */
	if (strcmp(mode, "send") == 0) {
		struct ibv_wc wc;
		int n = next_wc(id->recv_cq, id->recv_cq_channel, &wc);
		if (n == 1 && wc.wr_id == 100)
			printf("first receive: %s, %u bytes, \"%s\"\n",
			       ibv_wc_status_str(wc.status), wc.byte_len,
			       wc.status == IBV_WC_SUCCESS ? buf[0] : "");
		else
			printf("first receive: none (%d)\n", n);
	}

	struct rdma_cm_event *ev = next_event(ch, 10000);
	if (ev) {
		printf("event: %s\n", rdma_event_str(ev->event));
		rdma_ack_cm_event(ev);
	} else {
		printf("event: none within 10 s\n");
	}
	fflush(stdout);
	rdma_destroy_qp(id);
	ibv_dereg_mr(mr);
	rdma_destroy_id(id);
	rdma_destroy_id(lid);
	rdma_destroy_event_channel(ch);
	printf("%d failures\n", failures);
	return failures ? 1 : 0;
}

static int client(const char *ip, int port, const char *mode)
{
	int send = strcmp(mode, "send") == 0;
	struct rdma_event_channel *ch = rdma_create_event_channel();
	REQUIRE(ch != NULL, "channel");
	struct rdma_cm_id *id = NULL;
	REQUIRE(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "id");
	struct sockaddr_in sa = addr(ip, port);
	REQUIRE(rdma_resolve_addr(id, NULL, (struct sockaddr *)&sa, 2000) == 0, "resolve_addr");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	REQUIRE(rdma_resolve_route(id, 2000) == 0, "resolve_route");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	struct ibv_qp_init_attr qa = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	REQUIRE(rdma_create_qp(id, NULL, &qa) == 0, "rdma_create_qp");
	static char buf[256];
	struct ibv_mr *mr = ibv_reg_mr(id->pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(mr != NULL, "MR");
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1,
				      .retry_count = 7, .rnr_retry_count = 7 };
	REQUIRE(rdma_connect(id, &cp) == 0, "connect");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ESTABLISHED));
	if (strcmp(mode, "exit") == 0) {
		printf("exiting connected\n");
		fflush(stdout);
		exit(0);
	}
	if (send) {
		strcpy(buf, MESSAGE);
		struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = sizeof MESSAGE,
				       .lkey = mr->lkey };
		struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
				   *bad;
		REQUIRE(ibv_post_send(id->qp, &wr, &bad) == 0, "post send");
	}
	/* At once: no wait for the send's completion, nor for the DISCONNECTED event. */
	CHECK(rdma_disconnect(id) == 0, "disconnect");
	if (strcmp(mode, "drep") == 0) {
		/* The server exits as soon as it sees the disconnection: its DREP must have
		 * left anyway (else this side learns only when its DREQ's retries end). */
		struct rdma_cm_event *ev = next_event(ch, 5000);
		CHECK(ev && ev->event == RDMA_CM_EVENT_DISCONNECTED && ev->status == 0,
		      "the DREP within 5 s: %s (status %d)", ev ? rdma_event_str(ev->event) : "none",
		      ev ? ev->status : 0);
		if (ev)
			rdma_ack_cm_event(ev);
	}
	rdma_destroy_qp(id);
	ibv_dereg_mr(mr);
	CHECK(rdma_destroy_id(id) == 0, "destroy id");
	rdma_destroy_event_channel(ch);
	printf("%d failures\n", failures);
	return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc == 5 && strcmp(argv[1], "server") == 0)
		return server(argv[2], atoi(argv[3]), argv[4]);
	if (argc == 5 && strcmp(argv[1], "client") == 0)
		return client(argv[2], atoi(argv[3]), argv[4]);
	fprintf(stderr, "usage: teardown server|client IP PORT send|quiet|drep|exit\n");
	return 2;
}
