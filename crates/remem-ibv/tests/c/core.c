/* The drop-in's device, query, PD and MR verbs as a C program sees them (compiled
 * against rdma-core's verbs.h, run with the drop-in first on LD_LIBRARY_PATH): the
 * results and errno values of ibv_reg_mr(3), ibv_alloc_pd(3), ibv_query_port(3), ...
 * Prints one line per check; exits 1 at the first failure. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <net/if.h>

#include "check.h"

/* ibv_reg_mr that must fail with `want`. */
static void reg_fails(struct ibv_pd *pd, void *addr, size_t len, int access,
		      int want, const char *what)
{
	errno = 0;
	struct ibv_mr *mr = ibv_reg_mr(pd, addr, len, access);
	CHECK(mr == NULL && errno == want, "%s: want errno %d", what, want);
	if (mr)
		ibv_dereg_mr(mr);
}

int main(void)
{
	int n = -1;
	struct ibv_device **list = ibv_get_device_list(&n);
	/* rxe0 on 127.0.0.1, then one device per interface with an IPv4 address. */
	CHECK(list != NULL && n >= 1, "rxe0 and the host's other devices");
	if (!list || n < 1)
		return 1;
	CHECK(list[n] == NULL, "NULL-terminated");
	CHECK(strcmp(ibv_get_device_name(list[0]), "rxe0") == 0, "named rxe0");
	CHECK(ibv_get_device_index(list[0]) == 0, "index 0");
	CHECK(ibv_get_device_guid(list[0]) != 0, "a GUID");

	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx != NULL, "open");
	if (!ctx)
		return 1;
	CHECK(ctx->device == list[0], "context names its device");

	/* queries */
	struct ibv_device_attr attr;
	CHECK(ibv_query_device(ctx, &attr) == 0, "query_device");
	CHECK(attr.node_guid == ibv_get_device_guid(list[0]), "same GUID");
	CHECK(attr.phys_port_cnt == 1 && attr.max_qp > 0 && attr.max_cqe > 0, "limits");
	struct ibv_device_attr_ex attr_ex;
	CHECK(ibv_query_device_ex(ctx, NULL, &attr_ex) == 0, "query_device_ex");
	CHECK(attr_ex.orig_attr.max_qp == attr.max_qp, "ex has the basic attributes");
	struct ibv_query_device_ex_input in = { .comp_mask = 1 };
	CHECK(ibv_query_device_ex(ctx, &in, &attr_ex) == EINVAL, "unknown input comp_mask");

	struct ibv_port_attr port;
	CHECK(ibv_query_port(ctx, 1, &port) == 0, "query_port");
	CHECK(port.state == IBV_PORT_ACTIVE && port.link_layer == IBV_LINK_LAYER_ETHERNET,
	      "active RoCE port");
	CHECK(port.gid_tbl_len >= 2, "GID table: link-local and IPv4 (rxe's layout)");
	CHECK(ibv_query_port(ctx, 2, &port) == EINVAL, "port 2 does not exist");
	CHECK(ibv_query_port(ctx, 0, &port) == EINVAL, "port 0 does not exist");

	/* The exported ibv_query_port (programs built without the inline wrapper): the
	 * compat layout, up to link_layer and one reserved byte, nothing past it. */
	struct ibv_port_attr raw;
	memset(&raw, 0xaa, sizeof(raw));
	CHECK((ibv_query_port)(ctx, 1, (struct _compat_ibv_port_attr *)&raw) == 0,
	      "exported query_port");
	CHECK(raw.state == IBV_PORT_ACTIVE && raw.link_layer == IBV_LINK_LAYER_ETHERNET,
	      "compat attributes");
	CHECK(((unsigned char *)&raw)[offsetof(struct ibv_port_attr, flags) + 1] == 0xaa,
	      "nothing written past the compat layout");

	/* The extended query with an older, shorter ibv_device_attr_ex. */
	struct verbs_context *vctx = verbs_get_ctx(ctx);
	CHECK(vctx != NULL && vctx->sz >= sizeof(*vctx), "an extended context");
	memset(&attr_ex, 0xaa, sizeof(attr_ex));
	CHECK(vctx->query_device_ex(ctx, NULL, &attr_ex, sizeof(struct ibv_device_attr)) == 0,
	      "query_device_ex, basic size");
	CHECK(attr_ex.orig_attr.max_qp == attr.max_qp && attr_ex.comp_mask == 0xaaaaaaaa,
	      "only the basic attributes written");
	CHECK(vctx->query_device_ex(ctx, NULL, &attr_ex, 8) == EINVAL, "too small");
	memset(&port, 0xaa, sizeof(port));
	CHECK(vctx->query_port(ctx, 1, &port, offsetof(struct ibv_port_attr, lid)) == 0,
	      "query_port, short struct");
	CHECK(port.state == IBV_PORT_ACTIVE && port.lid == 0xaaaa, "prefix only");

	/* rxe's GID table: 0 the link-local default GID (lo's all-zero MAC, with this
	 * process's 127.a.b.c in its last three bytes), 1 the IPv4-mapped address, then
	 * lo's other IPv6 addresses; all RoCE v2, all on lo (ifindex 1). */
	union ibv_gid gid, ll;
	CHECK(ibv_query_gid(ctx, 1, 1, &gid) == 0, "query_gid");
	CHECK(gid.raw[10] == 0xff && gid.raw[11] == 0xff && gid.raw[12] == 127,
	      "index 1: the IPv4-mapped loopback GID");
	CHECK(ibv_query_gid(ctx, 1, 0, &ll) == 0, "query_gid 0");
	static const uint8_t ll_prefix[13] = { 0xfe, 0x80, 0, 0, 0, 0, 0, 0,
					       0x02, 0x00, 0x00, 0xff, 0xfe };
	CHECK(memcmp(ll.raw, ll_prefix, 13) == 0 && memcmp(ll.raw + 13, gid.raw + 13, 3) == 0,
	      "index 0: fe80::200:ff:fe{a}:{b}{c} for 127.a.b.c");
	errno = 0;
	CHECK(ibv_query_gid(ctx, 1, port.gid_tbl_len, &gid) == -1 && errno == EINVAL,
	      "index past the table");
	CHECK(ibv_query_gid(ctx, 3, 0, &gid) == -1, "bad port");

	struct ibv_gid_entry entry;
	CHECK(ibv_query_gid_ex(ctx, 1, 1, &entry, 0) == 0, "query_gid_ex");
	CHECK(entry.gid_type == IBV_GID_TYPE_ROCE_V2 && entry.gid_index == 1 &&
	      entry.port_num == 1, "RoCE v2 entry");
	CHECK(entry.ndev_ifindex == if_nametoindex("lo") && entry.ndev_ifindex == 1,
	      "ndev_ifindex: lo's");
	ibv_query_gid(ctx, 1, 1, &gid);
	CHECK(memcmp(&entry.gid, &gid, sizeof(gid)) == 0, "same GID");
	CHECK(ibv_query_gid_ex(ctx, 1, 0, &entry, 1) == EINVAL, "unknown flags");
	CHECK(ibv_query_gid_ex(ctx, 1, port.gid_tbl_len, &entry, 0) == EINVAL,
	      "past the table");
	enum ibv_gid_type_sysfs { SYSFS_IB_ROCE_V1, SYSFS_ROCE_V2 } gt = SYSFS_IB_ROCE_V1;
	extern int ibv_query_gid_type(struct ibv_context *, uint8_t, unsigned int,
				      enum ibv_gid_type_sysfs *);
	struct ibv_gid_entry table[8];
	ssize_t got = ibv_query_gid_table(ctx, table, 8, 0);
	CHECK(got == (ssize_t)port.gid_tbl_len, "gid table: gid_tbl_len entries");
	for (ssize_t i = 0; i < got; i++) {
		struct ibv_gid_entry one;
		union ibv_gid g;
		gt = SYSFS_IB_ROCE_V1;
		CHECK(table[i].gid_index == i && table[i].port_num == 1 &&
		      table[i].gid_type == IBV_GID_TYPE_ROCE_V2 && table[i].ndev_ifindex == 1,
		      "table entry: index, port, RoCE v2, lo");
		CHECK(ibv_query_gid_ex(ctx, 1, i, &one, 0) == 0 &&
		      memcmp(&one, &table[i], sizeof(one)) == 0, "query_gid_ex agrees");
		CHECK(ibv_query_gid(ctx, 1, i, &g) == 0 &&
		      memcmp(&g, &table[i].gid, sizeof(g)) == 0, "query_gid agrees");
		CHECK(ibv_query_gid_type(ctx, 1, i, &gt) == 0 && gt == SYSFS_ROCE_V2, "gid type");
	}
	CHECK(ibv_query_gid_table(ctx, table, 1, 0) < 0, "table too small");
	CHECK(ibv_query_gid_table(ctx, table, 0, 0) < 0, "table too small");

	__be16 pkey = 0;
	CHECK(ibv_query_pkey(ctx, 1, 0, &pkey) == 0 && pkey == 0xffff, "default P_Key");
	CHECK(ibv_query_pkey(ctx, 1, 1, &pkey) == -1, "one P_Key only");
	CHECK(ibv_get_pkey_index(ctx, 1, 0xffff) == 0, "P_Key index");
	CHECK(ibv_get_pkey_index(ctx, 1, htobe16(0x8001)) == -1, "unknown P_Key");

	/* PD and MR */
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL && pd->context == ctx, "alloc_pd");
	if (!pd)
		return 1;
	size_t len = 1 << 16;
	char *buf = malloc(len);
	memset(buf, 0x5a, len);

	reg_fails(pd, buf, 0, IBV_ACCESS_LOCAL_WRITE, EINVAL, "zero length");
	reg_fails(pd, buf, len, IBV_ACCESS_REMOTE_WRITE, EINVAL,
		  "REMOTE_WRITE without LOCAL_WRITE");
	reg_fails(pd, buf, len, IBV_ACCESS_REMOTE_ATOMIC, EINVAL,
		  "REMOTE_ATOMIC without LOCAL_WRITE");
	reg_fails(pd, buf, len, 1 << 15, EINVAL, "unknown access bit");
	reg_fails(pd, NULL, len, IBV_ACCESS_LOCAL_WRITE, EFAULT, "NULL address");

	long page = sysconf(_SC_PAGESIZE);
	char *gone = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	munmap(gone + page, page);
	reg_fails(pd, gone, 2 * page, 0, EFAULT, "partly unmapped");
	char *ro = mmap(NULL, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	reg_fails(pd, ro, page, IBV_ACCESS_LOCAL_WRITE, EFAULT, "read-only, NIC writes");
	struct ibv_mr *ro_mr = ibv_reg_mr(pd, ro, page, IBV_ACCESS_REMOTE_READ);
	CHECK(ro_mr != NULL, "read-only memory for remote reads");
	if (ro_mr)
		CHECK(ibv_dereg_mr(ro_mr) == 0, "dereg");

	struct ibv_mr *mr = ibv_reg_mr(pd, buf, len,
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				       IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
				       IBV_ACCESS_RELAXED_ORDERING);
	CHECK(mr != NULL, "reg_mr (optional RELAXED_ORDERING ignored)");
	if (!mr)
		return 1;
	CHECK(mr->addr == buf && mr->length == len && mr->pd == pd && mr->context == ctx,
	      "mr fields");
	CHECK(mr->lkey != 0 || mr->rkey != 0, "keys");
	struct ibv_mr *mr2 = ibv_reg_mr_iova2(pd, buf, len, 0x100000, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr2 != NULL && mr2->lkey != mr->lkey, "reg_mr_iova2 at another address");

	errno = 0;
	CHECK(ibv_dealloc_pd(pd) == EBUSY, "PD in use");
	/* ibv_rereg_mr works (tests/c/caps.c checks it): the MR stays the same object. */
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			   IBV_ACCESS_LOCAL_WRITE) == 0 && mr->addr == buf, "rereg_mr");
	CHECK(ibv_dereg_mr(mr) == 0, "dereg_mr");
	CHECK(ibv_dealloc_pd(pd) == EBUSY, "PD still in use");
	if (mr2)
		CHECK(ibv_dereg_mr(mr2) == 0, "dereg_mr 2");
	CHECK(ibv_dealloc_pd(pd) == 0, "dealloc_pd");

	/* what the soft device does not offer fails cleanly */
	struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
	struct ibv_mw *mw = ibv_alloc_mw(pd2, IBV_MW_TYPE_1);
	CHECK(mw != NULL && ibv_dealloc_mw(mw) == 0, "MW (tests/c/mw.c has the rest)");
	struct ibv_td_init_attr td_attr = { 0 };
	errno = 0;
	CHECK(ibv_alloc_td(ctx, &td_attr) == NULL && errno == EOPNOTSUPP, "no TD");
	struct ibv_alloc_dm_attr dm_attr = { .length = 64 };
	errno = 0;
	CHECK(ibv_alloc_dm(ctx, &dm_attr) == NULL && errno == EOPNOTSUPP, "no DM");
	struct ibv_counters_init_attr c_attr = { 0 };
	errno = 0;
	CHECK(ibv_create_counters(ctx, &c_attr) == NULL && errno == EOPNOTSUPP, "no counters");
	errno = 0;
	CHECK(ibv_reg_dmabuf_mr(pd2, 0, 64, 0, 3, 0) == NULL && errno == EOPNOTSUPP,
	      "no dma-buf");
	CHECK(ibv_import_pd(ctx, 1) == NULL && errno == EOPNOTSUPP, "no import");
	CHECK(ibv_dealloc_pd(pd2) == 0, "dealloc_pd 2");

	/* async events: non-blocking when the program says so */
	int fl = fcntl(ctx->async_fd, F_GETFL);
	CHECK((fl & O_NONBLOCK) == 0, "async_fd is blocking by default");
	fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
	struct ibv_async_event ev;
	errno = 0;
	CHECK(ibv_get_async_event(ctx, &ev) == -1 && errno == EAGAIN, "no event pending");
	/* A second open of the device has an async_fd of its own (UCX keys its handlers by
	 * descriptor; Open MPI opens a device once per UCX context), and opening it leaves the
	 * first context's O_NONBLOCK alone. */
	struct ibv_context *again = ibv_open_device(list[0]);
	CHECK(again != NULL, "open the device twice");
	CHECK(again->async_fd >= 0 && again->async_fd != ctx->async_fd,
	      "each open has its own async_fd");
	CHECK((fcntl(again->async_fd, F_GETFL) & O_NONBLOCK) == 0, "the new one blocks by default");
	CHECK(fcntl(ctx->async_fd, F_GETFL) & O_NONBLOCK, "the first one stays non-blocking");
	CHECK(ibv_close_device(again) == 0, "close the second open");

	/* helpers */
	CHECK(ibv_fork_init() == 0, "fork_init");
	CHECK(ibv_is_fork_initialized() == IBV_FORK_UNNEEDED, "fork unneeded");
	CHECK(strcmp(ibv_wc_status_str(IBV_WC_WR_FLUSH_ERR), "Work Request Flushed Error") == 0,
	      "wc status text");
	CHECK(strcmp(ibv_wc_status_str(999), "unknown") == 0, "unknown status");
	CHECK(strcmp(ibv_event_type_str(IBV_EVENT_COMM_EST), "communication established") == 0,
	      "event text");
	CHECK(strcmp(ibv_port_state_str(IBV_PORT_ACTIVE), "PORT_ACTIVE") == 0, "port text");
	CHECK(strcmp(ibv_node_type_str(IBV_NODE_CA), "InfiniBand channel adapter") == 0,
	      "node text");
	CHECK(ibv_rate_to_mult(IBV_RATE_40_GBPS) == 16 && mult_to_ibv_rate(16) == IBV_RATE_40_GBPS,
	      "rate multiples");
	CHECK(ibv_rate_to_mbps(IBV_RATE_100_GBPS) == 103125 &&
	      mbps_to_ibv_rate(103125) == IBV_RATE_100_GBPS, "rate Mb/s");
	CHECK(ibv_rate_to_mult(IBV_RATE_14_GBPS) == -1 && mbps_to_ibv_rate(1) == IBV_RATE_MAX,
	      "not a multiple");

	CHECK(ibv_close_device(ctx) == 0, "close");
	ibv_free_device_list(list);
	free(buf);
	printf("%d failures\n", failures);
	return failures ? 1 : 0;
}
