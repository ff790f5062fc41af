/* The drop-in librdmacm as a C program sees it (compiled against rdma-core's
 * rdma_cma.h, run with the drop-in first on LD_LIBRARY_PATH), on the soft provider's CM:
 * one process, two devices (REMEM_IBV_DEVICES names them; argv[1], argv[2] are their
 * addresses), a server id on the first and a client id on the second (picked by the
 * client's source address). Covers what rdmacm-utils do not: a QP the program manages
 * itself (CONNECT_RESPONSE, rdma_init_qp_attr, rdma_establish), data over it, a reject
 * with private data, and the errno values of refused calls.
 * Prints one line per check; exits 1 if any failed. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>

#include "check.h"

#include "inet.h"

/* The next event of `ch`, within 10 s; it must be `want`. */
static struct rdma_cm_event *expect(struct rdma_event_channel *ch,
				    enum rdma_cm_event_type want)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	REQUIRE(poll(&p, 1, 10000) == 1, "an event within 10 s (waiting for %s)",
		rdma_event_str(want));
	struct rdma_cm_event *ev = NULL;
	REQUIRE(rdma_get_cm_event(ch, &ev) == 0, "rdma_get_cm_event");
	REQUIRE(ev->event == want, "got %s (status %d), want %s",
		rdma_event_str(ev->event), ev->status, rdma_event_str(want));
	return ev;
}

/* Moves `qp` to `state` with the CM's attributes. */
static int move_qp(struct rdma_cm_id *id, struct ibv_qp *qp, enum ibv_qp_state state)
{
	struct ibv_qp_attr attr;
	int mask = 0;
	memset(&attr, 0, sizeof attr);
	attr.qp_state = state;
	if (rdma_init_qp_attr(id, &attr, &mask))
		return -1;
	return ibv_modify_qp(qp, &attr, mask);
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: cm SERVER_IP CLIENT_IP\n");
		return 2;
	}
	const char *sip = argv[1], *cip = argv[2];
	int port = 20079;

	int n = 0;
	struct ibv_context **devs = rdma_get_devices(&n);
	CHECK(devs && n == 2 && devs[2] == NULL, "two devices, n %d", n);
	rdma_free_devices(devs);
	CHECK(strcmp(rdma_event_str(RDMA_CM_EVENT_CONNECT_RESPONSE),
		     "RDMA_CM_EVENT_CONNECT_RESPONSE") == 0, "event names");

	struct rdma_event_channel *sch = rdma_create_event_channel();
	struct rdma_event_channel *cch = rdma_create_event_channel();
	REQUIRE(sch && cch, "channels");
	CHECK(!(fcntl(sch->fd, F_GETFL) & O_NONBLOCK), "a blocking fd, as librdmacm's");

	/* The server: a listener on the first device. */
	struct rdma_cm_id *lid = NULL;
	REQUIRE(rdma_create_id(sch, &lid, (void *)0x5eed, RDMA_PS_TCP) == 0, "listener id");
	struct sockaddr_in bad = addr("10.255.0.9", port);
	errno = 0;
	CHECK(rdma_bind_addr(lid, (struct sockaddr *)&bad) == -1 && errno == EADDRNOTAVAIL,
	      "no device has 10.255.0.9");
	struct sockaddr_in sa = addr(sip, port);
	REQUIRE(rdma_bind_addr(lid, (struct sockaddr *)&sa) == 0, "bind %s", sip);
	CHECK(lid->verbs != NULL, "a bound id has its device");
	CHECK(ntohs(rdma_get_src_port(lid)) == port, "source port");
	REQUIRE(rdma_listen(lid, 4) == 0, "listen");
	errno = 0;
	CHECK(rdma_join_multicast(lid, (struct sockaddr *)&sa, NULL) == -1 && errno == EINVAL,
	      "a unicast address is no multicast group");

	/* The client: on the second device (its source address), its own QP. */
	struct rdma_cm_id *cid = NULL;
	REQUIRE(rdma_create_id(cch, &cid, NULL, RDMA_PS_TCP) == 0, "client id");
	struct sockaddr_in ca = addr(cip, 0);
	REQUIRE(rdma_resolve_addr(cid, (struct sockaddr *)&ca, (struct sockaddr *)&sa, 2000) == 0,
		"resolve_addr");
	rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ADDR_RESOLVED));
	CHECK(cid->verbs != NULL && cid->verbs != lid->verbs, "the client is on the other device");
	CHECK(cid->route.addr.src_sin.sin_addr.s_addr == ca.sin_addr.s_addr, "source address");
	CHECK(ntohs(rdma_get_dst_port(cid)) == port, "destination port");
	REQUIRE(rdma_resolve_route(cid, 2000) == 0, "resolve_route");
	rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	CHECK(cid->route.num_paths == 1 && cid->route.path_rec != NULL, "one path");

	struct ibv_pd *cpd = ibv_alloc_pd(cid->verbs);
	struct ibv_cq *ccq = ibv_create_cq(cid->verbs, 16, NULL, NULL, 0);
	REQUIRE(cpd && ccq, "client PD and CQ on id->verbs");
	struct ibv_qp_init_attr qa = {
		.send_cq = ccq, .recv_cq = ccq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *cqp = ibv_create_qp(cpd, &qa);
	REQUIRE(cqp != NULL, "the client's own QP");
	CHECK(move_qp(cid, cqp, IBV_QPS_INIT) == 0, "INIT from rdma_init_qp_attr");
	static char cbuf[64];
	struct ibv_mr *cmr = ibv_reg_mr(cpd, cbuf, sizeof cbuf, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(cmr != NULL, "client MR");

	const char hello[] = "hello from the client";
	struct rdma_conn_param cp = {
		.private_data = hello, .private_data_len = sizeof hello,
		.responder_resources = 1, .initiator_depth = 1,
		.retry_count = 7, .rnr_retry_count = 7, .qp_num = cqp->qp_num,
	};
	REQUIRE(rdma_connect(cid, &cp) == 0, "connect (the program's QP)");

	/* The server accepts on a QP made by rdma_create_qp (with its own CQs). */
	struct rdma_cm_event *req = expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *sid = req->id;
	CHECK(req->listen_id == lid, "listen_id");
	CHECK(sid->context == (void *)0x5eed, "the listener's context");
	CHECK(sid->verbs == lid->verbs, "the request's id is on the listener's device");
	CHECK(req->param.conn.private_data_len >= sizeof hello &&
		      memcmp(req->param.conn.private_data, hello, sizeof hello) == 0,
	      "the REQ's private data");
	CHECK(req->param.conn.qp_num == cqp->qp_num, "the client's QP number");
	struct ibv_qp_init_attr sqa = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	REQUIRE(rdma_create_qp(sid, NULL, &sqa) == 0, "rdma_create_qp on the id's PD");
	CHECK(sid->send_cq && sid->recv_cq && sid->recv_cq_channel, "CQs made for the QP");
	CHECK(sid->qp->state == IBV_QPS_INIT, "the QP is in INIT");
	static char sbuf[64];
	struct ibv_mr *smr = ibv_reg_mr(sid->pd, sbuf, sizeof sbuf, IBV_ACCESS_LOCAL_WRITE);
	REQUIRE(smr != NULL, "server MR");
	struct ibv_sge rsge = { .addr = (uintptr_t)sbuf, .length = sizeof sbuf, .lkey = smr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 7, .sg_list = &rsge, .num_sge = 1 }, *bad_rwr;
	CHECK(ibv_post_recv(sid->qp, &rwr, &bad_rwr) == 0, "post a receive");
	const char welcome[] = "welcome";
	struct rdma_conn_param ap = {
		.private_data = welcome, .private_data_len = sizeof welcome,
		.responder_resources = 1, .initiator_depth = 1, .rnr_retry_count = 7,
	};
	REQUIRE(rdma_accept(sid, &ap) == 0, "accept");
	rdma_ack_cm_event(req);

	/* The client's QP is its own: CONNECT_RESPONSE, then it moves it and establishes. */
	struct rdma_cm_event *resp = expect(cch, RDMA_CM_EVENT_CONNECT_RESPONSE);
	CHECK(resp->param.conn.private_data_len >= sizeof welcome &&
		      memcmp(resp->param.conn.private_data, welcome, sizeof welcome) == 0,
	      "the REP's private data");
	CHECK(resp->param.conn.qp_num == sid->qp->qp_num, "the server's QP number");
	rdma_ack_cm_event(resp);
	CHECK(move_qp(cid, cqp, IBV_QPS_RTR) == 0, "RTR from rdma_init_qp_attr");
	CHECK(move_qp(cid, cqp, IBV_QPS_RTS) == 0, "RTS from rdma_init_qp_attr");
	errno = 0;
	CHECK(rdma_establish(lid) == -1, "establish needs a connection");
	REQUIRE(rdma_establish(cid) == 0, "establish");
	struct rdma_cm_event *est = expect(sch, RDMA_CM_EVENT_ESTABLISHED);
	CHECK(est->id == sid, "ESTABLISHED on the request's id");
	rdma_ack_cm_event(est);
	CHECK(sid->qp->state == IBV_QPS_RTS, "the CM moved the server's QP to RTS");

	/* Data over the connection. */
	strcpy(cbuf, "over RDMA CM");
	struct ibv_sge ssge = { .addr = (uintptr_t)cbuf, .length = 13, .lkey = cmr->lkey };
	struct ibv_send_wr swr = {
		.wr_id = 9, .sg_list = &ssge, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
	}, *bad_swr;
	CHECK(ibv_post_send(cqp, &swr, &bad_swr) == 0, "post a send");
	struct ibv_wc wc;
	int got = 0;
	for (int i = 0; i < 1000000 && !got; i++)
		got = ibv_poll_cq(ccq, 1, &wc);
	CHECK(got == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 9, "the send completes");
	got = 0;
	for (int i = 0; i < 1000000 && !got; i++)
		got = ibv_poll_cq(sid->recv_cq, 1, &wc);
	CHECK(got == 1 && wc.status == IBV_WC_SUCCESS && wc.byte_len == 13 &&
		      strcmp(sbuf, "over RDMA CM") == 0,
	      "the server received it");

	/* A second client is rejected with private data. */
	struct rdma_cm_id *cid2 = NULL;
	REQUIRE(rdma_create_id(cch, &cid2, NULL, RDMA_PS_TCP) == 0, "second client id");
	REQUIRE(rdma_resolve_addr(cid2, (struct sockaddr *)&ca, (struct sockaddr *)&sa, 2000) == 0,
		"resolve_addr 2");
	rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ADDR_RESOLVED));
	REQUIRE(rdma_resolve_route(cid2, 2000) == 0, "resolve_route 2");
	rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	struct rdma_conn_param cp2 = { .retry_count = 7, .rnr_retry_count = 7, .qp_num = 0xabc };
	REQUIRE(rdma_connect(cid2, &cp2) == 0, "connect 2");
	req = expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *sid2 = req->id;
	const char no[] = "full";
	CHECK(rdma_reject(sid2, no, sizeof no) == 0, "reject");
	rdma_ack_cm_event(req);
	struct rdma_cm_event *rej = expect(cch, RDMA_CM_EVENT_REJECTED);
	CHECK(rej->status == 28, "consumer reject (28), got %d", rej->status);
	CHECK(rej->param.conn.private_data_len >= sizeof no &&
		      memcmp(rej->param.conn.private_data, no, sizeof no) == 0,
	      "the REJ's private data");
	rdma_ack_cm_event(rej);
	CHECK(rdma_destroy_id(sid2) == 0 && rdma_destroy_id(cid2) == 0, "destroy the rejected ids");

	/* A non-blocking channel with nothing queued. */
	fcntl(cch->fd, F_SETFL, O_NONBLOCK);
	struct rdma_cm_event *none = NULL;
	errno = 0;
	CHECK(rdma_get_cm_event(cch, &none) == -1 && errno == EAGAIN, "EAGAIN");
	fcntl(cch->fd, F_SETFL, 0);

	/* The server disconnects; both see it. */
	CHECK(rdma_disconnect(sid) == 0, "disconnect");
	rdma_ack_cm_event(expect(sch, RDMA_CM_EVENT_DISCONNECTED));
	rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_DISCONNECTED));
	CHECK(sid->qp->state == IBV_QPS_ERR, "the CM moved the server's QP to ERR");

	rdma_destroy_qp(sid);
	CHECK(sid->qp == NULL && sid->send_cq == NULL, "rdma_destroy_qp frees what it made");
	ibv_dereg_mr(smr);
	CHECK(rdma_destroy_id(sid) == 0, "destroy the server's id");
	ibv_destroy_qp(cqp);
	ibv_dereg_mr(cmr);
	ibv_destroy_cq(ccq);
	ibv_dealloc_pd(cpd);
	CHECK(rdma_destroy_id(cid) == 0 && rdma_destroy_id(lid) == 0, "destroy the ids");
	rdma_destroy_event_channel(sch);
	rdma_destroy_event_channel(cch);
	printf("%d failures\n", failures);
	return failures ? 1 : 0;
}
