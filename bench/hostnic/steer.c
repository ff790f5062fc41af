// steer: what sharing one UDP port (RoCEv2's 4791) between the processes of a host costs on
// this machine, for issue 32's design (docs/host-nic.md). Loopback only; every run bounded.
// Prints one JSON line per measurement.
//
//   steer lat  OPTION LOAD PORT    ping-pong of one pair of processes: round trip median/p99 (us)
//   steer rate OPTION LOAD PORT    one-way 64 B datagram rate of one pair (sender blasts with
//                                  sendmmsg, receiver recvmmsg): datagrams/s received
//     OPTION: base       today's design: each process has its own socket on its own port
//             reuseport  option 0: one port, a SO_REUSEPORT group, a classic BPF program
//                        (SO_ATTACH_REUSEPORT_CBPF) steers by the BTH destination QPN's slot
//             unix       option 2a: a leader process owns the port and forwards each datagram
//                        to its owner over an AF_UNIX datagram socket
//             ring       option 2b: the same leader forwards through a shared-memory ring
//                        (memfd) per process, with an eventfd wake-up when the owner sleeps
//     Each also prints cpu_us_per_dgram: the CPU time of every process of the run (leader
//     included; softirq work run by ksoftirqd is not in it) over the datagrams they received.
//     LOAD: 0 or 8: 8 more processes (4 pairs, 8 datagrams in flight each) ping-pong through the
//           same port/group/leader as fast as they can while the pair is measured.
//   steer death PORT     option 0 at a member's death (4 members, SIGKILL member 1)
//   steer cbpf PORT      option 0 works for this user (run it unprivileged) and steers CM MADs
//   steer mcast PORT     who in a group (bound to 0.0.0.0) gets a multicast datagram
//   steer ebpf           BPF_MAP_CREATE(REUSEPORT_SOCKARRAY), BPF_PROG_LOAD(SK_REUSEPORT and
//                        SOCKET_FILTER) as this user: errno of each
//   steer uid PORT UID   (as root) can a socket of UID join root's reuseport group?
//   steer pvm            process_vm_writev from one process into a sibling (same user: run it
//                        unprivileged, e.g. under setpriv, so no capability helps)
//
// Every datagram is 64 bytes and starts like a BTH: byte 0 opcode, bytes 4..7 a big-endian u32
// whose low 24 bits are the destination QPN; the QPN's top 8 bits (byte 5) are the owner's slot.
// Build: cc -O2 -o steer steer.c
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/bpf.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef SO_ATTACH_REUSEPORT_CBPF
#define SO_ATTACH_REUSEPORT_CBPF 51
#endif
#ifndef SO_ATTACH_REUSEPORT_EBPF
#define SO_ATTACH_REUSEPORT_EBPF 52
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

enum { SIZE = 64, MAXM = 10, BATCH = 32, RING_N = 1024, LAT_ITERS = 20000, WINDOW = 8 };
static const char *IP = "127.0.0.1";

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static void die(const char *what) {
  fprintf(stderr, "steer: %s: %s\n", what, strerror(errno));
  exit(1);
}
static struct sockaddr_in addr(int port) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  inet_pton(AF_INET, IP, &a.sin_addr);
  return a;
}
static void bufs(int s) {
  int big = 4 << 20;
  setsockopt(s, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
  setsockopt(s, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
}
static void rcvtimeo(int s, int ms) {
  struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}
// a UDP socket bound to IP:port (port 0: unbound sender), with SO_REUSEPORT if reuse
static int udp(int port, int reuse) {
  int s = socket(AF_INET, SOCK_DGRAM, 0), on = 1;
  if (s < 0) die("socket");
  bufs(s);
  if (reuse && setsockopt(s, SOL_SOCKET, SO_REUSEPORT, &on, sizeof on)) die("SO_REUSEPORT");
  if (port) {
    struct sockaddr_in a = addr(port);
    if (bind(s, (void *)&a, sizeof a)) return -errno;
  }
  return s;
}

// ---- the steering program (classic BPF, run by the kernel on the UDP payload) ----
// slot = byte 5 (top 8 bits of the destination QPN). Slot 0 holds the special QPNs: QP1's CM
// MADs are steered by attribute: REQ/SIDR REQ to req_idx (the member that forwards them to the
// listener of their service ID), SIDR REP by the slot in its request ID (MAD data offset 0),
// every other CM MAD by the slot in the receiver's communication ID (MAD data offset 4). A slot
// is then looked up in a table of (slot, socket index); no entry: dflt (which drops and counts).
// Payload offsets: BTH 0..11, DETH 12..19, MAD header 20..43 (attribute ID at 36), data at 44.
static int build_prog(struct sock_filter *p, const int *slot, const int *idx, int k, int req_idx, int dflt) {
  int n = 0;
  p[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 5);
  p[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 13);     // -> 15 table
  p[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 4);
  p[n++] = (struct sock_filter)BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 0xffffff);
  p[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 1, 0, 9);      // -> 14 dflt
  p[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_H | BPF_ABS, 36);
  p[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x10, 6, 0);   // REQ -> 13
  p[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x17, 5, 0);   // SIDR REQ -> 13
  p[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x18, 2, 0);   // SIDR REP -> 11
  p[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 48);             // remote comm ID
  p[n++] = (struct sock_filter)BPF_STMT(BPF_JMP | BPF_JA, 4);                      // -> 15
  p[n++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 44);             // request ID
  p[n++] = (struct sock_filter)BPF_STMT(BPF_JMP | BPF_JA, 2);                      // -> 15
  p[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, req_idx);                 // 13
  p[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, dflt);                    // 14
  for (int i = 0; i < k; i++) {                                                      // 15: table
    p[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, slot[i], 0, 1);
    p[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, idx[i]);
  }
  p[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, dflt);
  return n;
}
static int attach(int s, struct sock_filter *p, int n) {
  struct sock_fprog f = {.len = n, .filter = p};
  return setsockopt(s, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &f, sizeof f) ? -errno : 0;
}
// the probe program of the death test: socket index = byte 5 as is
static int attach_identity(int s) {
  struct sock_filter p[] = {BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 5), BPF_STMT(BPF_RET | BPF_A, 0)};
  return attach(s, p, 2);
}

// ---- the packets ----
static int slot_of(int m) { return 0x11 + 13 * m; }  // members' slots: not their indexes
static void bth(char *b, int slot, uint32_t seq) {
  memset(b, 0, SIZE);
  b[0] = 0x04;  // RC SEND only
  uint32_t q = htonl(((uint32_t)slot << 16) | 0x1234);
  memcpy(b + 4, &q, 4);
  memcpy(b + 12, &seq, 4);
}
static uint32_t seq_of(const char *b) { uint32_t s; memcpy(&s, b + 12, 4); return s; }

// ---- shared state of one run (MAP_SHARED before fork) ----
struct ring {
  _Atomic uint32_t head; char pad0[60];
  _Atomic uint32_t tail; char pad1[60];
  _Atomic int sleeping; char pad2[60];
  struct { uint16_t len; char data[SIZE + 62]; } e[RING_N];
};
struct shared {
  _Atomic int stop, ready;
  _Atomic long busy_rx, lost, fwd_drops, rx_all;  // rx_all: datagrams received by every member
  double med, p99, rate, sent_rate; long n;
  _Atomic long counts[8][4][256];  // death test: [phase][member][slot byte]
  _Atomic int cmd_seq, cmd_member, cmd_prog; _Atomic int done_seq;
  double seen_death_at; int victim_pid;
};
static struct shared *sh;
static struct ring *rings;

// ---- one member's endpoint, whatever the option ----
enum opt { BASE, REUSE, UNIX, RING };
struct ep {
  enum opt o; int m;      // member number (= socket index in the group for REUSE)
  int tx, rx;             // tx: UDP socket that sends; rx: what receives (UDP, AF_UNIX or eventfd)
  int port0;
};
static int port_of_member(int port0, int m) { return port0 + 1 + m; }  // BASE: distinct ports
static int member_of_slot(int slot) { return slot >= 0x11 && (slot - 0x11) % 13 == 0 ? (slot - 0x11) / 13 : -1; }

static void ep_send(struct ep *e, int dst_m, char (*b)[SIZE], int n) {
  struct sockaddr_in to = addr(e->o == BASE ? port_of_member(e->port0, dst_m) : e->port0);
  struct mmsghdr mm[BATCH];
  struct iovec io[BATCH];
  for (int i = 0; i < n; i++) {
    io[i] = (struct iovec){b[i], SIZE};
    mm[i].msg_hdr = (struct msghdr){.msg_name = &to, .msg_namelen = sizeof to, .msg_iov = &io[i], .msg_iovlen = 1};
  }
  for (int done = 0; done < n;) {
    int k = sendmmsg(e->tx, mm + done, n - done, 0);
    if (k <= 0) { if (errno == EINTR) continue; return; }
    done += k;
  }
}
static int ep_recv_(struct ep *e, char (*b)[SIZE], int max, int ms);
// up to max datagrams into b; waits at most ms; returns 0 on timeout
static int ep_recv(struct ep *e, char (*b)[SIZE], int max, int ms) {
  int k = ep_recv_(e, b, max, ms);
  if (k > 0) atomic_fetch_add_explicit(&sh->rx_all, k, memory_order_relaxed);
  return k;
}
static int ep_recv_(struct ep *e, char (*b)[SIZE], int max, int ms) {
  if (e->o == RING) {
    struct ring *r = &rings[e->m];
    for (;;) {
      uint32_t t = atomic_load_explicit(&r->tail, memory_order_relaxed);
      uint32_t h = atomic_load_explicit(&r->head, memory_order_acquire);
      if (h != t) {
        int n = 0;
        while (t != h && n < max) { memcpy(b[n++], r->e[t % RING_N].data, SIZE); t++; }
        atomic_store_explicit(&r->tail, t, memory_order_release);
        return n;
      }
      atomic_store(&r->sleeping, 1);  // seq_cst: the producer sees it or we see its entry
      if (atomic_load(&r->head) != t) { atomic_store(&r->sleeping, 0); continue; }
      struct pollfd p = {e->rx, POLLIN, 0};
      int k = poll(&p, 1, ms);
      atomic_store(&r->sleeping, 0);
      if (k <= 0) { if (atomic_load(&r->head) != t) continue; return 0; }
      uint64_t v;
      if (read(e->rx, &v, 8) < 0) {}
    }
  }
  struct mmsghdr mm[BATCH];
  struct iovec io[BATCH];
  if (max > BATCH) max = BATCH;
  for (int i = 0; i < max; i++) {
    io[i] = (struct iovec){b[i], SIZE};
    mm[i].msg_hdr = (struct msghdr){.msg_iov = &io[i], .msg_iovlen = 1};
  }
  struct pollfd p = {e->rx, POLLIN, 0};
  int k = recvmmsg(e->rx, mm, max, MSG_DONTWAIT, 0);
  if (k > 0) return k;
  if (poll(&p, 1, ms) <= 0) return 0;
  k = recvmmsg(e->rx, mm, max, MSG_DONTWAIT, 0);
  return k > 0 ? k : 0;
}

// ---- the roles ----
static int cmp_d(const void *a, const void *c) { double x = *(double *)a, y = *(double *)c; return x < y ? -1 : x > y; }
static void pinger(struct ep *e, int peer) {
  char b[BATCH][SIZE];
  double *l = malloc(sizeof(double) * LAT_ITERS), t_end = now_us() + 4e6;
  long n = 0, lost = 0;
  for (uint32_t i = 0; i < LAT_ITERS + 200 && now_us() < t_end; i++) {
    bth(b[0], slot_of(peer), i);
    double t0 = now_us();
    ep_send(e, peer, b, 1);
    for (;;) {
      int k = ep_recv(e, b, BATCH, 200);
      if (k == 0) { lost++; goto next; }
      for (int j = 0; j < k; j++) if (seq_of(b[j]) == i) goto got;
    }
  got:
    if (i >= 200) l[n++] = now_us() - t0;
  next:;
  }
  qsort(l, n, sizeof(double), cmp_d);
  sh->n = n; sh->lost = lost;
  sh->med = n ? l[n / 2] : -1; sh->p99 = n ? l[n * 99 / 100] : -1;
}
static void echoer(struct ep *e, int peer) {
  char b[BATCH][SIZE];
  while (!atomic_load(&sh->stop)) {
    int k = ep_recv(e, b, BATCH, 50);
    for (int j = 0; j < k; j++) { uint32_t s = seq_of(b[j]); bth(b[j], slot_of(peer), s); }
    if (k) ep_send(e, peer, b, k);
  }
}
static void busy(struct ep *e, int peer, int starter) {
  char b[BATCH][SIZE];
  long rx = 0;
  double t0 = 0;
  for (;;) {
    if (starter) {
      for (int j = 0; j < WINDOW; j++) bth(b[j], slot_of(peer), j);
      ep_send(e, peer, b, WINDOW);
    }
    for (;;) {
      if (atomic_load(&sh->stop)) { atomic_fetch_add(&sh->busy_rx, rx); return; }
      int k = ep_recv(e, b, BATCH, 100);
      if (k == 0) break;  // lost: the starter puts the window back
      if (!t0) t0 = now_us();
      rx += k;
      for (int j = 0; j < k; j++) bth(b[j], slot_of(peer), 0);
      ep_send(e, peer, b, k);
    }
  }
}
static void blaster(struct ep *e, int peer) {
  char b[BATCH][SIZE];
  for (int j = 0; j < BATCH; j++) bth(b[j], slot_of(peer), j);
  long sent = 0;
  double t0 = now_us(), t_end = t0 + 2.6e6;
  while (!atomic_load(&sh->stop) && now_us() < t_end) { ep_send(e, peer, b, BATCH); sent += BATCH; }
  sh->sent_rate = sent / ((now_us() - t0) / 1e6);
}
static void sink(struct ep *e) {
  char b[BATCH][SIZE];
  long n = 0;
  if (ep_recv(e, b, BATCH, 3000) == 0) { sh->rate = 0; return; }
  double t0 = now_us(), t_end = t0 + 2e6, t;
  while ((t = now_us()) < t_end) n += ep_recv(e, b, BATCH, 100);
  sh->rate = n / ((t - t0) / 1e6);
  while (ep_recv(e, b, BATCH, 100) > 0) {}  // drain what the blaster still sends (CPU per datagram)
}

// the leader of options 2a/2b: owns the port, forwards by slot; never waits for a slow member
static void leader(int s, enum opt o, int *fwd, int *efd, int nm) {
  char b[BATCH][SIZE];
  struct mmsghdr mm[BATCH], out[MAXM][BATCH];
  struct iovec io[BATCH];
  long drops = 0;
  rcvtimeo(s, 100);
  while (!atomic_load(&sh->stop)) {
    for (int i = 0; i < BATCH; i++) {
      io[i] = (struct iovec){b[i], SIZE};
      mm[i].msg_hdr = (struct msghdr){.msg_iov = &io[i], .msg_iovlen = 1};
    }
    int k = recvmmsg(s, mm, BATCH, MSG_WAITFORONE, 0);
    if (k <= 0) continue;
    int wake[MAXM] = {0}, nout[MAXM] = {0};
    for (int i = 0; i < k; i++) {
      int m = member_of_slot((uint8_t)b[i][5]);
      if (m < 0 || m >= nm) { drops++; continue; }
      if (o == UNIX) {
        out[m][nout[m]++].msg_hdr = (struct msghdr){.msg_iov = &io[i], .msg_iovlen = 1};
      } else {
        struct ring *r = &rings[m];
        uint32_t h = atomic_load_explicit(&r->head, memory_order_relaxed);
        if (h - atomic_load_explicit(&r->tail, memory_order_acquire) >= RING_N) { drops++; continue; }
        r->e[h % RING_N].len = SIZE;
        memcpy(r->e[h % RING_N].data, b[i], SIZE);
        atomic_store_explicit(&r->head, h + 1, memory_order_release);
        wake[m] = 1;
      }
    }
    if (o == UNIX)  // one sendmmsg per owner; what does not fit now is dropped, as a NIC would
      for (int m = 0; m < nm; m++)
        if (nout[m]) { int sent = sendmmsg(fwd[m], out[m], nout[m], MSG_DONTWAIT); drops += nout[m] - (sent > 0 ? sent : 0); }
    if (o == RING) atomic_thread_fence(memory_order_seq_cst);  // heads published before reading 'sleeping'
    if (o == RING)
      for (int m = 0; m < nm; m++)
        if (wake[m] && atomic_load(&rings[m].sleeping)) { uint64_t one = 1; if (write(efd[m], &one, 8) < 0) {} }
  }
  sh->fwd_drops = drops;
}

static const char *opt_name[] = {"base-per-process-ports", "0-reuseport-cbpf", "2a-leader-unix-dgram", "2b-leader-shm-ring-eventfd"};

static void *shared_map(size_t n) {
  void *p = mmap(0, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) die("mmap");
  memset(p, 0, n);
  return p;
}

static int run_pair(int lat, enum opt o, int load, int port0) {
  int nm = 2 + load;
  sh = shared_map(sizeof *sh);
  int udps[MAXM], fwd_leader[MAXM], fwd_member[MAXM], efd[MAXM], lsock = -1;
  // sockets are made here, in member order (so member m is index m of the reuseport group)
  if (o == RING) {
    int fd = memfd_create("hostnic-rings", 0);
    if (fd < 0 || ftruncate(fd, sizeof(struct ring) * MAXM)) die("memfd");
    rings = mmap(0, sizeof(struct ring) * MAXM, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (rings == MAP_FAILED) die("mmap memfd");
    close(fd);
  }
  if (o == UNIX || o == RING) { lsock = udp(port0, 0); if (lsock < 0) { errno = -lsock; die("bind leader"); } }
  for (int m = 0; m < nm; m++) {
    if (o == BASE) udps[m] = udp(port_of_member(port0, m), 0);
    else if (o == REUSE) udps[m] = udp(port0, 1);
    else udps[m] = udp(0, 0);
    if (udps[m] < 0) { errno = -udps[m]; die("bind member"); }
    if (o == UNIX) {
      int sv[2];
      if (socketpair(AF_UNIX, SOCK_DGRAM, 0, sv)) die("socketpair");
      bufs(sv[0]); bufs(sv[1]);
      fwd_leader[m] = sv[0]; fwd_member[m] = sv[1];
    }
    if (o == RING) efd[m] = eventfd(0, 0);
  }
  if (o == REUSE) {
    // the table as a real device would have it: 16 slots (the busy members', quarantined ones
    // that go to index 0, and the measured pair's last, the longest walk)
    int slot[16], idx[16], k = 0;
    for (int m = 2; m < nm; m++) { slot[k] = slot_of(m); idx[k++] = m; }
    for (int q = 0; k < 14; q++) { slot[k] = 0xf0 + q; idx[k++] = 0; }
    slot[k] = slot_of(0); idx[k++] = 0;
    slot[k] = slot_of(1); idx[k++] = 1;
    struct sock_filter p[64];
    int n = build_prog(p, slot, idx, k, 0, 0);
    int r = attach(udps[0], p, n);
    if (r) { errno = -r; die("SO_ATTACH_REUSEPORT_CBPF"); }
  }
  pid_t pids[MAXM + 1];
  int np = 0;
  if (lsock >= 0) {
    pid_t p = fork();
    if (!p) { alarm(20); leader(lsock, o, fwd_leader, efd, nm); _exit(0); }
    pids[np++] = p;
  }
  for (int m = nm - 1; m >= 0; m--) {  // the busy ones first
    pid_t p = fork();
    if (!p) {
      alarm(20);
      for (int j = 0; j < nm; j++) if (j != m) { close(udps[j]); if (o == UNIX) close(fwd_member[j]); }
      if (lsock >= 0) close(lsock);
      struct ep e = {o, m, udps[m], udps[m], port0};
      if (o == UNIX) e.rx = fwd_member[m];
      if (o == RING) e.rx = efd[m];
      atomic_fetch_add(&sh->ready, 1);
      if (m >= 2) busy(&e, m ^ 1, !(m & 1));
      else {
        while (atomic_load(&sh->ready) < nm) usleep(1000);
        usleep(300000);
        if (lat) { if (m == 0) pinger(&e, 1); else echoer(&e, 0); }
        else { if (m == 0) sink(&e); else blaster(&e, 0); }
      }
      _exit(0);
    }
    pids[np++] = p;
  }
  for (int m = 0; m < nm; m++) { close(udps[m]); if (o == UNIX) { close(fwd_member[m]); close(fwd_leader[m]); } }
  if (lsock >= 0) close(lsock);
  double t0 = now_us();
  waitpid(pids[np - 1], 0, 0);  // member 0 measures; it ends by itself
  atomic_store(&sh->stop, 1);
  double busy_s = (now_us() - t0) / 1e6;
  double cpu_us = 0;
  for (int i = 0; i < np; i++) {
    while (waitpid(pids[i], 0, WNOHANG) == 0) {
      if (now_us() - t0 > 25e6) { kill(pids[i], SIGKILL); waitpid(pids[i], 0, 0); break; }
      usleep(10000);
    }
  }
  struct rusage ru;  // every child's CPU (the leader's too), waited for above
  getrusage(RUSAGE_CHILDREN, &ru);
  cpu_us = ru.ru_utime.tv_sec * 1e6 + ru.ru_utime.tv_usec + ru.ru_stime.tv_sec * 1e6 + ru.ru_stime.tv_usec;
  double cpu_per = atomic_load(&sh->rx_all) ? cpu_us / atomic_load(&sh->rx_all) : -1;
  if (lat)
    printf("{\"bench\":\"hostnic\",\"test\":\"lat_rtt\",\"option\":\"%s\",\"busy_procs\":%d,\"size\":%d,"
           "\"rtt_us_median\":%.2f,\"rtt_us_p99\":%.2f,\"round_trips\":%ld,\"timeouts\":%ld,\"fwd_drops\":%ld,\"busy_rx_per_s\":%.0f,\"cpu_us_per_dgram\":%.2f}\n",
           opt_name[o], load, SIZE, sh->med, sh->p99, sh->n, (long)sh->lost, (long)sh->fwd_drops, sh->busy_rx / busy_s, cpu_per);
  else
    printf("{\"bench\":\"hostnic\",\"test\":\"rate_64B\",\"option\":\"%s\",\"busy_procs\":%d,\"size\":%d,"
           "\"rx_dgrams_per_s\":%.0f,\"tx_dgrams_per_s\":%.0f,\"fwd_drops\":%ld,\"busy_rx_per_s\":%.0f,\"cpu_us_per_dgram\":%.2f}\n",
           opt_name[o], load, SIZE, sh->rate, sh->sent_rate, (long)sh->fwd_drops, sh->busy_rx / busy_s, cpu_per);
  return 0;
}

// ---- option 0 at a member's death ----
// Phases: 0 identity program, probes to indexes 0..3; 1 slot program, probes to each slot;
// SIGKILL member 1; 2 stale slot program, probes to each slot; 3 identity program (attached by
// survivor 2), probes to indexes 0..3; 4 rewritten slot program (attached by survivor 0), probes.
static void death_member(int s, int m, int nm) {
  int phase_fd = -1;
  if (m == 0) {  // member 0 watches member 1 through a pidfd (it is not its parent)
    while (!sh->victim_pid) usleep(1000);
    phase_fd = syscall(SYS_pidfd_open, sh->victim_pid, 0);
  }
  char b[SIZE];
  int seen = 0;
  for (;;) {
    if (atomic_load(&sh->stop)) _exit(0);
    int cs = atomic_load(&sh->cmd_seq);
    if (cs != atomic_load(&sh->done_seq) && atomic_load(&sh->cmd_member) == m) {
      int r;
      int kind = atomic_load(&sh->cmd_prog);
      if (kind == 0) r = attach_identity(s);
      else {
        // 1: the table before the death; 2: rewritten: survivors' slots -> their indexes now
        // (the last member, 3, moved into index 1); the dead slot -> 0 (quarantine: dropped, counted)
        int slot[4] = {slot_of(0), slot_of(1), slot_of(2), slot_of(3)}, idx1[4] = {0, 1, 2, 3}, idx2[4] = {0, 0, 2, 1};
        struct sock_filter p[64];
        r = attach(s, p, build_prog(p, slot, kind == 1 ? idx1 : idx2, 4, 0, 0));
      }
      if (r) { errno = -r; die("attach by survivor"); }
      atomic_store(&sh->done_seq, cs);
    }
    struct pollfd p[2] = {{s, POLLIN, 0}, {phase_fd, POLLIN, 0}};
    if (poll(p, phase_fd >= 0 && !seen ? 2 : 1, 10) <= 0) continue;
    if (p[1].revents & POLLIN && !seen) { sh->seen_death_at = now_us(); seen = 1; }
    ssize_t k = recv(s, b, SIZE, MSG_DONTWAIT);
    if (k == SIZE) atomic_fetch_add(&sh->counts[(uint8_t)b[1]][m][(uint8_t)b[5]], 1);
  }
  (void)nm;
}
static int txs[8];  // probes come from 8 source ports, so the kernel's hash fallback shows as a spread
static void probe(int unused, int port, int phase, int byte5, int n) {
  (void)unused;
  char b[SIZE];
  struct sockaddr_in to = addr(port);
  for (int i = 0; i < n; i++) {
    bth(b, byte5, i);
    b[1] = phase;
    sendto(txs[i % 8], b, SIZE, 0, (void *)&to, sizeof to);
  }
}
static void ask(int m, int prog) {
  atomic_store(&sh->cmd_member, m);
  atomic_store(&sh->cmd_prog, prog);
  int seq = atomic_fetch_add(&sh->cmd_seq, 1) + 1;
  double t0 = now_us();
  while (atomic_load(&sh->done_seq) != seq && now_us() - t0 < 2e6) usleep(1000);
}
static void print_phase(const char *name, int phase, int by_index, int alive_mask) {
  // rows: what was aimed at (an index or a member's slot) -> who got how many
  printf("{\"bench\":\"hostnic\",\"test\":\"death\",\"phase\":\"%s\",\"aimed\":{", name);
  long mis = 0;
  for (int t = 0; t < 4; t++) {
    int byte5 = by_index ? t : slot_of(t);
    printf("%s\"%s%d\":{", t ? "," : "", by_index ? "index" : "slot_of_member", t);
    int first = 1;
    for (int m = 0; m < 4; m++) {
      long c = atomic_load(&sh->counts[phase][m][byte5]);
      if (!c) continue;
      printf("%s\"member%d\":%ld", first ? "" : ",", m, c);
      first = 0;
      if (!by_index && m != t && (alive_mask >> t & 1)) mis += c;
    }
    printf("}");
  }
  if (by_index) printf("}}\n");
  else printf("},\"misdelivered_to_live_owner\":%ld}\n", mis);
}
static int death(int port) {
  enum { NM = 4, PROBES = 200 };
  sh = shared_map(sizeof *sh);
  int s[NM];
  for (int m = 0; m < NM; m++) { s[m] = udp(port, 1); if (s[m] < 0) { errno = -s[m]; die("bind"); } }
  if (attach_identity(s[0])) die("attach");
  pid_t pid[NM];
  for (int m = 0; m < NM; m++) {
    pid[m] = fork();
    if (!pid[m]) {
      alarm(20);
      for (int j = 0; j < NM; j++) if (j != m) close(s[j]);
      death_member(s[m], m, NM);
    }
  }
  for (int m = 0; m < NM; m++) close(s[m]);
  sh->victim_pid = pid[1];
  int tx = -1;
  for (int i = 0; i < 8; i++) txs[i] = udp(0, 0);
  usleep(100000);
  for (int t = 0; t < NM; t++) probe(tx, port, 0, t, PROBES);
  usleep(100000);
  print_phase("before_kill_identity_program", 0, 1, 0xf);
  ask(3, 1);  // the slot program, attached by member 3 (any member may)
  for (int t = 0; t < NM; t++) probe(tx, port, 1, slot_of(t), PROBES);
  usleep(100000);
  print_phase("before_kill_slot_program", 1, 0, 0xf);
  double t_kill = now_us();
  kill(pid[1], SIGKILL);
  waitpid(pid[1], 0, 0);
  double t_reaped = now_us();
  usleep(50000);
  for (int t = 0; t < NM; t++) probe(tx, port, 2, slot_of(t), PROBES);
  usleep(100000);
  print_phase("after_kill_stale_slot_program", 2, 0, 0xd);
  ask(2, 0);  // identity program, attached by survivor 2
  for (int t = 0; t < NM; t++) probe(tx, port, 3, t, PROBES);
  usleep(100000);
  print_phase("after_kill_identity_program", 3, 1, 0xd);
  ask(0, 2);  // the rewritten slot program, attached by survivor 0
  for (int t = 0; t < NM; t++) probe(tx, port, 4, slot_of(t), PROBES);
  usleep(100000);
  print_phase("after_rewrite_slot_program", 4, 0, 0xd);
  printf("{\"bench\":\"hostnic\",\"test\":\"death_seen_by_pidfd\",\"watcher\":\"member0 (not the parent)\","
         "\"us_from_kill_to_pidfd_readable\":%.1f,\"us_from_kill_to_parent_reaped\":%.1f}\n",
         sh->seen_death_at ? sh->seen_death_at - t_kill : -1, t_reaped - t_kill);
  atomic_store(&sh->stop, 1);
  for (int m = 0; m < NM; m++) if (m != 1) waitpid(pid[m], 0, 0);
  return 0;
}

// ---- option 0 for this user: attach, steer data and CM MADs (2 members) ----
static void cm_mad(char *b, uint16_t attr, int slot_at, int slot) {
  bth(b, 0, 0);
  b[0] = 0x64;                   // UD SEND only
  b[5] = 0; b[6] = 0; b[7] = 1;  // destination QPN 1
  b[20] = 1; b[21] = 7; b[22] = 2;  // MAD base version, CM class, class version
  b[36] = attr >> 8; b[37] = attr;
  b[slot_at] = slot;
}
static int cbpf(int port) {
  int s0 = udp(port, 1), s1 = udp(port, 1);
  if (s0 < 0 || s1 < 0) {
    printf("{\"bench\":\"hostnic\",\"test\":\"cbpf_unprivileged\",\"uid\":%d,\"bind_errno\":\"%s\"}\n", getuid(), strerror(-(s0 < 0 ? s0 : s1)));
    return 1;
  }
  int slot[2] = {0x21, 0x42}, idx[2] = {0, 1};
  struct sock_filter p[64];
  int r = attach(s1, p, build_prog(p, slot, idx, 2, 1, 0));  // REQs to index 1 (the listener)
  rcvtimeo(s0, 50); rcvtimeo(s1, 50);
  int tx = udp(0, 0);
  struct sockaddr_in to = addr(port);
  // (what, packet builder) -> expected receiver
  struct { const char *what; int want; char b[SIZE]; } t[8];
  int n = 0;
  bth(t[n].b, 0x21, 0); t[n].what = "data_qpn_slot_0x21"; t[n++].want = 0;
  bth(t[n].b, 0x42, 0); t[n].what = "data_qpn_slot_0x42"; t[n++].want = 1;
  cm_mad(t[n].b, 0x10, 0, 0); t[n].what = "cm_REQ"; t[n++].want = 1;
  cm_mad(t[n].b, 0x17, 0, 0); t[n].what = "cm_SIDR_REQ"; t[n++].want = 1;
  cm_mad(t[n].b, 0x13, 48, 0x21); t[n].what = "cm_REP_remote_comm_id_slot_0x21"; t[n++].want = 0;
  cm_mad(t[n].b, 0x15, 48, 0x42); t[n].what = "cm_DREQ_remote_comm_id_slot_0x42"; t[n++].want = 1;
  cm_mad(t[n].b, 0x18, 44, 0x21); t[n].what = "cm_SIDR_REP_request_id_slot_0x21"; t[n++].want = 0;
  cm_mad(t[n].b, 0x12, 48, 0x42); t[n].what = "cm_REJ_remote_comm_id_slot_0x42"; t[n++].want = 1;
  int ok = 0;
  printf("{\"bench\":\"hostnic\",\"test\":\"cbpf_steering\",\"uid\":%d,\"euid\":%d,\"attach\":\"%s\",\"cases\":{", getuid(), geteuid(), r ? strerror(-r) : "ok");
  for (int i = 0; i < n; i++) {
    int got[2] = {0, 0};
    for (int j = 0; j < 20; j++) sendto(tx, t[i].b, SIZE, 0, (void *)&to, sizeof to);
    usleep(20000);
    char b[SIZE];
    while (recv(s0, b, SIZE, MSG_DONTWAIT) > 0) got[0]++;
    while (recv(s1, b, SIZE, MSG_DONTWAIT) > 0) got[1]++;
    int good = got[t[i].want] == 20;
    ok += good;
    printf("%s\"%s\":{\"to_index0\":%d,\"to_index1\":%d,\"want_index\":%d}", i ? "," : "", t[i].what, got[0], got[1], t[i].want);
  }
  printf("},\"all_steered_right\":%s}\n", ok == n ? "true" : "false");
  return ok == n ? 0 : 1;
}

// ---- multicast to a reuseport group (3 members bound to 0.0.0.0:port, a program that sends
// every unicast datagram to index 0): who gets a datagram sent to a group joined on loopback ----
static int mcast(int port) {
  int s[3], on = 1;
  struct ip_mreq mr;
  inet_pton(AF_INET, "239.1.2.3", &mr.imr_multiaddr);
  inet_pton(AF_INET, IP, &mr.imr_interface);
  for (int i = 0; i < 3; i++) {
    s[i] = socket(AF_INET, SOCK_DGRAM, 0);
    setsockopt(s[i], SOL_SOCKET, SO_REUSEPORT, &on, sizeof on);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (bind(s[i], (void *)&a, sizeof a)) die("bind 0.0.0.0");
    if (setsockopt(s[i], IPPROTO_IP, IP_ADD_MEMBERSHIP, &mr, sizeof mr)) die("IP_ADD_MEMBERSHIP");
  }
  struct sock_filter p[] = {BPF_STMT(BPF_RET | BPF_K, 0)};
  if (attach(s[1], p, 1)) die("attach");
  int tx = socket(AF_INET, SOCK_DGRAM, 0);
  setsockopt(tx, IPPROTO_IP, IP_MULTICAST_IF, &mr.imr_interface, sizeof mr.imr_interface);
  setsockopt(tx, IPPROTO_IP, IP_MULTICAST_LOOP, &on, sizeof on);
  struct sockaddr_in g = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr = mr.imr_multiaddr}, u = addr(port);
  char b[SIZE];
  bth(b, 0xff, 0);
  b[5] = b[6] = b[7] = (char)0xff;  // multicast QPN 0xFFFFFF
  for (int i = 0; i < 20; i++) { b[0] = 'm'; sendto(tx, b, SIZE, 0, (void *)&g, sizeof g); }
  for (int i = 0; i < 20; i++) { b[0] = 'u'; sendto(tx, b, SIZE, 0, (void *)&u, sizeof u); }
  usleep(100000);
  printf("{\"bench\":\"hostnic\",\"test\":\"multicast_to_group\",\"sent_multicast\":20,\"sent_unicast\":20,\"members\":{");
  for (int i = 0; i < 3; i++) {
    int m = 0, n = 0;
    while (recv(s[i], b, SIZE, MSG_DONTWAIT) > 0) { if (b[0] == 'm') m++; else n++; }
    printf("%s\"index%d\":{\"multicast\":%d,\"unicast\":%d}", i ? "," : "", i, m, n);
  }
  printf("}}\n");
  return 0;
}

// ---- eBPF as this user ----
static long bpf(int cmd, union bpf_attr *a) { return syscall(SYS_bpf, cmd, a, sizeof *a); }
static int ebpf(void) {
  union bpf_attr a;
  memset(&a, 0, sizeof a);
  a.map_type = BPF_MAP_TYPE_REUSEPORT_SOCKARRAY;
  a.key_size = 4; a.value_size = 8; a.max_entries = 256;
  long m = bpf(BPF_MAP_CREATE, &a);
  int e_map = m < 0 ? errno : 0;
  struct bpf_insn ins[] = {
      {.code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = 0, .imm = 1},  // r0 = SK_PASS
      {.code = BPF_JMP | BPF_EXIT},
  };
  char log[4096] = "";
  memset(&a, 0, sizeof a);
  a.prog_type = BPF_PROG_TYPE_SK_REUSEPORT;
  a.insns = (uintptr_t)ins; a.insn_cnt = 2;
  a.license = (uintptr_t) "Dual MIT/GPL";
  a.log_buf = (uintptr_t)log; a.log_size = sizeof log; a.log_level = 1;
  long p = bpf(BPF_PROG_LOAD, &a);
  int e_prog = p < 0 ? errno : 0;
  memset(&a, 0, sizeof a);
  a.prog_type = BPF_PROG_TYPE_SOCKET_FILTER;  // SO_ATTACH_REUSEPORT_EBPF takes this type too
  a.insns = (uintptr_t)ins; a.insn_cnt = 2;
  a.license = (uintptr_t) "Dual MIT/GPL";
  long f = bpf(BPF_PROG_LOAD, &a);
  int e_filt = f < 0 ? errno : 0;
  FILE *fp = fopen("/proc/sys/kernel/unprivileged_bpf_disabled", "r");
  int dis = -1;
  if (fp) { if (fscanf(fp, "%d", &dis) != 1) dis = -1; fclose(fp); }
  printf("{\"bench\":\"hostnic\",\"test\":\"ebpf\",\"uid\":%d,\"unprivileged_bpf_disabled\":%d,"
         "\"map_create_reuseport_sockarray\":\"%s\",\"prog_load_sk_reuseport\":\"%s\",\"prog_load_socket_filter\":\"%s\"}\n",
         getuid(), dis, e_map ? strerrorname_np(e_map) : "ok", e_prog ? strerrorname_np(e_prog) : "ok",
         e_filt ? strerrorname_np(e_filt) : "ok");
  return 0;
}

// ---- a second UID joining root's group ----
static int uidjoin(int port, int uid) {
  int s = udp(port, 1);
  if (s < 0) die("bind root");
  int pfd[2];
  if (pipe(pfd)) die("pipe");
  pid_t p = fork();
  if (!p) {
    if (setresgid(uid, uid, uid) || setresuid(uid, uid, uid)) die("setresuid");
    int e = udp(port, 1), e2;
    // and the same UID twice: its own second socket joins its own group elsewhere
    int o1 = udp(port + 1, 1), o2 = udp(port + 1, 1);
    e2 = (o1 >= 0 && o2 >= 0) ? 0 : (o2 < 0 ? -o2 : -o1);
    int v[2] = {e < 0 ? -e : 0, e2};
    if (write(pfd[1], v, sizeof v) < 0) {}
    _exit(0);
  }
  int v[2] = {-1, -1};
  if (read(pfd[0], v, sizeof v) < 0) {}
  waitpid(p, 0, 0);
  printf("{\"bench\":\"hostnic\",\"test\":\"uid_join\",\"group_owner_uid\":%d,\"joiner_uid\":%d,"
         "\"other_uid_bind\":\"%s\",\"same_uid_second_socket_bind\":\"%s\"}\n",
         getuid(), uid, v[0] ? strerrorname_np(v[0]) : "ok (joined!)", v[1] ? strerrorname_np(v[1]) : "ok");
  return 0;
}

// ---- process_vm_writev between two siblings of one UID ----
static int pvm(void) {
  int uid = getuid();
  char *buf = shared_map(4096);
  int pfd[2];
  if (pipe(pfd)) die("pipe");
  pid_t a = fork();
  if (!a) {
    static char target[64] = "untouched";
    uintptr_t ad = (uintptr_t)target;
    if (write(pfd[1], &ad, sizeof ad) < 0) {}
    for (int i = 0; i < 300 && strcmp(target, "written by a sibling"); i++) usleep(10000);
    strcpy(buf, target);
    _exit(0);
  }
  uintptr_t ad = 0;
  if (read(pfd[0], &ad, sizeof ad) < 0) {}
  pid_t b = fork();
  if (!b) {
    char msg[] = "written by a sibling";
    struct iovec l = {msg, sizeof msg}, r = {(void *)ad, sizeof msg};
    ssize_t n = process_vm_writev(a, &l, 1, &r, 1, 0);
    int e = n < 0 ? errno : 0;
    memcpy(buf + 2048, &e, sizeof e);
    _exit(0);
  }
  waitpid(b, 0, 0);
  waitpid(a, 0, 0);
  int e;
  memcpy(&e, buf + 2048, sizeof e);
  FILE *fp = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
  int scope = -1;
  if (fp) { if (fscanf(fp, "%d", &scope) != 1) scope = -1; fclose(fp); }
  printf("{\"bench\":\"hostnic\",\"test\":\"process_vm_writev\",\"uid\":%d,\"yama_ptrace_scope\":%s,"
         "\"result\":\"%s\",\"target_saw\":\"%s\"}\n",
         uid, scope < 0 ? "\"absent\"" : (char[8]){'0' + scope, 0}, e ? strerrorname_np(e) : "ok", buf);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, 0, _IOLBF, 0);
  if (argc >= 5 && (!strcmp(argv[1], "lat") || !strcmp(argv[1], "rate"))) {
    enum opt o = !strcmp(argv[2], "base") ? BASE : !strcmp(argv[2], "reuseport") ? REUSE : !strcmp(argv[2], "unix") ? UNIX : RING;
    return run_pair(!strcmp(argv[1], "lat"), o, atoi(argv[3]) ? 8 : 0, atoi(argv[4]));
  }
  if (argc >= 3 && !strcmp(argv[1], "death")) return death(atoi(argv[2]));
  if (argc >= 3 && !strcmp(argv[1], "cbpf")) return cbpf(atoi(argv[2]));
  if (argc >= 3 && !strcmp(argv[1], "mcast")) return mcast(atoi(argv[2]));
  if (argc >= 2 && !strcmp(argv[1], "ebpf")) return ebpf();
  if (argc >= 4 && !strcmp(argv[1], "uid")) return uidjoin(atoi(argv[2]), atoi(argv[3]));
  if (argc >= 2 && !strcmp(argv[1], "pvm")) return pvm();
  fprintf(stderr, "usage: see the head of steer.c\n");
  return 2;
}
