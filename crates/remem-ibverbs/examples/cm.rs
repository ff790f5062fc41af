//! RDMA CM connection setup with remem's rdma-core provider, speaking what librdmacm's
//! example programs speak (`cargo xtask rxe conformance` runs it against them on kernel
//! Soft-RoCE):
//!
//! ```text
//! cm server [<addr:port>]          like rdma_server: accept one connection (default
//!                                  0.0.0.0:7471), receive 16 bytes, send 16 back
//! cm client <addr:port> [--rdma]   like rdma_client: connect, send 16 bytes, receive 16
//! ```
//!
//! With `--rdma` the client also asks (in the request's private data) for the server's
//! buffer, which a remem server gives in its reply's private data: the client then WRITEs
//! a pattern there and READs it back. Exit status 0 on success.

use remem_ibverbs::IbverbsProvider;
use remem_ibverbs::cm::{CmConnector, CmListener, CmOptions};
use remem_verbs::{
    AccessFlags, CompletionQueue, Context, MemRegion, MemoryBuffer, MemoryRegion, ProtectionDomain,
    Provider, QpCap, QpInitAttr, QpType, QueuePair, RecvWr, SendFlags, SendOp, SendWr, Sge,
    WcStatus, WorkCompletion,
};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Private data a remem client sends to ask for the server's buffer.
const ASK: &[u8; 4] = b"RMCM";
/// The message size of rdma_server / rdma_client.
const MSG: usize = 16;
/// The buffer: a receive slot, a send slot, then the RDMA area.
const RDMA_AT: usize = 64;
const RDMA_LEN: usize = 4096;
const WAIT: Duration = Duration::from_secs(30);

struct Res {
    _ctx: Arc<dyn Context>,
    _pd: Arc<dyn ProtectionDomain>,
    cq: Arc<dyn CompletionQueue>,
    qp: Arc<dyn QueuePair>,
    buf: Arc<MemoryBuffer>,
    mr: Arc<dyn MemoryRegion>,
}

impl Res {
    fn new(device: &str) -> Result<Res, String> {
        let ctx = IbverbsProvider::new()
            .open(device)
            .map_err(|e| format!("opening {device}: {e}"))?;
        let pd = ctx.alloc_pd().map_err(|e| format!("alloc_pd: {e}"))?;
        let cq = ctx
            .create_cq(16, None)
            .map_err(|e| format!("create_cq: {e}"))?;
        let qp = pd
            .create_qp(&QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: cq.clone(),
                recv_cq: cq.clone(),
                srq: None,
                cap: QpCap {
                    max_send_wr: 4,
                    max_recv_wr: 4,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: true,
            })
            .map_err(|e| format!("create_qp: {e}"))?;
        let buf =
            Arc::new(MemoryBuffer::zeroed(RDMA_AT + RDMA_LEN).map_err(|e| format!("buffer: {e}"))?);
        let mr = pd
            .reg_mr(
                MemRegion::whole(buf.clone()),
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            )
            .map_err(|e| format!("reg_mr: {e}"))?;
        Ok(Res {
            _ctx: ctx,
            _pd: pd,
            cq,
            qp,
            buf,
            mr,
        })
    }

    fn sge(&self, at: usize, len: usize) -> Sge {
        Sge {
            addr: self.mr.addr() + at as u64,
            length: len as u32,
            lkey: self.mr.lkey(),
        }
    }

    fn post_recv(&self) -> Result<(), String> {
        let sge = [self.sge(0, MSG)];
        self.qp
            .post_recv(&[RecvWr {
                wr_id: 1,
                sg_list: &sge,
            }])
            .map_err(|e| format!("post_recv: {}", e.error))
    }

    fn post(&self, wr_id: u64, op: SendOp, at: usize, len: usize) -> Result<(), String> {
        let sge = [self.sge(at, len)];
        let mut wr = SendWr::new(wr_id, op, &sge);
        wr.flags = SendFlags::SIGNALED;
        self.qp
            .post_send(&[wr])
            .map_err(|e| format!("post_send: {}", e.error))
    }

    /// Waits for the completion of `wr_id`.
    fn wait(&self, wr_id: u64) -> Result<WorkCompletion, String> {
        let deadline = Instant::now() + WAIT;
        let mut wc = [WorkCompletion::default(); 1];
        loop {
            if self.cq.poll(&mut wc).map_err(|e| format!("poll: {e}"))? == 1 {
                if wc[0].status != WcStatus::Success {
                    return Err(format!(
                        "work request {} failed: {:?}",
                        wc[0].wr_id, wc[0].status
                    ));
                }
                if wc[0].wr_id == wr_id {
                    return Ok(wc[0]);
                }
            } else if Instant::now() > deadline {
                return Err(format!("no completion of work request {wr_id}"));
            }
        }
    }
}

fn server(addr: SocketAddr) -> Result<(), String> {
    let listener = CmListener::bind(addr).map_err(|e| format!("listen on {addr}: {e}"))?;
    println!("cm server: listening on {addr}");
    let req = listener
        .get_request(Duration::from_secs(120))
        .map_err(|e| e.to_string())?;
    println!("cm server: a request on {}", req.device());
    let res = Res::new(req.device())?;
    req.init_qp(&res.qp).map_err(|e| format!("init_qp: {e}"))?;
    res.post_recv()?;
    let mut opts = CmOptions::default();
    if req.private_data().starts_with(ASK) {
        // A remem client: give it the RDMA area.
        let mut reply = ASK.to_vec();
        reply.extend_from_slice(&(res.mr.addr() + RDMA_AT as u64).to_be_bytes());
        reply.extend_from_slice(&res.mr.rkey().to_be_bytes());
        opts.private_data = reply;
    }
    let conn = req
        .accept(&res.qp, &opts)
        .map_err(|e| format!("accept: {e}"))?;
    println!("cm server: connected");
    let wc = res.wait(1)?;
    if wc.byte_len as usize != MSG {
        return Err(format!("received {} bytes, not {MSG}", wc.byte_len));
    }
    res.buf
        .write(MSG, b"remem cm server\0")
        .map_err(|e| e.to_string())?;
    res.post(2, SendOp::Send, MSG, MSG)?;
    res.wait(2)?;
    println!("cm server: received {MSG} bytes, sent {MSG}");
    // The client disconnects when it has its answer (rdma_client does too).
    if !conn.wait_disconnected(WAIT).map_err(|e| e.to_string())? {
        println!("cm server: the client did not disconnect; disconnecting");
    }
    Ok(())
}

fn client(addr: SocketAddr, rdma: bool) -> Result<(), String> {
    let connector =
        CmConnector::resolve(addr, Duration::from_secs(10)).map_err(|e| format!("{addr}: {e}"))?;
    println!("cm client: {addr} resolved to {}", connector.device());
    let res = Res::new(connector.device())?;
    connector
        .init_qp(&res.qp)
        .map_err(|e| format!("init_qp: {e}"))?;
    res.post_recv()?;
    let mut opts = CmOptions::default();
    if rdma {
        opts.private_data = ASK.to_vec();
    }
    let conn = connector
        .connect(&res.qp, &opts)
        .map_err(|e| format!("connect: {e}"))?;
    println!("cm client: connected");
    if rdma {
        let p = conn.private_data();
        if p.len() < 16 || &p[..4] != ASK {
            return Err("the server sent no buffer in its reply".into());
        }
        let remote_addr = u64::from_be_bytes(p[4..12].try_into().unwrap_or_default());
        let rkey = u32::from_be_bytes(p[12..16].try_into().unwrap_or_default());
        let pattern: Vec<u8> = (0..RDMA_LEN).map(|i| (i * 7 + 3) as u8).collect();
        res.buf
            .write(RDMA_AT, &pattern)
            .map_err(|e| e.to_string())?;
        res.post(
            3,
            SendOp::RdmaWrite { remote_addr, rkey },
            RDMA_AT,
            RDMA_LEN,
        )?;
        res.wait(3)?;
        res.buf
            .write(RDMA_AT, &vec![0u8; RDMA_LEN])
            .map_err(|e| e.to_string())?;
        res.post(4, SendOp::RdmaRead { remote_addr, rkey }, RDMA_AT, RDMA_LEN)?;
        res.wait(4)?;
        let mut back = vec![0u8; RDMA_LEN];
        res.buf
            .read(RDMA_AT, &mut back)
            .map_err(|e| e.to_string())?;
        if back != pattern {
            return Err("RDMA READ did not return what RDMA WRITE wrote".into());
        }
        println!("cm client: {RDMA_LEN} bytes written and read back over the connection");
    }
    res.buf
        .write(MSG, b"remem cm client\0")
        .map_err(|e| e.to_string())?;
    res.post(2, SendOp::Send, MSG, MSG)?;
    res.wait(2)?;
    let wc = res.wait(1)?;
    if wc.byte_len as usize != MSG {
        return Err(format!("received {} bytes, not {MSG}", wc.byte_len));
    }
    println!("cm client: sent {MSG} bytes, received {MSG}");
    conn.disconnect().map_err(|e| e.to_string())?;
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let parse = |a: &str| a.parse::<SocketAddr>().map_err(|e| format!("{a}: {e}"));
    let result = match args.as_slice() {
        ["server"] => server(SocketAddr::from(([0, 0, 0, 0], 7471))),
        ["server", addr] => parse(addr).and_then(server),
        ["client", addr] => parse(addr).and_then(|a| client(a, false)),
        ["client", addr, "--rdma"] => parse(addr).and_then(|a| client(a, true)),
        _ => {
            eprintln!("usage: cm server [<addr:port>] | cm client <addr:port> [--rdma]");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cm: {e}");
            ExitCode::FAILURE
        }
    }
}
