//! The host's NIC: one soft device per address and UDP port, shared by every process of
//! one user on the host (network namespace), as a kernel rxe device is shared by every
//! process. The design and its measured costs are in `docs/host-nic.md`.
//!
//! - **The data path has no extra hop.** Every member process binds its own UDP socket to
//!   the device's address and port with `SO_REUSEPORT`; the kernel groups them, and a
//!   classic BPF program attached to the group ([`steer::program`], no privilege needed)
//!   hands each datagram to the socket of the process that owns its destination: the top 8
//!   bits of a QP number, and of a communication ID, are its process's *slot*
//!   ([`steer`]).
//! - **The registry** is a directory of the user's own (`/dev/shm/remem-<uid>/…`, mode
//!   0700, keyed by network namespace, address and port): a `table` file ([`table`]: the
//!   members, their slots and group indexes, freed slots, listeners) changed only under
//!   `flock` of its `lock` file, a Unix datagram socket per member (`<slot>.sock`), and per
//!   member the CM connections a survivor must close for it (`<slot>.cm`).
//! - **What the kernel delivers to the wrong member** (while the program is being
//!   rewritten after a member came or went, a connection request, which goes by service
//!   ID) that member forwards to the owner over the owner's Unix socket ([`socket`]); a
//!   forwarded datagram is never forwarded again.
//! - **A member's death** (exit, crash, SIGKILL) is seen by every other member's watcher
//!   thread (a `pidfd` per member becomes readable); the first to take the lock removes it
//!   from the table, rewrites the program, frees its slot (its QP numbers rest: a freed
//!   slot is handed out again only after every never-used one, and then the one freed
//!   longest ago) and sends a DREQ for each of its CM connections, so its peers see a
//!   disconnect as with kernel rxe.
//! - **Isolation**: the kernel groups only sockets of one effective UID, and the registry
//!   is that user's (mode 0700, owner checked), so one user's processes share a device;
//!   another user's process cannot bind the same address and port at all.

#![forbid(unsafe_code)]

pub mod socket;
pub mod steer;
pub mod table;

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};
use table::Table;

/// The environment variable naming the directory the registries live under (default
/// `/dev/shm`, or the temporary directory where there is none).
pub const HOST_DIR_ENV: &str = "REMEM_HOST_DIR";

/// A CM connection a member has, which a survivor closes with a DREQ if it dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// The peer's address.
    pub peer: IpAddr,
    /// The member's communication ID.
    pub local_id: u32,
    /// The peer's communication ID.
    pub remote_id: u32,
    /// The peer's QP number.
    pub remote_qpn: u32,
}

impl Link {
    fn format(&self) -> String {
        format!(
            "{} {} {} {}\n",
            self.peer, self.local_id, self.remote_id, self.remote_qpn
        )
    }

    fn parse(line: &str) -> Option<Link> {
        let f: Vec<&str> = line.split_whitespace().collect();
        Some(Link {
            peer: f.first()?.parse().ok()?,
            local_id: f.get(1)?.parse().ok()?,
            remote_id: f.get(2)?.parse().ok()?,
            remote_qpn: f.get(3)?.parse().ok()?,
        })
    }
}

/// What the host's members count.
#[derive(Debug, Default)]
pub struct HostStats {
    /// Packets this member received for another member and forwarded to it.
    pub forwarded_out: AtomicU64,
    /// Packets another member forwarded to this one.
    pub forwarded_in: AtomicU64,
    /// Packets for a member this one could not forward to (gone, or its socket full).
    pub forward_failed: AtomicU64,
    /// Dead members this member removed.
    pub reaped: AtomicU64,
}

type OrphanHook = Box<dyn Fn() + Send + Sync>;

/// One process's membership of a shared device (see the module documentation).
pub struct Host {
    dir: PathBuf,
    slot: u8,
    local: SocketAddr,
    /// The table as last read.
    view: RwLock<Table>,
    /// A second descriptor of the member's UDP socket: programs are attached through it,
    /// and closing it (with the driver's) takes the socket out of the group.
    udp: Mutex<Option<UdpSocket>>,
    /// This member's Unix socket (forwarded datagrams in, forwards out).
    unix: UnixDatagram,
    /// Connections of dead members this one must close (DREQs), taken by the device's CM.
    orphans: Mutex<Vec<Link>>,
    hook: Mutex<Option<OrphanHook>>,
    /// The links last published (not written again when unchanged).
    published: Mutex<Vec<Link>>,
    /// Counters.
    pub stats: HostStats,
    left: AtomicBool,
    watcher: Mutex<Option<Watcher>>,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("dir", &self.dir)
            .field("slot", &self.slot)
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A process's start time (`/proc/<pid>/stat` field 22) and whether it still runs (not a
/// zombie); `None` when there is no such process.
fn proc_start(pid: u32) -> Option<(u64, bool)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from its end.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let running = !matches!(f.first(), Some(&"Z") | Some(&"X"));
    Some((f.get(19)?.parse().ok()?, running))
}

/// Whether member `m` is alive: this process, or a running process with its start time.
/// Without `/proc` every member counts as alive.
fn alive(m: &table::Member) -> bool {
    if m.pid == std::process::id() {
        return true;
    }
    if proc_start(std::process::id()).is_none() {
        return true;
    }
    matches!(proc_start(m.pid), Some((start, true)) if start == m.start)
}

/// The registry directory of the device at `addr`, created (mode 0700) if needed; refused
/// when the user's directory is not the user's alone.
pub fn registry_dir(addr: SocketAddr) -> io::Result<PathBuf> {
    let base = match std::env::var_os(HOST_DIR_ENV) {
        Some(d) => PathBuf::from(d),
        None if Path::new("/dev/shm").is_dir() => PathBuf::from("/dev/shm"),
        None => std::env::temp_dir(),
    };
    let uid = rustix::process::geteuid().as_raw();
    let user = base.join(format!("remem-{uid}"));
    let _ = std::fs::DirBuilder::new().mode(0o700).create(&user);
    let meta = std::fs::metadata(&user)?;
    if meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is not this user's alone (owner {}, mode {:o}): the host NIC's registry \
                 must be",
                user.display(),
                meta.uid(),
                meta.mode() & 0o777
            ),
        ));
    }
    let netns = std::fs::metadata("/proc/self/ns/net").map_or(0, |m| m.ino());
    let dir = user.join(format!("net{netns}")).join(format!(
        "{}-{}",
        addr.ip().to_canonical(),
        addr.port()
    ));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)?;
    Ok(dir)
}

/// The registry's lock, held while the table is read, changed and written.
struct Locked {
    _lock: std::fs::File,
    dir: PathBuf,
    table: Table,
}

impl Locked {
    fn take(dir: &Path) -> io::Result<Locked> {
        let path = dir.join("lock");
        let lock = loop {
            // The last member to leave removes the registry: a lock taken on a file that
            // was removed meanwhile is no lock; take the new one.
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
            let lock = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)?;
            rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)?;
            let held = lock.metadata()?.ino();
            if std::fs::metadata(&path).is_ok_and(|m| m.ino() == held) {
                break lock;
            }
        };
        let table = Table::parse(&std::fs::read_to_string(dir.join("table")).unwrap_or_default());
        Ok(Locked {
            _lock: lock,
            dir: dir.to_owned(),
            table,
        })
    }

    /// Writes the table (a new file renamed over the old: readers see one or the other)
    /// and rings every member's bell (its watcher reloads the table).
    fn save(&self) -> io::Result<()> {
        self.write()?;
        if let Ok(ringer) = UnixDatagram::unbound() {
            let _ = ringer.set_nonblocking(true);
            for m in &self.table.members {
                let _ = ringer.send_to(b"t", self.dir.join(format!("{}.bell", m.slot)));
            }
        }
        Ok(())
    }

    /// Writes the table without ringing: for changes only a connection request looks at
    /// (who listens), which reads the table itself ([`socket::HostSocket`]); a listen then
    /// wakes no other process.
    fn write(&self) -> io::Result<()> {
        let tmp = self.dir.join(format!("table.{}", std::process::id()));
        std::fs::write(&tmp, self.table.format())?;
        std::fs::rename(tmp, self.dir.join("table"))
    }

    /// Removes the members that are not alive; returns how many, and their connections.
    fn reap(&mut self) -> (usize, Vec<Link>) {
        let dead: Vec<u8> = (self.table.members.iter())
            .filter(|m| !alive(m))
            .map(|m| m.slot)
            .collect();
        let mut links = Vec::new();
        let n = dead.len();
        for slot in dead {
            self.table.leave(slot, now_ms());
            let cm = self.dir.join(format!("{slot}.cm"));
            if let Ok(text) = std::fs::read_to_string(&cm) {
                links.extend(text.lines().filter_map(Link::parse));
            }
            let _ = std::fs::remove_file(cm);
            let _ = std::fs::remove_file(self.dir.join(format!("{slot}.sock")));
            let _ = std::fs::remove_file(self.dir.join(format!("{slot}.bell")));
        }
        (n, links)
    }
}

/// How many other registries one join looks at, at most.
const SWEEP_MAX: usize = 64;

/// Removes the registries under the user's directory `user` (other than `keep`) whose
/// members are all dead: a process that exits without leaving (the drop-in keeps its
/// devices open to the end) leaves its registry behind, and the last one on an address
/// has no survivor to remove it. A registry whose lock is held is in use and left alone.
fn sweep(user: &Path, keep: &Path) {
    let dirs = (std::fs::read_dir(user).into_iter().flatten().flatten())
        .filter(|net| net.file_name().to_string_lossy().starts_with("net"))
        .flat_map(|net| {
            std::fs::read_dir(net.path())
                .into_iter()
                .flatten()
                .flatten()
        })
        .map(|d| d.path())
        .filter(|d| d != keep)
        .take(SWEEP_MAX);
    for dir in dirs {
        let Ok(lock) = std::fs::File::open(dir.join("lock")) else {
            continue;
        };
        let nb = rustix::fs::FlockOperation::NonBlockingLockExclusive;
        if rustix::fs::flock(&lock, nb).is_err() {
            continue;
        }
        let held = lock.metadata().map(|m| m.ino()).ok();
        if std::fs::metadata(dir.join("lock")).map(|m| m.ino()).ok() != held {
            continue;
        }
        let table = Table::parse(&std::fs::read_to_string(dir.join("table")).unwrap_or_default());
        if table.members.iter().any(alive) {
            continue;
        }
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let _ = std::fs::remove_file(e.path());
        }
        let _ = std::fs::remove_dir(&dir);
        if let Some(net) = dir.parent() {
            let _ = std::fs::remove_dir(net);
        }
    }
}

/// A UDP socket bound to `addr` with `SO_REUSEPORT`.
fn reuseport_socket(addr: SocketAddr) -> io::Result<UdpSocket> {
    use rustix::net::{AddressFamily, SocketType, sockopt};
    let family = if addr.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    let fd: OwnedFd = rustix::net::socket_with(
        family,
        SocketType::DGRAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )?;
    sockopt::set_socket_reuseport(&fd, true)?;
    rustix::net::bind(&fd, &addr)?;
    Ok(UdpSocket::from(fd))
}

impl Host {
    /// Joins the shared device at `addr` (port 0 is not shareable: the caller binds its
    /// own): takes a slot, binds a UDP socket into the group, attaches the steering
    /// program. Returns the membership and the socket the driver uses. Dead members found
    /// on the way are removed (their connections wait in [`Host::take_orphans`]).
    pub fn join(addr: SocketAddr) -> io::Result<(Arc<Host>, UdpSocket)> {
        let dir = registry_dir(addr)?;
        if let Some(user) = dir.parent().and_then(Path::parent) {
            sweep(user, &dir);
        }
        let mut locked = Locked::take(&dir)?;
        let (_, orphans) = locked.reap();
        let slot = locked.table.pick_slot().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{addr}: all 254 slots of the host NIC are held"),
            )
        })?;
        let socket = reuseport_socket(addr).map_err(|e| {
            if e.kind() == io::ErrorKind::AddrInUse {
                io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "{addr} is taken by a socket that does not share it (another \
                         user's, or a program that is not remem's)"
                    ),
                )
            } else {
                e
            }
        })?;
        let local = socket.local_addr()?;
        let path = dir.join(format!("{slot}.sock"));
        let _ = std::fs::remove_file(&path);
        let unix = UnixDatagram::bind(&path)?;
        unix.set_nonblocking(true)?;
        let bell_path = dir.join(format!("{slot}.bell"));
        let _ = std::fs::remove_file(&bell_path);
        let bell = UnixDatagram::bind(&bell_path)?;
        bell.set_nonblocking(true)?;
        let _ = std::fs::remove_file(dir.join(format!("{slot}.cm")));
        let start = proc_start(std::process::id()).map_or(0, |s| s.0);
        locked.table.join(slot, std::process::id(), start);
        // The program first: if the kernel refuses it, the table never lists this member
        // (its socket closes with the error, and the group is as it was).
        crate::io::sys::attach_reuseport_cbpf(&socket, &steer::program(&locked.table.layout()))?;
        locked.save()?;
        let view = locked.table.clone();
        drop(locked);
        let host = Arc::new(Host {
            dir,
            slot,
            local,
            view: RwLock::new(view),
            udp: Mutex::new(Some(socket.try_clone()?)),
            unix,
            orphans: Mutex::new(orphans),
            hook: Mutex::new(None),
            published: Mutex::new(Vec::new()),
            stats: HostStats::default(),
            left: AtomicBool::new(false),
            watcher: Mutex::new(None),
        });
        let watcher = Watcher::start(&host, bell)?;
        *host.watcher.lock().unwrap_or_else(|p| p.into_inner()) = Some(watcher);
        tracing::debug!(%local, slot, dir = %host.dir.display(), "joined the host NIC");
        Ok((host, socket))
    }

    /// This member's slot.
    pub fn slot(&self) -> u8 {
        self.slot
    }

    /// How many processes hold the device (the table read now).
    pub fn members(&self) -> usize {
        self.reload();
        self.view
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .members
            .len()
    }

    /// The table as last read.
    pub fn table(&self) -> Table {
        self.view.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Registers or withdraws this member as the listener of service `sid` (connection
    /// requests for it are steered here). Refused with `AddrInUse` when another member
    /// listens on it.
    pub fn listen(&self, sid: u64, on: bool) -> io::Result<()> {
        let mut locked = Locked::take(&self.dir)?;
        let listens = &mut locked.table.listens;
        if on {
            if listens.iter().any(|l| l.1 == sid && l.0 != self.slot) {
                return Err(io::Error::from(io::ErrorKind::AddrInUse));
            }
            if !listens.contains(&(self.slot, sid)) {
                listens.push((self.slot, sid));
            }
        } else {
            listens.retain(|l| *l != (self.slot, sid));
        }
        locked.write()?;
        *self.view.write().unwrap_or_else(|p| p.into_inner()) = locked.table.clone();
        Ok(())
    }

    /// Publishes this member's CM connections (what a survivor closes if it dies); written
    /// only when they changed.
    pub fn publish(&self, links: &[Link]) {
        let mut last = self.published.lock().unwrap_or_else(|p| p.into_inner());
        if last.as_slice() == links {
            return;
        }
        let text: String = links.iter().map(Link::format).collect();
        let path = self.dir.join(format!("{}.cm", self.slot));
        let tmp = self.dir.join(format!("{}.cm.tmp", self.slot));
        if std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .is_ok()
        {
            *last = links.to_vec();
        }
    }

    /// Takes the connections of dead members this one is to close.
    pub fn take_orphans(&self) -> Vec<Link> {
        std::mem::take(&mut *self.orphans.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Sets what is called when orphans wait (the device wakes its CM).
    pub fn on_orphans(&self, hook: OrphanHook) {
        *self.hook.lock().unwrap_or_else(|p| p.into_inner()) = Some(hook);
        self.notify_orphans();
    }

    fn notify_orphans(&self) {
        let waiting = !self
            .orphans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty();
        if waiting && let Some(h) = &*self.hook.lock().unwrap_or_else(|p| p.into_inner()) {
            h();
        }
    }

    /// Where a member's Unix socket is.
    fn sock_path(&self, slot: u8) -> PathBuf {
        self.dir.join(format!("{slot}.sock"))
    }

    /// Reloads the table (after another member changed it).
    fn reload(&self) {
        let t = Table::parse(&std::fs::read_to_string(self.dir.join("table")).unwrap_or_default());
        *self.view.write().unwrap_or_else(|p| p.into_inner()) = t;
    }

    /// Removes dead members (under the lock), rewrites the program, and queues their
    /// connections for DREQs.
    fn reap(&self) -> io::Result<()> {
        let mut locked = Locked::take(&self.dir)?;
        let (dead, links) = locked.reap();
        if dead > 0 {
            self.stats.reaped.fetch_add(dead as u64, Ordering::Relaxed);
            locked.save()?;
            if let Some(udp) = &*self.udp.lock().unwrap_or_else(|p| p.into_inner()) {
                crate::io::sys::attach_reuseport_cbpf(
                    udp,
                    &steer::program(&locked.table.layout()),
                )?;
            }
        }
        *self.view.write().unwrap_or_else(|p| p.into_inner()) = locked.table.clone();
        drop(locked);
        if !links.is_empty() {
            tracing::debug!(n = links.len(), "closing the connections of a dead member");
            self.orphans
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(links);
            self.notify_orphans();
        }
        Ok(())
    }

    /// Leaves the device: out of the table, the program rewritten for the others, this
    /// member's socket closed (the driver's descriptor must be closed already). Idempotent.
    pub fn leave(&self) {
        if self.left.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(w) = self
            .watcher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            w.stop();
        }
        let Ok(mut locked) = Locked::take(&self.dir) else {
            return;
        };
        locked.table.leave(self.slot, now_ms());
        let udp = self.udp.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(udp) = &udp {
            let _ =
                crate::io::sys::attach_reuseport_cbpf(udp, &steer::program(&locked.table.layout()));
        }
        // Closed under the lock: the kernel moves the last socket into this one's index
        // as the table says.
        drop(udp);
        let _ = std::fs::remove_file(self.sock_path(self.slot));
        let _ = std::fs::remove_file(self.dir.join(format!("{}.bell", self.slot)));
        let _ = std::fs::remove_file(self.dir.join(format!("{}.cm", self.slot)));
        if locked.table.members.is_empty() {
            // The last member: the registry goes (its freed slots rest with no one to
            // reach; a newcomer starts a new group, with a new program).
            let _ = std::fs::remove_file(self.dir.join("table"));
            let _ = std::fs::remove_file(self.dir.join("lock"));
            let _ = std::fs::remove_dir(&self.dir);
        } else {
            let _ = locked.save();
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.leave();
    }
}

/// The thread that watches the other members (a `pidfd` each) and the table (its bell, a
/// Unix socket every change of the table rings: not inotify, whose descriptor takes the
/// kernel up to most of a second to close — a dying member's pidfd becomes readable only
/// once all its descriptors are closed).
struct Watcher {
    stop: Arc<OwnedFd>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watcher {
    fn start(host: &Arc<Host>, bell: UnixDatagram) -> io::Result<Watcher> {
        use rustix::event::{EventfdFlags, eventfd};
        let stop = Arc::new(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?);
        let weak = Arc::downgrade(host);
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("remem-host".into())
            .spawn(move || watch(weak, OwnedFd::from(bell), stop2))?;
        Ok(Watcher {
            stop,
            thread: Some(thread),
        })
    }

    fn stop(mut self) {
        let _ = rustix::io::write(&*self.stop, &1u64.to_ne_bytes());
        if let Some(t) = self.thread.take()
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
    }
}

/// How often a watcher without pidfds (a kernel before 5.3, a seccomp profile that
/// refuses `pidfd_open`) looks whether a member died.
const DEATH_POLL: std::time::Duration = std::time::Duration::from_millis(250);

fn watch(host: std::sync::Weak<Host>, bell: OwnedFd, stop: Arc<OwnedFd>) {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let mut pidfds: Vec<(u32, OwnedFd)> = Vec::new();
    // Whether some member could not be watched by pidfd: then the watcher looks every
    // `DEATH_POLL`.
    let mut blind = false;
    let refresh = |h: &Host, pidfds: &mut Vec<(u32, OwnedFd)>, blind: &mut bool| {
        let table = h.table();
        let me = std::process::id();
        pidfds.retain(|(pid, _)| table.members.iter().any(|m| m.pid == *pid));
        *blind = false;
        for m in &table.members {
            if m.pid != me && !pidfds.iter().any(|(p, _)| *p == m.pid) {
                let Some(pid) = rustix::process::Pid::from_raw(m.pid as i32) else {
                    continue;
                };
                match rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) {
                    Ok(fd) => pidfds.push((m.pid, fd)),
                    // Gone already: reap now.
                    Err(rustix::io::Errno::SRCH) => {
                        let _ = h.reap();
                    }
                    Err(_) => *blind = true,
                }
            }
        }
    };
    if let Some(h) = host.upgrade() {
        refresh(&h, &mut pidfds, &mut blind);
    }
    let mut buf = [0u8; 4096];
    let tick = Timespec {
        tv_sec: 0,
        tv_nsec: DEATH_POLL.as_nanos() as i64,
    };
    loop {
        let (stopped, changed, died) = {
            let mut fds = vec![
                PollFd::new(&*stop, PollFlags::IN),
                PollFd::new(&bell, PollFlags::IN),
            ];
            fds.extend(pidfds.iter().map(|(_, fd)| PollFd::new(fd, PollFlags::IN)));
            let n = match poll(&mut fds, blind.then_some(&tick)) {
                Ok(n) => n,
                Err(_) => continue,
            };
            let ready = |i: usize| !fds[i].revents().is_empty();
            (
                ready(0),
                ready(1),
                (2..fds.len()).any(ready) || (blind && n == 0),
            )
        };
        if stopped {
            return;
        }
        let Some(h) = host.upgrade() else {
            return;
        };
        if changed {
            while rustix::io::read(&bell, &mut buf).is_ok_and(|n| n > 0) {}
            h.reload();
        }
        if died {
            let _ = h.reap();
        }
        if changed || died {
            refresh(&h, &mut pidfds, &mut blind);
        }
    }
}

#[cfg(test)]
mod tests;
