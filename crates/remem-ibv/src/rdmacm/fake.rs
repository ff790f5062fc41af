//! A fake CM provider for the unit tests: two devices (real soft devices, for the verbs,
//! on 127.77.0.1 and 127.77.0.2) whose CM ids connect to each other inside the process,
//! following the flows of `remem_verbs::cm` (a REQ is a `ConnectRequest` at the
//! listener, accept gives `Established` on both sides, reject `Rejected` 28 with private
//! data, no listener `Rejected` 8, disconnect `Disconnected` on both sides, a dropped
//! unanswered request is rejected, SIDR in the UDP port space).

#![forbid(unsafe_code)]

use super::devices::{CmContext, Source};
use core::ffi::c_int;
use remem_verbs::cm::*;
use remem_verbs::{
    AccessFlags, AhAttr, Context, Error, Gid, QpAttr, QpAttrMask, QpState, QueuePair, Result,
};
use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// The fake devices' addresses.
pub(crate) const IPS: [&str; 2] = ["127.77.0.1", "127.77.0.2"];

/// Installs the fake devices as the CM's device source.
pub(crate) fn install() {
    super::devices::install(|| Box::new(Fake::default()));
}

#[derive(Default)]
struct Fake {
    opened: Mutex<HashMap<usize, CmContext>>,
}

fn ip(i: usize) -> IpAddr {
    IPS[i].parse().unwrap()
}

impl Source for Fake {
    fn addrs(&self) -> std::result::Result<Vec<Vec<IpAddr>>, c_int> {
        Ok((0..IPS.len()).map(|i| vec![ip(i)]).collect())
    }

    fn open(&self, index: usize) -> std::result::Result<CmContext, c_int> {
        let mut opened = self.opened.lock().unwrap();
        if let Some(c) = opened.get(&index) {
            return Ok(*c);
        }
        let dev: Arc<dyn Context> = Arc::new(
            remem_soft::SoftContext::bind_with(
                SocketAddr::new(ip(index), 0),
                &remem_soft::SoftOptions::default(),
            )
            .map_err(|e| e.errno())?,
        );
        let ctx = CmContext::create(dev);
        opened.insert(index, ctx);
        Ok(ctx)
    }

    fn create_cm_channel(&self, _dev: &Arc<dyn Context>) -> Result<Arc<dyn CmChannel>> {
        Ok(FakeChannel::new())
    }

    fn create_cm_id(
        &self,
        dev: &Arc<dyn Context>,
        channel: &Arc<dyn CmChannel>,
        ps: PortSpace,
    ) -> Result<Arc<dyn CmId>> {
        let ch = (Arc::clone(channel) as Arc<dyn std::any::Any + Send + Sync>)
            .downcast::<FakeChannel>()
            .map_err(|_| Error::InvalidArgument("not a fake channel".into()))?;
        let dev_ip = remem_verbs::first_roce_v2_ipv4(&dev.gid_table(1)?)
            .map(|e| e.gid.to_ip())
            .ok_or_else(|| Error::InvalidArgument("no GID".into()))?;
        Ok(FakeId::new(Arc::clone(dev), dev_ip, ch, ps))
    }
}

// ----- the channel ------------------------------------------------------------------------

pub(crate) struct FakeChannel {
    queue: Mutex<VecDeque<CmEvent>>,
    rx: UnixStream,
    tx: UnixStream,
}

impl FakeChannel {
    fn new() -> Arc<FakeChannel> {
        let (rx, tx) = UnixStream::pair().unwrap();
        rx.set_nonblocking(true).unwrap();
        Arc::new(FakeChannel {
            queue: Mutex::new(VecDeque::new()),
            rx,
            tx,
        })
    }

    fn push(&self, ev: CmEvent) {
        let mut q = self.queue.lock().unwrap();
        if q.is_empty() {
            (&self.tx).write_all(&[1]).unwrap();
        }
        q.push_back(ev);
    }
}

impl CmChannel for FakeChannel {
    fn fd(&self) -> BorrowedFd<'_> {
        self.rx.as_fd()
    }

    fn get_event(&self) -> Option<CmEvent> {
        let mut q = self.queue.lock().unwrap();
        let ev = q.pop_front();
        if ev.is_some() && q.is_empty() {
            let mut b = [0u8; 1];
            let _ = (&self.rx).read(&mut b);
        }
        ev
    }
}

// ----- ids --------------------------------------------------------------------------------

/// Bindings: (port space, port) → the ids bound there.
static BINDS: Mutex<Vec<(PortSpace, SocketAddr, Weak<FakeId>)>> = Mutex::new(Vec::new());
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);
static NEXT_PORT: AtomicU64 = AtomicU64::new(41000);

struct FakeId {
    handle: u64,
    ps: PortSpace,
    dev: Arc<dyn Context>,
    ip: IpAddr,
    channel: Arc<FakeChannel>,
    me: Weak<FakeId>,
    st: Mutex<St>,
}

#[derive(Default)]
struct St {
    local: Option<SocketAddr>,
    peer_addr: Option<SocketAddr>,
    listening: bool,
    peer: Option<Weak<FakeId>>,
    connected: bool,
    /// A passive id whose request is not answered yet.
    unanswered: bool,
    qp: Option<Arc<dyn QueuePair>>,
}

fn errno_err(e: i32) -> Error {
    Error::Io(std::io::Error::from_raw_os_error(e))
}

impl FakeId {
    fn new(
        dev: Arc<dyn Context>,
        ip: IpAddr,
        channel: Arc<FakeChannel>,
        ps: PortSpace,
    ) -> Arc<FakeId> {
        Arc::new_cyclic(|me| FakeId {
            handle: NEXT_HANDLE.fetch_add(1, Ordering::Relaxed),
            ps,
            dev,
            ip,
            channel,
            me: me.clone(),
            st: Mutex::new(St::default()),
        })
    }

    fn arc(&self) -> Arc<dyn CmId> {
        self.me.upgrade().unwrap()
    }

    fn event(&self, kind: CmEventKind, status: i32, data: &[u8], param: CmEventParam) {
        self.channel.push(CmEvent {
            kind,
            id: self.arc(),
            listen_id: None,
            status,
            private_data: data.to_vec(),
            param,
        });
    }

    fn peer(&self) -> Option<Arc<FakeId>> {
        self.st
            .lock()
            .unwrap()
            .peer
            .as_ref()
            .and_then(Weak::upgrade)
    }

    fn peer_param(p: &ConnParam, qp_num: u32) -> PeerConnParam {
        PeerConnParam {
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            flow_control: p.flow_control,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq,
            qp_num,
        }
    }

    fn qp_num(&self, p: &ConnParam) -> u32 {
        self.st
            .lock()
            .unwrap()
            .qp
            .as_ref()
            .map_or(p.qp_num, |q| q.qp_num())
    }
}

impl Drop for FakeId {
    fn drop(&mut self) {
        BINDS
            .lock()
            .unwrap()
            .retain(|(_, _, w)| w.strong_count() > 0);
        let st = self.st.get_mut().unwrap();
        if let Some(peer) = st.peer.as_ref().and_then(Weak::upgrade) {
            if st.connected {
                peer.st.lock().unwrap().connected = false;
                peer.channel.push(CmEvent {
                    kind: CmEventKind::Disconnected,
                    id: peer.arc(),
                    listen_id: None,
                    status: 0,
                    private_data: Vec::new(),
                    param: CmEventParam::None,
                });
            } else if st.unanswered {
                peer.channel.push(CmEvent {
                    kind: CmEventKind::Rejected,
                    id: peer.arc(),
                    listen_id: None,
                    status: REJ_CONSUMER_DEFINED,
                    private_data: Vec::new(),
                    param: CmEventParam::None,
                });
            }
        }
    }
}

impl CmId for FakeId {
    fn handle(&self) -> u64 {
        self.handle
    }

    fn port_space(&self) -> PortSpace {
        self.ps
    }

    fn context(&self) -> Arc<dyn Context> {
        Arc::clone(&self.dev)
    }

    fn bind(&self, addr: SocketAddr) -> Result<()> {
        if !addr.ip().is_unspecified() && addr.ip() != self.ip {
            return Err(errno_err(libc::EADDRNOTAVAIL));
        }
        let mut binds = BINDS.lock().unwrap();
        binds.retain(|(_, _, w)| w.strong_count() > 0);
        let port = if addr.port() == 0 {
            NEXT_PORT.fetch_add(1, Ordering::Relaxed) as u16
        } else {
            addr.port()
        };
        let taken = binds.iter().any(|(ps, a, w)| {
            *ps == self.ps && a.port() == port && w.upgrade().is_some_and(|o| o.ip == self.ip)
        });
        if taken {
            return Err(errno_err(libc::EADDRINUSE));
        }
        let local = SocketAddr::new(addr.ip(), port);
        binds.push((self.ps, local, self.me.clone()));
        self.st.lock().unwrap().local = Some(local);
        Ok(())
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        self.st.lock().unwrap().local
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        self.st.lock().unwrap().peer_addr
    }

    fn listen(&self, backlog: u32) -> Result<()> {
        assert!(backlog > 0);
        if self.local_addr().is_none() {
            self.bind(SocketAddr::new(self.ip, 0))?;
        }
        self.st.lock().unwrap().listening = true;
        Ok(())
    }

    fn resolve_addr(&self, src: Option<SocketAddr>, dst: SocketAddr, _t: Duration) -> Result<()> {
        if self.local_addr().is_none() {
            self.bind(SocketAddr::new(src.map_or(self.ip, |s| s.ip()), 0))?;
        }
        {
            let mut st = self.st.lock().unwrap();
            st.peer_addr = Some(dst);
            if let Some(l) = st.local
                && l.ip().is_unspecified()
            {
                st.local = Some(SocketAddr::new(self.ip, l.port()));
            }
        }
        self.event(CmEventKind::AddrResolved, 0, &[], CmEventParam::None);
        Ok(())
    }

    fn resolve_route(&self, _t: Duration) -> Result<()> {
        if self.peer_addr().is_none() {
            return Err(Error::InvalidArgument("no address".into()));
        }
        self.event(CmEventKind::RouteResolved, 0, &[], CmEventParam::None);
        Ok(())
    }

    fn set_qp(&self, qp: Option<Arc<dyn QueuePair>>) -> Result<()> {
        self.st.lock().unwrap().qp = qp;
        Ok(())
    }

    fn qp(&self) -> Option<Arc<dyn QueuePair>> {
        self.st.lock().unwrap().qp.clone()
    }

    fn init_qp_attr(&self, state: QpState) -> Result<(QpAttr, QpAttrMask)> {
        match state {
            QpState::Init => {
                let mut a = QpAttr {
                    qp_state: QpState::Init,
                    pkey_index: 0,
                    port_num: 1,
                    ..QpAttr::default()
                };
                let mut m = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
                if self.ps.qp_type() == remem_verbs::QpType::Ud {
                    a.qkey = RDMA_UDP_QKEY;
                    m |= QpAttrMask::QKEY;
                } else {
                    a.qp_access_flags = AccessFlags::LOCAL_WRITE
                        | AccessFlags::REMOTE_READ
                        | AccessFlags::REMOTE_WRITE;
                    m |= QpAttrMask::ACCESS_FLAGS;
                }
                Ok((a, m))
            }
            _ => Err(Error::InvalidArgument("not connected".into())),
        }
    }

    fn connect(&self, param: &ConnParam) -> Result<()> {
        let limit = if self.ps == PortSpace::Udp {
            PrivateDataLimit::SIDR_REQ
        } else {
            PrivateDataLimit::REQ
        };
        check_private_data(param.private_data.len(), limit, "REQ")?;
        let dst = self
            .peer_addr()
            .ok_or_else(|| Error::InvalidArgument("no route".into()))?;
        let listener = BINDS.lock().unwrap().iter().find_map(|(ps, a, w)| {
            let l = w.upgrade()?;
            (*ps == self.ps
                && a.port() == dst.port()
                && l.ip == dst.ip()
                && l.st.lock().unwrap().listening)
                .then_some(l)
        });
        let Some(listener) = listener else {
            self.event(
                CmEventKind::Rejected,
                REJ_INVALID_SERVICE_ID,
                &[],
                CmEventParam::None,
            );
            return Ok(());
        };
        let child = FakeId::new(
            Arc::clone(&listener.dev),
            listener.ip,
            Arc::clone(&listener.channel),
            self.ps,
        );
        {
            let mut c = child.st.lock().unwrap();
            c.local = Some(dst);
            c.peer_addr = self.local_addr();
            c.peer = Some(self.me.clone());
            c.unanswered = true;
        }
        self.st.lock().unwrap().peer = Some(Arc::downgrade(&child));
        let qp_num = self.qp_num(param);
        let prm = if self.ps == PortSpace::Udp {
            CmEventParam::None
        } else {
            CmEventParam::Conn(Self::peer_param(param, qp_num))
        };
        listener.channel.push(CmEvent {
            kind: CmEventKind::ConnectRequest,
            id: child.arc(),
            listen_id: Some(listener.arc()),
            status: 0,
            private_data: param.private_data.clone(),
            param: prm,
        });
        Ok(())
    }

    fn accept(&self, param: &ConnParam) -> Result<()> {
        let peer = self
            .peer()
            .ok_or_else(|| Error::InvalidArgument("no request".into()))?;
        let qp_num = self.qp_num(param);
        {
            let mut st = self.st.lock().unwrap();
            st.unanswered = false;
            st.connected = self.ps != PortSpace::Udp;
        }
        if self.ps == PortSpace::Udp {
            let ud = UdParam {
                qp_num,
                qkey: RDMA_UDP_QKEY,
                ah_attr: AhAttr {
                    dgid: Gid::from(self.ip),
                    is_global: true,
                    hop_limit: 64,
                    sgid_index: 1,
                    port_num: 1,
                    ..AhAttr::default()
                },
            };
            peer.event(
                CmEventKind::Established,
                0,
                &param.private_data,
                CmEventParam::Ud(ud),
            );
            return Ok(());
        }
        peer.st.lock().unwrap().connected = true;
        // This side's event first: the peer may disconnect as soon as it has its own.
        self.event(CmEventKind::Established, 0, &[], CmEventParam::None);
        peer.event(
            CmEventKind::Established,
            0,
            &param.private_data,
            CmEventParam::Conn(Self::peer_param(param, qp_num)),
        );
        Ok(())
    }

    fn reject(&self, private_data: &[u8]) -> Result<()> {
        check_private_data(private_data.len(), PrivateDataLimit::REJ, "REJ")?;
        let peer = self
            .peer()
            .ok_or_else(|| Error::InvalidArgument("no request".into()))?;
        self.st.lock().unwrap().unanswered = false;
        peer.event(
            CmEventKind::Rejected,
            REJ_CONSUMER_DEFINED,
            private_data,
            CmEventParam::None,
        );
        Ok(())
    }

    fn disconnect(&self) -> Result<()> {
        let peer = {
            let mut st = self.st.lock().unwrap();
            if !st.connected {
                return Err(Error::InvalidArgument("not connected".into()));
            }
            st.connected = false;
            st.peer.as_ref().and_then(Weak::upgrade)
        };
        self.event(CmEventKind::Disconnected, 0, &[], CmEventParam::None);
        if let Some(p) = peer {
            p.st.lock().unwrap().connected = false;
            p.event(CmEventKind::Disconnected, 0, &[], CmEventParam::None);
        }
        Ok(())
    }

    fn establish(&self) -> Result<()> {
        let peer = self
            .peer()
            .ok_or_else(|| Error::InvalidArgument("no peer".into()))?;
        peer.event(CmEventKind::Established, 0, &[], CmEventParam::None);
        Ok(())
    }
}
