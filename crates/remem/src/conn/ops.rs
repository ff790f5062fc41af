//! One-sided operations on the peer's memory: RDMA WRITE and READ (with scatter/gather),
//! atomics, flush, atomic write, unsignaled writes, and batches.

use super::posting::PostOpts;
use super::{Connection, lock};
use crate::error::{Error, Result};
use crate::mr::{Local, LocalMut, RemoteMr, Span};
use crate::{FlushType, PeerConfig};
use remem_verbs::{AccessFlags, SendFlags, SendOp};

fn check_remote(local: usize, remote: &RemoteMr) -> Result<()> {
    if local as u64 != remote.len {
        return Err(Error::LengthMismatch {
            local: local as u64,
            remote: remote.len,
        });
    }
    if local > 1 << 31 {
        return Err(Error::InvalidArgument(format!(
            "{local} bytes exceed the 2^31-byte limit of one RDMA operation"
        )));
    }
    Ok(())
}

/// A one-sided operation on a peer's region.
#[derive(Clone, Copy)]
enum OneSided {
    Write,
    WriteImm(u32),
    Read,
}

impl OneSided {
    /// The work request's operation for `len` local bytes, once the lengths are checked.
    fn op(self, len: usize, remote: &RemoteMr) -> Result<SendOp> {
        check_remote(len, remote)?;
        let (remote_addr, rkey) = (remote.addr, remote.rkey);
        Ok(match self {
            OneSided::Write => SendOp::RdmaWrite { remote_addr, rkey },
            OneSided::WriteImm(imm) => SendOp::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            },
            OneSided::Read => SendOp::RdmaRead { remote_addr, rkey },
        })
    }
}

fn check_atomic(remote: &RemoteMr) -> Result<()> {
    if remote.len != 8 || !remote.addr.is_multiple_of(8) {
        return Err(Error::InvalidArgument(format!(
            "atomics act on 8 aligned bytes, not {} bytes at {:#x}",
            remote.len, remote.addr
        )));
    }
    Ok(())
}

impl Connection {
    /// Writes `src` into the peer's `dst` (RDMA WRITE); lengths must match.
    pub async fn write(&self, src: &impl Local, dst: &RemoteMr) -> Result<()> {
        self.one_sided(OneSided::Write, src.span(), dst).await
    }

    /// Writes `src` into the peer's `dst` and hands `imm` to the peer's
    /// [`Connection::receive_write_imm`] (RDMA WRITE_WITH_IMM).
    ///
    /// **Flow control.** Unlike [`Connection::write`], each WRITE_WITH_IMM uses one of the
    /// peer's receive buffers, so it takes a credit, as a message does: the writer waits
    /// (the future stays pending) once the peer holds as many immediates and messages not
    /// yet taken as it granted credits — its [`RdmaBuilder::recv_depth`](crate::RdmaBuilder::recv_depth),
    /// 32 by default, shared with [`Connection::send`]. A credit comes back when the peer's
    /// application takes an immediate ([`Connection::receive_write_imm`]) or a message; a
    /// peer that never takes them stalls its writers (it is not an error). The bytes are
    /// in the peer's region once the future returns; the immediate may be taken before or
    /// after that.
    pub async fn write_with_imm(&self, src: &impl Local, dst: &RemoteMr, imm: u32) -> Result<()> {
        self.one_sided(OneSided::WriteImm(imm), src.span(), dst)
            .await
    }

    /// Reads the peer's `src` into `dst` (RDMA READ); lengths must match.
    pub async fn read(&self, dst: &mut impl LocalMut, src: &RemoteMr) -> Result<()> {
        self.one_sided(OneSided::Read, dst.span(), src).await
    }

    /// Writes the concatenation of `srcs` into the peer's `dst` with one RDMA WRITE (a
    /// gather list); the total length must match.
    pub async fn write_gather(&self, srcs: &[&dyn Local], dst: &RemoteMr) -> Result<()> {
        let spans = srcs.iter().map(|s| s.span()).collect();
        self.one_sided_sg(OneSided::Write, spans, dst).await
    }

    /// Reads the peer's `src` into `dsts` one after the other with one RDMA READ (a
    /// scatter list); the total length must match.
    pub async fn read_scatter(&self, dsts: &mut [&mut dyn LocalMut], src: &RemoteMr) -> Result<()> {
        let spans = dsts.iter().map(|d| d.span()).collect();
        self.one_sided_sg(OneSided::Read, spans, src).await
    }

    async fn one_sided(&self, kind: OneSided, span: Span, remote: &RemoteMr) -> Result<()> {
        self.one_sided_sg(kind, vec![span], remote).await
    }

    async fn one_sided_sg(
        &self,
        kind: OneSided,
        spans: Vec<Span>,
        remote: &RemoteMr,
    ) -> Result<()> {
        let max = self.shared.qp.cap().max_send_sge as usize;
        if spans.is_empty() || spans.len() > max {
            return Err(Error::InvalidArgument(format!(
                "{} scatter/gather entries; this connection takes 1 to {max} (RdmaBuilder::qp_cap)",
                spans.len()
            )));
        }
        let total = spans.iter().map(|s| s.len).sum();
        let op = kind.op(total, remote)?;
        // WRITE_WITH_IMM consumes a receive at the peer: it needs a credit.
        let sh = &self.shared;
        let (credit, sq) = if matches!(kind, OneSided::WriteImm(_)) {
            let (credit, sq) = sh.credited_entry().await?;
            (Some(credit), sq)
        } else {
            (None, sh.entries(1).await?)
        };
        sh.execute(sq, op, spans, PostOpts::default(), credit)
            .await
            .map(drop)
    }

    async fn atomic(&self, op: SendOp) -> Result<u64> {
        let sh = &self.shared;
        let sq = sh.entries(1).await?;
        let span = sq.slot();
        sh.execute(sq, op, vec![span], PostOpts::default(), None)
            .await
    }

    /// Compares the peer's 8-byte word at `dst` with `compare` and, if equal, replaces it
    /// with `swap`; returns the value it held (ATOMIC CMP_AND_SWP).
    pub async fn compare_and_swap(&self, dst: &RemoteMr, compare: u64, swap: u64) -> Result<u64> {
        check_atomic(dst)?;
        self.atomic(SendOp::AtomicCmpAndSwp {
            remote_addr: dst.addr,
            rkey: dst.rkey,
            compare,
            swap,
        })
        .await
    }

    /// Adds `add` to the peer's 8-byte word at `dst`; returns the value it held (ATOMIC
    /// FETCH_AND_ADD).
    pub async fn fetch_and_add(&self, dst: &RemoteMr, add: u64) -> Result<u64> {
        check_atomic(dst)?;
        self.atomic(SendOp::AtomicFetchAndAdd {
            remote_addr: dst.addr,
            rkey: dst.rkey,
            add,
        })
        .await
    }

    /// Makes the writes this connection did to the peer's `dst` visible at the peer
    /// ([`FlushType::Visibility`]) or durable there ([`FlushType::Persistent`]), as
    /// librpma's `rpma_flush` does; returns once they are.
    ///
    /// With a device that does RoCEv2 FLUSH and a region registered for that placement
    /// ([`RemoteMr::supports_flush`]), one FLUSH request does it: the peer executes it after
    /// every earlier request of the connection, and for a persistent flush writes the
    /// range back to its file ([`crate::Rdma::register_file`]) before answering.
    /// Otherwise remem falls back to librpma's method: a small RDMA READ from `dst`, whose
    /// answer comes after the earlier writes were placed (needs REMOTE_READ on the
    /// region); for [`FlushType::Persistent`] that is only enough where the peer declared
    /// that its writes go straight to persistent memory ([`PeerConfig`],
    /// [`Connection::apply_peer_config`]), and is an [`Error::Unsupported`] otherwise.
    pub async fn flush(&self, dst: &RemoteMr, flush: FlushType) -> Result<()> {
        let sh = &self.shared;
        if dst.len > 1 << 31 {
            return Err(Error::InvalidArgument(format!(
                "{} bytes exceed the 2^31-byte limit of one FLUSH",
                dst.len
            )));
        }
        let native = match flush {
            FlushType::Visibility => sh.caps.flush_global,
            FlushType::Persistent => sh.caps.flush_persistent,
        };
        if native && dst.supports_flush(flush) {
            let op = SendOp::Flush {
                remote_addr: dst.addr,
                rkey: dst.rkey,
                len: dst.len as u32,
                flush_type: match flush {
                    FlushType::Visibility => remem_verbs::FlushType::Global,
                    FlushType::Persistent => remem_verbs::FlushType::Persistent,
                },
                level: remem_verbs::FlushLevel::Range,
            };
            let sq = sh.entries(1).await?;
            return sh
                .execute(sq, op, vec![], PostOpts::default(), None)
                .await
                .map(drop);
        }
        if flush == FlushType::Persistent && !lock(&sh.peer).cfg.direct_write_to_pmem {
            return Err(Error::Unsupported(
                "persistent flush: the region takes no FLUSH (or the device has none) and \
                 the peer did not declare direct writes to persistent memory"
                    .into(),
            ));
        }
        if !dst.access.contains(AccessFlags::REMOTE_READ) {
            return Err(Error::Unsupported(
                "flush without RoCEv2 FLUSH reads the region, which grants no REMOTE_READ".into(),
            ));
        }
        // The READ's answer leaves the peer after every earlier write was placed.
        let sq = sh.entries(1).await?;
        let len = dst.len.min(8) as usize;
        let span = Span { len, ..sq.slot() };
        let op = SendOp::RdmaRead {
            remote_addr: dst.addr,
            rkey: dst.rkey,
        };
        sh.execute(sq, op, vec![span], PostOpts::default(), None)
            .await
            .map(drop)
    }

    /// Writes `value` into the peer's 8-byte aligned word `dst` in one piece, after every
    /// earlier operation of this connection (librpma's `rpma_atomic_write`): a RoCEv2
    /// ATOMIC WRITE where the device has it, else an 8-byte RDMA WRITE with FENCE. The 8
    /// bytes land in this machine's byte order, as a `u64` stored here would.
    pub async fn atomic_write(&self, dst: &RemoteMr, value: u64) -> Result<()> {
        check_atomic(dst)?;
        let sh = &self.shared;
        let sq = sh.entries(1).await?;
        sq.set_word(value)?;
        let span = sq.slot();
        let (op, flags) = if sh.caps.atomic_write {
            let op = SendOp::AtomicWrite {
                remote_addr: dst.addr,
                rkey: dst.rkey,
            };
            (op, SendFlags::empty())
        } else {
            let op = SendOp::RdmaWrite {
                remote_addr: dst.addr,
                rkey: dst.rkey,
            };
            (op, SendFlags::FENCE)
        };
        let opts = PostOpts {
            flags,
            ..PostOpts::default()
        };
        sh.execute(sq, op, vec![span], opts, None).await.map(drop)
    }

    /// Posts an RDMA WRITE of `src` into `dst` that completes silently ("completion on
    /// error only", librpma's `RPMA_F_COMPLETION_ON_ERROR`): returns once it is posted.
    /// A later operation that completes (e.g. [`Connection::flush`]) means this one is done
    /// too; if it fails, the connection closes and later operations fail. Change `src`
    /// only after such a later completion: the NIC may still be reading it (a race on
    /// values, never undefined behaviour). Its memory stays registered until then.
    pub async fn post_write(&self, src: &impl Local, dst: &RemoteMr) -> Result<()> {
        let span = src.span();
        let op = OneSided::Write.op(span.len, dst)?;
        self.shared
            .post_unsignaled(op, vec![span], SendFlags::empty())
            .await
    }

    /// Applies what the peer declared about its memory (decoded from its
    /// [`PeerConfig::descriptor`]): decides how [`Connection::flush`] makes data
    /// persistent when the region takes no RoCEv2 FLUSH.
    pub fn apply_peer_config(&self, cfg: PeerConfig) {
        lock(&self.shared.peer).cfg = cfg;
    }
}

/// One-sided operations posted together ([`Connection::batch`]): RDMA WRITEs and READs,
/// checked as they are added, posted with one call when submitted, and complete together.
#[derive(Debug)]
pub struct Batch<'c, 'm> {
    conn: &'c Connection,
    ops: Vec<(SendOp, Span)>,
    _borrows: std::marker::PhantomData<&'m mut ()>,
}

impl<'c, 'm> Batch<'c, 'm> {
    pub(crate) fn new(conn: &'c Connection) -> Self {
        Batch {
            conn,
            ops: Vec::new(),
            _borrows: std::marker::PhantomData,
        }
    }

    /// Adds an RDMA WRITE of `src` into `dst` (lengths must match).
    pub fn write(&mut self, src: &'m impl Local, dst: &RemoteMr) -> Result<&mut Self> {
        self.add(OneSided::Write, src.span(), dst)
    }

    /// Adds an RDMA READ of `src` into `dst` (lengths must match).
    pub fn read(&mut self, dst: &'m mut impl LocalMut, src: &RemoteMr) -> Result<&mut Self> {
        self.add(OneSided::Read, dst.span(), src)
    }

    fn add(&mut self, kind: OneSided, span: Span, remote: &RemoteMr) -> Result<&mut Self> {
        let op = kind.op(span.len, remote)?;
        self.ops.push((op, span));
        Ok(self)
    }

    /// Operations in the batch.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Posts the batch and waits until every operation is done; the first error fails it
    /// (and, as for any RC error, the connection).
    pub async fn submit(self) -> Result<()> {
        self.conn.shared.execute_batch(self.ops).await
    }
}
