//! The host's shared device (`remem_soft::io::host`): several devices opened on one
//! address and UDP port are members of one device, in this process and in others; each
//! packet reaches the member that owns its QP or CM connection, and a member's death is
//! told to its peers.

use remem_conformance::{CASES, Pair, run_pair};
use remem_soft::SoftContext;
use remem_verbs::Context;
use std::net::SocketAddr;
use std::sync::Arc;

/// An address of this test process's own (`127.0.6.x`, by pid) at port 4791, the port
/// every RoCEv2 device uses.
fn host_addr(n: u8) -> SocketAddr {
    let x = (std::process::id() % 250) as u8 + 1;
    SocketAddr::from(([127, 6 + n, x, 1], 4791))
}

fn counter(ctx: &dyn Context, name: &str) -> u64 {
    ctx.counters()
        .iter()
        .find(|c| c.name == name)
        .map_or_else(|| panic!("no counter {name}"), |c| c.value)
}

#[test]
fn two_members_of_one_device_pass_every_conformance_case() {
    let addr = host_addr(0);
    let a = SoftContext::bind(addr).expect("first member");
    let b = SoftContext::bind(addr).expect("second member: the device is shared");
    assert_eq!(a.local_addr(), b.local_addr());
    assert_eq!(counter(&b, "host_members"), 2);
    let (a, b): (Arc<dyn Context>, Arc<dyn Context>) = (Arc::new(a), Arc::new(b));
    let pair = Pair::new(a.clone(), b.clone());
    let failed: Vec<String> = CASES
        .iter()
        .filter_map(|c| run_pair(c, &pair).err().map(|e| format!("{}: {e}", c.name)))
        .collect();
    assert!(
        failed.is_empty(),
        "{} failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
    // The kernel steered the data: what was forwarded is the connection requests (which
    // go by service, a hash away from their listener half the time), not the data packets
    // (with the kernel's hash alone, half of everything would be).
    let forwarded = counter(&*a, "host_forwarded_out") + counter(&*b, "host_forwarded_out");
    let data = counter(&*a, "rcvd_pkts") + counter(&*b, "rcvd_pkts");
    println!("{forwarded} of {data} packets forwarded");
    assert!(
        data > 100 && forwarded * 10 < data,
        "{forwarded} of {data} forwarded"
    );
}

#[test]
fn members_number_their_qps_and_keys_by_their_slots() {
    use remem_conformance::{QpOptions, endpoint};
    let addr = host_addr(1);
    let ctxs: Vec<Arc<dyn Context>> = (0..2)
        .map(|_| Arc::new(SoftContext::bind(addr).unwrap()) as Arc<dyn Context>)
        .collect();
    let mut slots = Vec::new();
    for ctx in &ctxs {
        let eps: Vec<_> = (0..4)
            .map(|_| endpoint(ctx, &QpOptions::default(), remem_verbs::QpType::Rc, None).unwrap())
            .collect();
        let qp_slots: Vec<u32> = eps.iter().map(|e| e.qp.qp_num() >> 16).collect();
        let (_, mr) = eps[0]
            .reg(
                64,
                remem_verbs::AccessFlags::LOCAL_WRITE | remem_verbs::AccessFlags::REMOTE_WRITE,
            )
            .unwrap();
        assert!(qp_slots.iter().all(|s| *s == qp_slots[0]), "{qp_slots:?}");
        assert_eq!(mr.rkey() >> 24, qp_slots[0], "keys carry the slot too");
        assert_eq!(mr.lkey() >> 24, qp_slots[0]);
        // The low 16 bits are not a counter.
        let low: Vec<u32> = eps.iter().map(|e| e.qp.qp_num() & 0xffff).collect();
        assert!(low.windows(2).any(|w| w[1].abs_diff(w[0]) > 16), "{low:?}");
        slots.push(qp_slots[0]);
    }
    assert_ne!(slots[0], slots[1], "each member has a slot of its own");
}

/// The environment variable that makes `child_member` run (the address to join and the
/// port of the parent's listener).
const CHILD_ENV: &str = "REMEM_HOST_CHILD";

/// A member in another process: joins the device at the address `REMEM_HOST_CHILD` names,
/// connects to the parent's listener on it, says `connected <qpn>` on stdout and waits to
/// be killed (or for stdin to close).
#[test]
#[ignore = "runs in the child process of a_killed_members_peers_are_disconnected"]
fn child_member() {
    use remem_conformance::{QpOptions, endpoint};
    use remem_verbs::cm::{CmEventKind, ConnParam, PortSpace};
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        eprintln!("child_member only runs as the child of a_killed_members_peers_are_disconnected");
        return;
    };
    let server: SocketAddr = spec.parse().unwrap();
    let ctx: Arc<dyn Context> =
        Arc::new(SoftContext::bind(SocketAddr::new(server.ip(), 4791)).unwrap());
    let (ch, id) = super::cm::resolved(&ctx, PortSpace::Tcp, server);
    let ep = endpoint(&ctx, &QpOptions::default(), remem_verbs::QpType::Rc, None).unwrap();
    id.set_qp(Some(ep.qp.clone())).unwrap();
    id.connect(&ConnParam::default()).unwrap();
    super::cm::expect(&ch, CmEventKind::Established);
    println!("connected {}", ep.qp.qp_num());
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

#[test]
fn a_killed_members_peers_are_disconnected() {
    use remem_conformance::{QpOptions, endpoint};
    use remem_verbs::cm::{CmEventKind, ConnParam, PortSpace};
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let addr = host_addr(2);
    let ctx: Arc<dyn Context> = Arc::new(SoftContext::bind(addr).unwrap());
    let (sch, _lid) = super::cm::listener(&ctx, PortSpace::Tcp, 7000);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "host::child_member", "--ignored", "--nocapture"])
        .env(CHILD_ENV, SocketAddr::new(addr.ip(), 7000).to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // The child's request reaches this process's listener on the shared device.
    let req = super::cm::expect(&sch, CmEventKind::ConnectRequest);
    let sep = endpoint(&ctx, &QpOptions::default(), remem_verbs::QpType::Rc, None).unwrap();
    req.id.set_qp(Some(sep.qp.clone())).unwrap();
    req.id.accept(&ConnParam::default()).unwrap();
    super::cm::expect(&sch, CmEventKind::Established);
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let said = loop {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "the child ended");
        if line.starts_with("connected ") {
            break line;
        }
    };
    let child_qpn: u32 = said.trim()["connected ".len()..].parse().unwrap();
    assert_ne!(
        child_qpn >> 16,
        sep.qp.qp_num() >> 16,
        "two members, two slots"
    );
    assert_eq!(counter(&*ctx, "host_members"), 2);
    // SIGKILL: nothing of the child runs any more; this process's watcher sees it go and
    // sends the DREQ the child's NIC would have sent.
    let killed = Instant::now();
    child.kill().unwrap();
    let ev = super::cm::next_event(&sch, Duration::from_secs(10));
    let took = killed.elapsed();
    let _ = child.wait();
    let ev = ev.expect("no event within 10 s of the kill");
    assert_eq!(ev.kind, CmEventKind::Disconnected, "{ev:?}");
    println!("the killed member's peer was disconnected {took:?} after the kill");
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_eq!(counter(&*ctx, "host_members"), 1);
    assert!(counter(&*ctx, "host_reaped") >= 1);
}

/// The environment variable that makes `child_join` run: the address to try.
const JOIN_ENV: &str = "REMEM_HOST_JOIN";

/// Tries to open a device at the address `REMEM_HOST_JOIN` names; says `joined` or
/// `refused: <error>`.
#[test]
#[ignore = "runs in the child process of another_users_process_cannot_join"]
fn child_join() {
    let Ok(addr) = std::env::var(JOIN_ENV) else {
        eprintln!("child_join only runs as the child of another_users_process_cannot_join");
        return;
    };
    match SoftContext::bind(addr.parse().unwrap()) {
        Ok(_) => println!("joined"),
        Err(e) => println!("refused: {e}"),
    }
}

/// The kernel groups only one user's sockets: another user's process cannot bind the
/// device's address and port, and is told why.
#[test]
fn another_users_process_cannot_join() {
    use std::process::Command;
    if !rustix::process::geteuid().is_root() {
        println!("skipped: running a child as another user needs root");
        return;
    }
    let addr = host_addr(3);
    let _ctx = SoftContext::bind(addr).unwrap();
    let exe = std::env::current_exe().unwrap();
    let as_nobody = |what: &str| {
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&exe)
            .args(["--exact", "host::child_join", "--ignored", "--nocapture"])
            .env(JOIN_ENV, what)
            .output();
        match out {
            Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
            Err(e) => format!("skipped: setpriv: {e}"),
        }
    };
    let said = as_nobody(&addr.to_string());
    if said.contains("skipped") || said.contains("Permission denied") {
        println!("skipped: cannot run this test binary as nobody: {said}");
        return;
    }
    println!("another user's process was told: {}", said.trim());
    assert!(
        said.contains("refused:") && said.contains("another user's"),
        "{said}"
    );
    // The same user (nobody) on another address is a member of its own device.
    let free = SocketAddr::new(host_addr(4).ip(), 4791);
    assert!(as_nobody(&free.to_string()).contains("joined"));
}
