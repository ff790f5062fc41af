/* One member of a full mesh of RC connections over the drop-in's librdmacm, speaking the
 * message protocol of remem's async API (so that it meshes with the `mesh` example of the
 * `remem` crate, crates/remem/examples/mesh.rs, which states the protocol in full).
 *
 *   mesh ID N BASE_PORT M [K]
 *
 * Member ID of N listens on 127.0.0.1:(BASE_PORT + ID) (rdma_cm, port space TCP),
 * connects to every member j > ID (which must listen already) and accepts every j < ID:
 * one RC connection per pair. On each connection both sides SEND M messages of a size and
 * pattern derived from (sender, receiver, seq), then, once they have all of the peer's,
 * a FIN (seq M), then, once they have the peer's FIN, a BYE (seq M + 1). A connection is
 * done once the peer's FIN is in (every message of the peer's has been checked); a side
 * disconnects once the peer's BYE is in (the peer has everything), so that a disconnect
 * never overtakes a message the other side still waits for. Every byte received is
 * checked. With K, the member sends only K messages on each connection, says "stalled"
 * once the peers have them all (their SENDs completed) and waits, receiving, to be killed.
 *
 * Prints, as a line each: "mesh ID: listening on ...", "mesh ID: connected to N-1
 * peers", per peer "mesh ID: peer j done, B bytes verified" or, when the peer disconnects
 * or its connection fails before it is done, "mesh ID: peer j gone at T us (D ms after its
 * last message, WHY), B bytes verified" (T: CLOCK_REALTIME in microseconds), then
 * "mesh ID: ok B bytes verified from P peers, G gone" and exits 0 — or "mesh ID: FAIL ..."
 * lines and exits 1. Everything is bounded: an alarm ends the process after 60 s. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>

#include "inet.h"

/* remem's message protocol (crates/remem/src/conn/header.rs, cm.rs). */
#define HDR 8
#define KIND_DATA 1
#define KIND_CREDIT 2
#define KIND_CLOSE 4
#define EXTRAS 16

/* The mesh's constants (the same in crates/remem/examples/mesh.rs). */
#define MAXMSG 4096 /* the largest message (after the header) */
#define WINDOW 16   /* receive credits granted */
#define SPARE 8     /* receive buffers beyond them: credit and close messages */
#define NRECV (WINDOW + SPARE)
#define NSEND 16
#define SLOT (HDR + MAXMSG)
#define MAXPEERS 64

#define TAG_RECV (1ull << 32)
#define TAG_SEND (2ull << 32)

enum state { CONNECTING, UP, DONE, GONE, FAILED };

struct conn {
	int peer;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	uint8_t *buf; /* NRECV receive slots, then NSEND send slots */
	int send_kind[NSEND]; /* 0: free, else what it carries (KIND_*) */
	enum state state;
	uint32_t credits; /* messages this side may send */
	uint32_t owed;    /* credits to return */
	int credit_busy;  /* a credit message is in flight */
	uint32_t next_send, limit;
	uint32_t sent_done; /* data messages whose SEND completed (the peer has them) */
	int fin_posted, bye_posted;
	uint32_t next_recv; /* seq expected next (M: the FIN; M + 1: the BYE; M + 2: all in) */
	uint64_t bytes;
	double last_ms; /* when the peer's last message arrived */
	/* A receive flushed while the connection was up: when (its cause, a DISCONNECTED
	 * event, usually follows at once; gone() reports the flush's time). */
	double flush_ms;
	unsigned long long flush_us;
	int disconnected, closing, peer_closed;
};

static int me, n, base, m_msgs, stall = -1, failures;
static struct rdma_event_channel *events;
static struct conn conns[MAXPEERS];

static double now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static unsigned long long wall_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	return (unsigned long long)t.tv_sec * 1000000ull + t.tv_nsec / 1000;
}

/* The size of message `seq` from `s` to `r` (16..MAXMSG), and its byte `k` (k >= 8). */
static uint32_t msg_len(uint32_t s, uint32_t r, uint32_t seq)
{
	return 16 + (s * 977u + r * 331u + seq * 2713u) % (MAXMSG - 16 + 1);
}

static uint8_t msg_byte(uint32_t s, uint32_t r, uint32_t seq, uint32_t k)
{
	return (uint8_t)((k * 131u) ^ (seq * 7u + s * 29u + r * 53u) ^ (k >> 8));
}

static void put32(uint8_t *p, uint32_t v)
{
	p[0] = v >> 24;
	p[1] = v >> 16;
	p[2] = v >> 8;
	p[3] = v;
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void fail(struct conn *c, const char *what)
{
	printf("mesh %d: FAIL peer %d: %s\n", me, c ? c->peer : -1, what);
	failures++;
	if (c && c->state != DONE && c->state != GONE) {
		c->state = FAILED;
		if (c->id && !c->closing) {
			c->closing = 1;
			rdma_disconnect(c->id);
		}
	}
}

/* remem's CM private data: its extras (magic, version, flags, receive credits, largest
 * message, largest large message), then this member's id. */
static void private_data(uint8_t *p)
{
	p[0] = 'R';
	p[1] = 'M';
	p[2] = 1;
	p[3] = 0;
	put32(p + 4, WINDOW);
	put32(p + 8, MAXMSG);
	put32(p + 12, 0);
	put32(p + 16, me);
}

/* Reads the peer's private data: its credits and id (-1 if it is not a mesh member's). */
static int peer_data(const void *data, int len, uint32_t *credits)
{
	const uint8_t *p = data;
	if (!p || len < EXTRAS + 4 || p[0] != 'R' || p[1] != 'M' || p[2] != 1)
		return -1;
	if (get32(p + 8) < MAXMSG)
		return -1;
	*credits = get32(p + 4);
	uint32_t id = get32(p + 16);
	return id < (uint32_t)n ? (int)id : -1;
}

static int post_recv(struct conn *c, int i)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)(c->buf + (size_t)i * SLOT), .length = SLOT, .lkey = c->mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = TAG_RECV | i, .sg_list = &sge, .num_sge = 1 }, *bad;
	return ibv_post_recv(c->id->qp, &wr, &bad);
}

/* Builds the QP and buffers of a connection on `id`, receives posted. */
static int setup(struct conn *c, struct rdma_cm_id *id)
{
	c->id = id;
	id->context = c;
	c->pd = ibv_alloc_pd(id->verbs);
	c->ch = ibv_create_comp_channel(id->verbs);
	c->cq = c->ch ? ibv_create_cq(id->verbs, NRECV + NSEND + 4, c, c->ch, 0) : NULL;
	c->buf = calloc(NRECV + NSEND, SLOT);
	if (!c->pd || !c->cq || !c->buf)
		return -1;
	c->mr = ibv_reg_mr(c->pd, c->buf, (size_t)(NRECV + NSEND) * SLOT, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_qp_init_attr qa = {
		.send_cq = c->cq, .recv_cq = c->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = NSEND + 2, .max_recv_wr = NRECV,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};
	if (!c->mr || rdma_create_qp(id, c->pd, &qa))
		return -1;
	for (int i = 0; i < NRECV; i++)
		if (post_recv(c, i))
			return -1;
	return ibv_req_notify_cq(c->cq, 0);
}

static struct rdma_conn_param conn_param(uint8_t *pd)
{
	private_data(pd);
	struct rdma_conn_param p = {
		.private_data = pd, .private_data_len = EXTRAS + 4,
		.responder_resources = 1, .initiator_depth = 1,
		.retry_count = 7, .rnr_retry_count = 7,
	};
	return p;
}

/* Posts a message of `kind` (`seq` for data: M is the FIN, M + 1 the BYE), returning
 * owed credits. */
static int post_send(struct conn *c, int kind, uint32_t seq)
{
	int slot = -1;
	for (int i = 0; i < NSEND; i++)
		if (!c->send_kind[i]) {
			slot = i;
			break;
		}
	if (slot < 0)
		return -1;
	uint8_t *b = c->buf + (size_t)(NRECV + slot) * SLOT;
	uint32_t owed = c->owed > 0xffff ? 0xffff : c->owed;
	uint32_t len = HDR;
	b[0] = kind;
	b[1] = 0;
	b[2] = owed >> 8;
	b[3] = owed;
	put32(b + 4, 0);
	if (kind == KIND_DATA) {
		uint32_t l = seq < (uint32_t)m_msgs ? msg_len(me, c->peer, seq) : 8;
		put32(b + HDR, me);
		put32(b + HDR + 4, seq);
		for (uint32_t k = 8; k < l; k++)
			b[HDR + k] = msg_byte(me, c->peer, seq, k);
		len += l;
	}
	struct ibv_sge sge = { .addr = (uintptr_t)b, .length = len, .lkey = c->mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = TAG_SEND | slot, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED,
	}, *bad;
	if (ibv_post_send(c->id->qp, &wr, &bad))
		return -1;
	c->owed -= owed;
	c->send_kind[slot] = kind;
	if (kind == KIND_DATA)
		c->credits--;
	return 0;
}

static void disconnect(struct conn *c)
{
	if (!c->closing) {
		c->closing = 1;
		rdma_disconnect(c->id);
	}
}

/* Sends what may go now; a connection whose exchange is over is done. */
static void pump(struct conn *c)
{
	if (c->state != UP)
		return;
	while (c->next_send < c->limit && c->credits > 0)
		if (post_send(c, KIND_DATA, c->next_send) == 0)
			c->next_send++;
		else
			break;
	if (c->next_send == (uint32_t)m_msgs && c->next_recv >= (uint32_t)m_msgs &&
	    !c->fin_posted && c->credits > 0 && post_send(c, KIND_DATA, m_msgs) == 0)
		c->fin_posted = 1;
	if (c->owed >= (WINDOW / 4 > 0 ? WINDOW / 4 : 1) && !c->credit_busy &&
	    post_send(c, KIND_CREDIT, 0) == 0)
		c->credit_busy = 1;
	if (c->fin_posted && c->next_recv > (uint32_t)m_msgs && !c->bye_posted &&
	    c->credits > 0 && post_send(c, KIND_DATA, m_msgs + 1) == 0)
		c->bye_posted = 1;
	if (c->next_recv > (uint32_t)m_msgs + 1) {
		c->state = DONE;
		printf("mesh %d: peer %d done, %llu bytes verified\n", me, c->peer,
		       (unsigned long long)c->bytes);
		disconnect(c);
	}
}

static void gone(struct conn *c, const char *why)
{
	if (c->state == DONE || c->state == GONE || c->state == FAILED)
		return;
	if (c->next_recv > (uint32_t)m_msgs) {
		/* The peer's FIN is in: its BYE may not be, nothing else was to come. */
		c->state = DONE;
		printf("mesh %d: peer %d done, %llu bytes verified\n", me, c->peer,
		       (unsigned long long)c->bytes);
	} else {
		c->state = GONE;
		double at = c->flush_ms ? c->flush_ms : now_ms();
		printf("mesh %d: peer %d gone at %llu us (%.0f ms after its last message, %s), "
		       "%llu bytes verified\n",
		       me, c->peer, c->flush_ms ? c->flush_us : wall_us(), at - c->last_ms, why,
		       (unsigned long long)c->bytes);
	}
	disconnect(c);
}

/* A message arrived in receive slot `i`. */
static void on_message(struct conn *c, const uint8_t *b, uint32_t len)
{
	char why[160];
	if (len < HDR) {
		fail(c, "a message shorter than its header");
		return;
	}
	c->credits += (uint32_t)b[2] << 8 | b[3];
	c->last_ms = now_ms();
	switch (b[0]) {
	case KIND_CREDIT:
		return;
	case KIND_CLOSE:
		c->peer_closed = 1;
		return;
	case KIND_DATA:
		break;
	default:
		snprintf(why, sizeof why, "a message of kind %d", b[0]);
		fail(c, why);
		return;
	}
	c->owed++;
	const uint8_t *d = b + HDR;
	uint32_t l = len - HDR, seq = l >= 8 ? get32(d + 4) : 0;
	uint32_t want = c->next_recv < (uint32_t)m_msgs ? msg_len(c->peer, me, c->next_recv) : 8;
	if (l < 8 || get32(d) != (uint32_t)c->peer || seq != c->next_recv || l != want) {
		snprintf(why, sizeof why, "message %u: %u bytes from %u seq %u, want %u bytes seq %u",
			 c->next_recv, l, l >= 8 ? get32(d) : 0, seq, want, c->next_recv);
		fail(c, why);
		return;
	}
	for (uint32_t k = 8; k < l; k++)
		if (d[k] != msg_byte(c->peer, me, seq, k)) {
			snprintf(why, sizeof why, "message %u byte %u: %u, want %u", seq, k, d[k],
				 msg_byte(c->peer, me, seq, k));
			fail(c, why);
			return;
		}
	if (seq < (uint32_t)m_msgs)
		c->bytes += l;
	c->next_recv++;
}

/* Handles every completion of `c`'s CQ. */
static void drain(struct conn *c)
{
	struct ibv_wc wc[16];
	int k;
	while ((k = ibv_poll_cq(c->cq, 16, wc)) > 0) {
		for (int w = 0; w < k; w++) {
			int i = (int)(wc[w].wr_id & 0xffffffffu);
			int recv = (wc[w].wr_id & TAG_RECV) != 0;
			if (wc[w].status != IBV_WC_SUCCESS) {
				if (wc[w].status == IBV_WC_WR_FLUSH_ERR &&
				    (c->closing || c->disconnected || c->state != UP))
					continue;
				if (wc[w].status == IBV_WC_WR_FLUSH_ERR) {
					/* Its cause comes as an event (within 1 s, or it is gone). */
					if (!c->flush_ms) {
						c->flush_ms = now_ms();
						c->flush_us = wall_us();
					}
					continue;
				}
				char why[96];
				snprintf(why, sizeof why, "completion error: %s",
					 ibv_wc_status_str(wc[w].status));
				gone(c, why);
				continue;
			}
			if (recv) {
				/* (Messages may come before the ESTABLISHED event is taken.) */
				int live = c->state == CONNECTING || c->state == UP;
				if (live)
					on_message(c, c->buf + (size_t)i * SLOT, wc[w].byte_len);
				live = c->state == CONNECTING || c->state == UP;
				if (live && post_recv(c, i))
					fail(c, "ibv_post_recv");
			} else {
				int kind = c->send_kind[i];
				c->send_kind[i] = 0;
				if (kind == KIND_CREDIT)
					c->credit_busy = 0;
				if (kind == KIND_DATA)
					c->sent_done++;
			}
		}
		pump(c);
	}
	if (k < 0)
		fail(c, "ibv_poll_cq");
}

static struct conn *conn_of(struct rdma_cm_id *id)
{
	return id ? id->context : NULL;
}

static void on_event(struct rdma_cm_event *ev, struct rdma_cm_id *listener)
{
	struct conn *c = conn_of(ev->id);
	uint8_t pd[EXTRAS + 4];
	struct rdma_conn_param p;
	char why[96];
	switch (ev->event) {
	case RDMA_CM_EVENT_CONNECT_REQUEST: {
		uint32_t credits = 0;
		int peer = peer_data(ev->param.conn.private_data, ev->param.conn.private_data_len,
				     &credits);
		if (ev->listen_id != listener || peer < 0 || peer >= me || conns[peer].id) {
			printf("mesh %d: FAIL a connection request from %d\n", me, peer);
			failures++;
			rdma_reject(ev->id, NULL, 0);
			return;
		}
		c = &conns[peer];
		c->credits = credits;
		p = conn_param(pd);
		if (setup(c, ev->id) || rdma_accept(ev->id, &p))
			fail(c, "accept");
		return;
	}
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		if (rdma_resolve_route(ev->id, 5000))
			fail(c, "rdma_resolve_route");
		return;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		p = conn_param(pd);
		if (setup(c, ev->id) || rdma_connect(ev->id, &p))
			fail(c, "connect");
		return;
	case RDMA_CM_EVENT_ESTABLISHED:
		if (c->peer > me) {
			uint32_t credits = 0;
			int peer = peer_data(ev->param.conn.private_data,
					     ev->param.conn.private_data_len, &credits);
			if (peer != c->peer) {
				fail(c, "the accepting side's private data");
				return;
			}
			/* (Credits returned by messages already taken stay.) */
			c->credits += credits;
		}
		c->state = UP;
		c->last_ms = now_ms();
		pump(c);
		return;
	case RDMA_CM_EVENT_DISCONNECTED:
		c->disconnected = 1;
		drain(c);
		gone(c, "disconnected");
		return;
	case RDMA_CM_EVENT_TIMEWAIT_EXIT:
		return;
	default:
		snprintf(why, sizeof why, "%s (status %d)", rdma_event_str(ev->event), ev->status);
		if (c && c->state == UP)
			gone(c, why);
		else
			fail(c, why);
	}
}

/* Whether every connection is established (or over). */
static int all_up(void)
{
	for (int j = 0; j < n; j++)
		if (j != me && conns[j].state == CONNECTING)
			return 0;
	return 1;
}

static int all_over(void)
{
	for (int j = 0; j < n; j++)
		if (j != me && (conns[j].state == CONNECTING || conns[j].state == UP))
			return 0;
	return 1;
}

static int stalled(void)
{
	for (int j = 0; j < n; j++)
		if (j != me && conns[j].state == UP && conns[j].sent_done < conns[j].limit)
			return 0;
	return 1;
}

int main(int argc, char **argv)
{
	if (argc < 5) {
		fprintf(stderr, "usage: mesh ID N BASE_PORT M [K]\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	alarm(60);
	me = atoi(argv[1]);
	n = atoi(argv[2]);
	base = atoi(argv[3]);
	m_msgs = atoi(argv[4]);
	if (argc > 5)
		stall = atoi(argv[5]);
	if (me < 0 || n > MAXPEERS || me >= n || m_msgs < 1 || stall >= m_msgs) {
		fprintf(stderr, "mesh: bad arguments\n");
		return 2;
	}
	events = rdma_create_event_channel();
	struct rdma_cm_id *listener = NULL;
	struct sockaddr_in la = addr("127.0.0.1", base + me);
	if (!events || rdma_create_id(events, &listener, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(listener, (struct sockaddr *)&la) || rdma_listen(listener, n)) {
		printf("mesh %d: FAIL listening on 127.0.0.1:%d: %s\n", me, base + me,
		       strerror(errno));
		return 1;
	}
	printf("mesh %d: listening on 127.0.0.1:%d\n", me, base + me);
	for (int j = 0; j < n; j++) {
		struct conn *c = &conns[j];
		c->peer = j;
		c->limit = stall >= 0 ? (uint32_t)stall : (uint32_t)m_msgs;
		c->last_ms = now_ms();
		if (j <= me)
			continue;
		struct sockaddr_in to = addr("127.0.0.1", base + j);
		if (rdma_create_id(events, &c->id, c, RDMA_PS_TCP) ||
		    rdma_resolve_addr(c->id, NULL, (struct sockaddr *)&to, 5000))
			fail(c, "rdma_resolve_addr");
	}
	int said_up = 0, said_stalled = 0;
	double deadline = now_ms() + 55000;
	while (!all_over()) {
		if (now_ms() > deadline) {
			printf("mesh %d: FAIL the mesh did not finish within 55 s\n", me);
			return 1;
		}
		struct pollfd fds[MAXPEERS + 1];
		struct conn *of[MAXPEERS + 1];
		int nf = 0;
		fds[nf] = (struct pollfd){ .fd = events->fd, .events = POLLIN };
		of[nf++] = NULL;
		for (int j = 0; j < n; j++)
			if (conns[j].ch) {
				fds[nf] = (struct pollfd){ .fd = conns[j].ch->fd, .events = POLLIN };
				of[nf++] = &conns[j];
			}
		if (poll(fds, nf, 100) < 0 && errno != EINTR) {
			printf("mesh %d: FAIL poll: %s\n", me, strerror(errno));
			return 1;
		}
		for (int f = 1; f < nf; f++)
			if (fds[f].revents & POLLIN) {
				struct ibv_cq *cq;
				void *ctx;
				if (ibv_get_cq_event(of[f]->ch, &cq, &ctx) == 0) {
					ibv_ack_cq_events(cq, 1);
					ibv_req_notify_cq(cq, 0);
				}
			}
		/* Every CQ, every turn: cheap, and no completion waits for its wakeup. */
		for (int j = 0; j < n; j++)
			if (conns[j].cq)
				drain(&conns[j]);
		if (fds[0].revents & POLLIN) {
			struct rdma_cm_event *ev;
			if (rdma_get_cm_event(events, &ev) == 0) {
				struct rdma_cm_event copy = *ev;
				uint8_t data[256];
				int len = ev->param.conn.private_data_len;
				if (ev->param.conn.private_data && len > 0) {
					memcpy(data, ev->param.conn.private_data, len);
					copy.param.conn.private_data = data;
				}
				rdma_ack_cm_event(ev);
				on_event(&copy, listener);
			}
		}
		for (int j = 0; j < n; j++)
			if (conns[j].state == UP && conns[j].flush_ms &&
			    now_ms() - conns[j].flush_ms > 1000)
				gone(&conns[j], "completion error: Work Request Flushed Error");
		if (!said_up && all_up()) {
			said_up = 1;
			printf("mesh %d: connected to %d peers\n", me, n - 1);
		}
		if (said_up && !said_stalled && stall >= 0 && stalled()) {
			said_stalled = 1;
			printf("mesh %d: stalled after %d messages to each peer\n", me, stall);
		}
	}
	/* Wait (bounded) for the peers' side of each disconnect, then take everything down. */
	double until = now_ms() + 2000;
	for (;;) {
		int waiting = 0;
		for (int j = 0; j < n; j++)
			if (conns[j].id && !conns[j].disconnected)
				waiting = 1;
		if (!waiting || now_ms() > until)
			break;
		struct pollfd pf = { .fd = events->fd, .events = POLLIN };
		if (poll(&pf, 1, 100) == 1) {
			struct rdma_cm_event *ev;
			if (rdma_get_cm_event(events, &ev) == 0) {
				struct conn *c = conn_of(ev->id);
				if (ev->event == RDMA_CM_EVENT_DISCONNECTED && c)
					c->disconnected = 1;
				rdma_ack_cm_event(ev);
			}
		}
	}
	uint64_t total = 0;
	int done = 0, lost = 0;
	for (int j = 0; j < n; j++) {
		struct conn *c = &conns[j];
		if (j == me)
			continue;
		total += c->bytes;
		done += c->state == DONE;
		lost += c->state == GONE;
		if (c->id) {
			if (c->id->qp)
				rdma_destroy_qp(c->id);
			rdma_destroy_id(c->id);
		}
		if (c->mr)
			ibv_dereg_mr(c->mr);
		if (c->cq)
			ibv_destroy_cq(c->cq);
		if (c->ch)
			ibv_destroy_comp_channel(c->ch);
		if (c->pd)
			ibv_dealloc_pd(c->pd);
		free(c->buf);
	}
	rdma_destroy_id(listener);
	rdma_destroy_event_channel(events);
	if (failures) {
		printf("mesh %d: FAIL %d failures\n", me, failures);
		return 1;
	}
	printf("mesh %d: ok %llu bytes verified from %d peers, %d gone\n", me,
	       (unsigned long long)total, done, lost);
	return 0;
}
