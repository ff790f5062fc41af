//! Addresses: `rdma_bind_addr`, `rdma_resolve_addr`, `rdma_resolve_route`, `rdma_listen`,
//! the ports. The entry points are in `crate::ffi::rdmacm`.

#![forbid(unsafe_code)]

use super::*;

/// Binds `addr` on the devices it covers (one provider id per device; the first picks
/// the port when `addr`'s is 0, the others take the same).
pub(crate) fn bind(id: &Arc<IdShared>, addr: SocketAddr) -> Result<(), c_int> {
    if !id.state().cm.is_empty() {
        return Err(libc::EINVAL);
    }
    let devs = devices::for_bind(addr.ip())?;
    let wildcard = addr.ip().is_unspecified();
    let mut made: Vec<(Arc<CmDev>, Arc<dyn CmId>)> = Vec::new();
    let mut port = addr.port();
    for d in &devs {
        let cm = d.create_cm_id(id.ps)?;
        router::routes().insert(cm.handle(), Arc::downgrade(id));
        let r = cm.bind(SocketAddr::new(addr.ip(), port));
        made.push((Arc::clone(d), Arc::clone(&cm)));
        if let Err(e) = r {
            let mut routes = router::routes();
            for (_, c) in &made {
                routes.remove(&c.handle());
            }
            return Err(errno_of(&e));
        }
        if port == 0 {
            port = cm.local_addr().map_or(0, |a| a.port());
        }
    }
    let first = Arc::clone(&made[0].1);
    {
        let mut st = id.state();
        if !wildcard {
            attach_dev(id, &mut st, &made[0].0, first.port_num())?;
        }
        st.cm = made;
    }
    let local = first
        .local_addr()
        .unwrap_or_else(|| SocketAddr::new(addr.ip(), port));
    id.handle().set_src(local);
    Ok(())
}

/// A duration of `ms` milliseconds (a negative value counts as 0).
pub(crate) fn millis(ms: c_int) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// `rdma_resolve_addr` once the FFI layer has its addresses: gives the id the device that
/// reaches `dst` (or has `src`), and starts the resolution.
pub(crate) fn resolve_addr(
    id: &Arc<IdShared>,
    src: Option<SocketAddr>,
    dst: SocketAddr,
    timeout: Duration,
) -> Result<(), c_int> {
    let cm = {
        // Lock order: the routes, then the id.
        let mut routes = router::routes();
        let mut st = id.state();
        if st.dev.is_none() {
            let dev = if !st.cm.is_empty() {
                // Bound to the wildcard: keep the device that reaches `dst`.
                let dev = devices::for_dst(dst.ip())?;
                let (keep, gone): (Vec<_>, Vec<_>) = std::mem::take(&mut st.cm)
                    .into_iter()
                    .partition(|(d, _)| Arc::ptr_eq(d, &dev));
                for (_, c) in &gone {
                    routes.remove(&c.handle());
                }
                if keep.is_empty() {
                    return Err(libc::EADDRNOTAVAIL);
                }
                st.cm = keep;
                dev
            } else {
                match src.filter(|s| !s.ip().is_unspecified()) {
                    Some(s) => devices::for_src(s.ip())?,
                    None => devices::for_dst(dst.ip())?,
                }
            };
            if st.cm.is_empty() {
                let cm = dev.create_cm_id(id.ps)?;
                routes.insert(cm.handle(), Arc::downgrade(id));
                st.cm.push((Arc::clone(&dev), cm));
            }
            let port = st.cm[0].1.port_num();
            attach_dev(id, &mut st, &dev, port)?;
        }
        match st.cm.as_slice() {
            [(_, c)] => Arc::clone(c),
            _ => return Err(libc::EINVAL),
        }
    };
    id.handle().set_dst(dst);
    cm.resolve_addr(src, dst, timeout).map_err(|e| errno_of(&e))
}

/// `rdma_resolve_route` once the FFI layer has the id: resolves the route to the resolved
/// address (synchronous ids wait). -1/EINVAL before the address is resolved.
pub(crate) fn resolve_route(s: &Arc<IdShared>, timeout_ms: c_int) -> c_int {
    let r = s.cm().and_then(|(_, cm)| {
        cm.resolve_route(millis(timeout_ms))
            .map_err(|e| errno_of(&e))
    });
    match r {
        Ok(()) => complete(s),
        Err(e) => fail(e),
    }
}

/// `rdma_listen` once the FFI layer has the id: listens on the bound address (unbound:
/// every device, a free port). A backlog of 0 or less, or above 1024, is 1024 (as the
/// kernel's rdma_ucm).
pub(crate) fn listen(s: &Arc<IdShared>, backlog: c_int) -> c_int {
    if s.state().cm.is_empty() {
        let any: SocketAddr = (std::net::Ipv4Addr::UNSPECIFIED, 0).into();
        if let Err(e) = bind(s, any) {
            return fail(e);
        }
    }
    let backlog = u32::try_from(backlog)
        .ok()
        .filter(|b| (1..=MAX_BACKLOG).contains(b))
        .unwrap_or(MAX_BACKLOG);
    let cms: Vec<_> = s.state().cm.iter().map(|(_, c)| Arc::clone(c)).collect();
    for c in &cms {
        if let Err(e) = c.listen(backlog) {
            return fail(errno_of(&e));
        }
    }
    if let Some(a) = cms.first().and_then(|c| c.local_addr()) {
        s.handle().set_src(a);
        notify(&format!("listening {a}"));
    }
    0
}

/// The environment variable naming a file (typically a FIFO) that hears of every
/// listener: one line `listening IP:PORT` per successful `rdma_listen`, and of every
/// multicast receiver: one line `joined GROUP` per MULTICAST_JOIN event taken whose QP was
/// attached to the group. Scripts and tests start a client once the server listens or
/// receives (a CM service or a multicast group has no socket to watch).
pub const NOTIFY_ENV: &str = "REMEM_RDMACM_NOTIFY";

/// Writes a line to `$REMEM_RDMACM_NOTIFY`, if set (failures are ignored: no reader on a
/// FIFO, a path that cannot be opened).
pub(super) fn notify(line: &str) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let Some(path) = std::env::var_os(NOTIFY_ENV) else {
        return;
    };
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .append(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        let _ = f.write_all(format!("{line}\n").as_bytes());
    }
}
