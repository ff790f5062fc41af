/* librpma on the drop-in: a write, an atomic write and a flush to global visibility, the
 * server checking the bytes. A librpma built with native ATOMIC WRITE support (rdma-core
 * 43+ headers at its build) picks it on the drop-in because the device reports
 * IB_UVERBS_DEVICE_ATOMIC_WRITE and RC QPs take IBV_QP_EX_WITH_ATOMIC_WRITE: the
 * completion is IBV_WC_ATOMIC_WRITE, where the fallback (an inline RDMA WRITE) completes
 * as IBV_WC_RDMA_WRITE. argv[3] says which librpma this is ("native" or "fallback").
 *
 * One process, one soft device at argv[1] (REMEM_IBV_DEVICES), a server thread and a
 * client thread connected through librpma's endpoint and connection API on port argv[2].
 * Prints one line per check; exits 1 on a failure. */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <librpma.h>
#include <pthread.h>
#include <stdint.h>

#include "check.h"

static const char *addr, *port;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int listening; /* the server's rpma_ep_listen returned */
static struct rpma_peer *peer;
static int native; /* librpma has the native atomic write */

enum { LEN = 4096, DATA = 64, AW_AT = 64 };
static const char value[8] = "ATOMIC!";

static void *server(void *unused)
{
	(void)unused;
	struct rpma_ep *ep = NULL;
	int r = rpma_ep_listen(peer, addr, port, &ep);
	pthread_mutex_lock(&lock);
	listening = r == 0 ? 1 : -1;
	pthread_cond_broadcast(&cond);
	pthread_mutex_unlock(&lock);
	REQUIRE(r == 0, "rpma_ep_listen: %s", rpma_err_2str(r));

	char *mem = aligned_alloc(4096, LEN);
	memset(mem, 0, LEN);
	struct rpma_mr_local *mr = NULL;
	r = rpma_mr_reg(peer, mem, LEN,
			RPMA_MR_USAGE_WRITE_DST | RPMA_MR_USAGE_READ_SRC |
				RPMA_MR_USAGE_FLUSH_TYPE_VISIBILITY,
			&mr);
	REQUIRE(r == 0, "server rpma_mr_reg: %s", rpma_err_2str(r));
	size_t dsize;
	char desc[256];
	REQUIRE(rpma_mr_get_descriptor_size(mr, &dsize) == 0 && dsize <= sizeof desc,
		"descriptor size");
	REQUIRE(rpma_mr_get_descriptor(mr, desc) == 0, "descriptor");
	struct rpma_conn_private_data pdata = { desc, (uint8_t)dsize };

	struct rpma_conn_req *req = NULL;
	r = rpma_ep_next_conn_req(ep, NULL, &req);
	REQUIRE(r == 0, "rpma_ep_next_conn_req: %s", rpma_err_2str(r));
	struct rpma_conn *conn = NULL;
	r = rpma_conn_req_connect(&req, &pdata, &conn);
	REQUIRE(r == 0, "server rpma_conn_req_connect: %s", rpma_err_2str(r));
	enum rpma_conn_event ev;
	REQUIRE(rpma_conn_next_event(conn, &ev) == 0 && ev == RPMA_CONN_ESTABLISHED,
		"server: established");
	/* The client disconnects once its operations completed. */
	r = rpma_conn_next_event(conn, &ev);
	CHECK(r == 0 && ev == RPMA_CONN_CLOSED, "server: closed (%d, %d)", r, ev);
	int ok = 1;
	for (int i = 0; i < DATA; i++)
		ok &= mem[i] == (char)(i * 7 + 1);
	CHECK(ok, "server: the written bytes are wrong");
	CHECK(memcmp(mem + AW_AT, value, 8) == 0, "server: the atomic write did not land");
	CHECK(mem[AW_AT + 8] == 0, "server: the atomic write went past its 8 bytes");
	rpma_conn_disconnect(conn);
	rpma_conn_delete(&conn);
	rpma_mr_dereg(&mr);
	rpma_ep_shutdown(&ep);
	free(mem);
	return NULL;
}

/* Waits for one completion on the client's CQ; returns it. */
static struct ibv_wc one(struct rpma_cq *cq)
{
	struct ibv_wc wc = { 0 };
	int got = 0;
	int r = rpma_cq_wait(cq);
	CHECK(r == 0, "rpma_cq_wait: %s", rpma_err_2str(r));
	r = rpma_cq_get_wc(cq, 1, &wc, &got);
	CHECK(r == 0 && got == 1, "rpma_cq_get_wc: %s", rpma_err_2str(r));
	return wc;
}

static void client(void)
{
	struct rpma_conn_req *req = NULL;
	int r = rpma_conn_req_new(peer, addr, port, NULL, &req);
	REQUIRE(r == 0, "rpma_conn_req_new: %s", rpma_err_2str(r));
	struct rpma_conn *conn = NULL;
	r = rpma_conn_req_connect(&req, NULL, &conn);
	REQUIRE(r == 0, "client rpma_conn_req_connect: %s", rpma_err_2str(r));
	enum rpma_conn_event ev;
	REQUIRE(rpma_conn_next_event(conn, &ev) == 0 && ev == RPMA_CONN_ESTABLISHED,
		"client: established");
	struct rpma_conn_private_data pdata;
	REQUIRE(rpma_conn_get_private_data(conn, &pdata) == 0 && pdata.ptr, "private data");
	struct rpma_mr_remote *dst = NULL;
	REQUIRE(rpma_mr_remote_from_descriptor(pdata.ptr, pdata.len, &dst) == 0,
		"remote MR from descriptor");

	char *src = aligned_alloc(4096, LEN);
	for (int i = 0; i < DATA; i++)
		src[i] = (char)(i * 7 + 1);
	struct rpma_mr_local *smr = NULL;
	REQUIRE(rpma_mr_reg(peer, src, LEN, RPMA_MR_USAGE_WRITE_SRC, &smr) == 0, "client mr");
	struct rpma_cq *cq = NULL;
	REQUIRE(rpma_conn_get_cq(conn, &cq) == 0, "rpma_conn_get_cq");

	r = rpma_write(conn, dst, 0, smr, 0, DATA, RPMA_F_COMPLETION_ALWAYS, NULL);
	CHECK(r == 0, "rpma_write: %s", rpma_err_2str(r));
	struct ibv_wc wc = one(cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE,
	      "write completion: %s, opcode %d", ibv_wc_status_str(wc.status), wc.opcode);

	r = rpma_atomic_write(conn, dst, AW_AT, value, RPMA_F_COMPLETION_ALWAYS, NULL);
	CHECK(r == 0, "rpma_atomic_write: %s", rpma_err_2str(r));
	wc = one(cq);
	CHECK(wc.status == IBV_WC_SUCCESS, "atomic write: %s", ibv_wc_status_str(wc.status));
	if (native)
		CHECK(wc.opcode == IBV_WC_ATOMIC_WRITE,
		      "librpma did not use the native atomic write: opcode %d", wc.opcode);
	else
		CHECK(wc.opcode == IBV_WC_RDMA_WRITE,
		      "librpma without native atomic write: opcode %d", wc.opcode);

	r = rpma_flush(conn, dst, 0, AW_AT + 8, RPMA_FLUSH_TYPE_VISIBILITY,
		       RPMA_F_COMPLETION_ALWAYS, NULL);
	CHECK(r == 0, "rpma_flush: %s", rpma_err_2str(r));
	wc = one(cq);
	CHECK(wc.status == IBV_WC_SUCCESS, "flush: %s", ibv_wc_status_str(wc.status));

	r = rpma_conn_disconnect(conn);
	CHECK(r == 0, "rpma_conn_disconnect: %s", rpma_err_2str(r));
	r = rpma_conn_next_event(conn, &ev);
	CHECK(r == 0 && ev == RPMA_CONN_CLOSED, "client: closed (%d, %d)", r, ev);
	rpma_mr_remote_delete(&dst);
	rpma_mr_dereg(&smr);
	rpma_conn_delete(&conn);
	free(src);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	REQUIRE(argc == 4, "usage: rpma_native ADDR PORT native|fallback");
	addr = argv[1];
	port = argv[2];
	native = strcmp(argv[3], "native") == 0;
	struct ibv_context *ctx = NULL;
	int r = rpma_utils_get_ibv_context(addr, RPMA_UTIL_IBV_CONTEXT_LOCAL, &ctx);
	REQUIRE(r == 0, "rpma_utils_get_ibv_context: %s", rpma_err_2str(r));
	r = rpma_peer_new(ctx, &peer);
	REQUIRE(r == 0, "rpma_peer_new: %s", rpma_err_2str(r));

	pthread_t t;
	REQUIRE(pthread_create(&t, NULL, server, NULL) == 0, "pthread_create");
	pthread_mutex_lock(&lock);
	while (!listening)
		pthread_cond_wait(&cond, &lock);
	pthread_mutex_unlock(&lock);
	REQUIRE(listening == 1, "the server did not listen");
	client();
	pthread_join(t, NULL);
	rpma_peer_delete(&peer);
	printf("%d failures\n", failures);
	return failures ? 1 : 0;
}
