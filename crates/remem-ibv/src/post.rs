//! Posting: the `post_send`, `post_recv`, `post_srq_recv` slots of `ibv_context_ops`
//! (verbs.h's inline `ibv_post_send`, `ibv_post_recv`, `ibv_post_srq_recv`), and the
//! send machinery the `ibv_wr_*` API ([`crate::qp_ex`]) shares.
//!
//! **Send.** Work requests are read from the program's list into a per-QP `Pending`
//! batch (work request, opcode, flags, the scatter/gather entries, inline bytes), whose
//! vectors keep their capacity: posting allocates nothing once they have grown. The batch
//! goes to remem's QP 16 at a time (`flush`). The first work request refused, by this
//! library (opcode, flags, SGE count, inline size, UD address handle: EINVAL, or
//! EOPNOTSUPP for opcodes remem does not implement) or by remem (ENOMEM: send queue full;
//! EINVAL: a QP state that takes no sends, an lkey that names no region of the QP's PD, an
//! SGE outside its region), is `bad_wr`; those before it are posted, as rdma-core
//! documents.
//!
//! **Inline data** (`IBV_SEND_INLINE`, `ibv_wr_set_inline_data*`) lies in program memory
//! that need not be registered: it is copied into a bounce region of `max_inline_data`
//! bytes registered on the QP's PD when the QP was created, and that region is posted
//! INLINE (remem's QP copies inline data when it is posted, so the region is free again
//! when the post returns). The region has at least 8 bytes: `ibv_wr_atomic_write`'s value
//! travels the same way.
//!
//! **Receive.** Each work request's scatter list is copied to the stack and posted at once.

#![allow(unsafe_code)]

use crate::abi::*;
use crate::ffi::guard_int;
use crate::ffi::handles::qp_from;
use crate::ffi::handles::srq_from;
use crate::qp::QpInner;
use core::ffi::c_int;
use remem_verbs::{
    AccessFlags, MemRegion, MemoryBuffer, MemoryRegion, PostError, ProtectionDomain, QpCap, QpType,
    RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest,
};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

symver!();

/// The bytes of an ATOMIC WRITE's value.
const ATOMIC_WRITE_LEN: usize = 8;
/// Work requests handed to remem's QP per call.
const SEND_BATCH: usize = 16;
/// The most scatter/gather entries one work request can have (the soft device's
/// `max_sge`); receives copy their list to a stack array of this size.
pub(crate) const MAX_SGE: usize = 32;

/// One work request waiting in a [`Pending`] batch.
#[derive(Debug)]
pub(crate) struct PendingWr {
    pub wr_id: u64,
    pub op: SendOp,
    pub flags: SendFlags,
    pub ud: Option<UdDest>,
    /// Its entries in [`Pending::sges`].
    pub sges: (u32, u32),
    /// Its inline bytes in [`Pending::inline`] (start, length), if inline.
    pub inline: Option<(u32, u32)>,
    /// The program's `ibv_send_wr` (address), for `bad_wr`.
    pub tag: usize,
}

/// A batch of send work requests being built; the vectors keep their capacity.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    pub wrs: Vec<PendingWr>,
    pub sges: Vec<Sge>,
    pub inline: Vec<u8>,
}

impl Pending {
    /// Empties the batch (keeping the capacity).
    pub fn clear(&mut self) {
        self.wrs.clear();
        self.sges.clear();
        self.inline.clear();
    }
}

/// The registered bounce region of a QP's inline sends.
struct Bounce {
    buf: Arc<MemoryBuffer>,
    mr: Arc<dyn MemoryRegion>,
}

/// The send side of a QP: the bounce region and the batches of the two posting APIs.
pub(crate) struct SendPath {
    bounce: Option<Mutex<Bounce>>,
    /// `ibv_post_send`'s batch.
    old: Mutex<Pending>,
    /// The `ibv_wr_*` batch and the first error recorded since `ibv_wr_start`.
    pub ex: Mutex<ExBatch>,
    /// Held from `ibv_wr_start` to `ibv_wr_complete`/`ibv_wr_abort` (the per-QP critical
    /// region the man page promises).
    pub ex_busy: AtomicBool,
}

/// The `ibv_wr_*` batch.
#[derive(Debug, Default)]
pub(crate) struct ExBatch {
    pub pending: Pending,
    /// The errno of the first failed builder or setter (0: none).
    pub err: c_int,
}

impl std::fmt::Debug for SendPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendPath")
            .field("bounce", &self.bounce.is_some())
            .finish_non_exhaustive()
    }
}

impl SendPath {
    /// The send side of a QP with `cap`, its bounce region registered on `pd`.
    pub fn new(pd: &Arc<dyn ProtectionDomain>, cap: &QpCap) -> Result<Self, c_int> {
        // At least 8 bytes: the value of an `ibv_wr_atomic_write` travels inline too,
        // whatever `max_inline_data` is.
        let bounce = if cap.max_inline_data > 0 || cap.max_send_wr > 0 {
            let size = (cap.max_inline_data as usize).max(ATOMIC_WRITE_LEN);
            let buf = Arc::new(MemoryBuffer::zeroed(size).map_err(|_| libc::ENOMEM)?);
            let mr = pd
                .reg_mr(MemRegion::whole(Arc::clone(&buf)), AccessFlags::empty())
                .map_err(|e| e.errno())?;
            Some(Mutex::new(Bounce { buf, mr }))
        } else {
            None
        };
        Ok(SendPath {
            bounce,
            old: Mutex::new(Pending::default()),
            ex: Mutex::new(ExBatch::default()),
            ex_busy: AtomicBool::new(false),
        })
    }
}

/// The remem operation of an `ibv_send_wr`; EINVAL for an unknown opcode (or a bad bind,
/// [`crate::mw::bind_op`]), EOPNOTSUPP for one remem does not implement (TSO, driver
/// opcodes).
///
/// # Safety
///
/// `w` is the program's work request (its unions are read as the opcode says).
unsafe fn send_op(w: &ibv_send_wr) -> Result<SendOp, c_int> {
    // SAFETY: each union member is read for the opcode that uses it; all members are
    // plain integers (any bit pattern is valid).
    unsafe {
        let rdma = w.wr.rdma;
        let atomic = w.wr.atomic;
        let imm = u32::from_be(w.u_imm_data.imm_data);
        Ok(match w.opcode {
            IBV_WR_RDMA_WRITE => SendOp::RdmaWrite {
                remote_addr: rdma.remote_addr,
                rkey: rdma.rkey,
            },
            IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::RdmaWriteWithImm {
                remote_addr: rdma.remote_addr,
                rkey: rdma.rkey,
                imm,
            },
            IBV_WR_SEND => SendOp::Send,
            IBV_WR_SEND_WITH_IMM => SendOp::SendWithImm { imm },
            IBV_WR_RDMA_READ => SendOp::RdmaRead {
                remote_addr: rdma.remote_addr,
                rkey: rdma.rkey,
            },
            IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::AtomicCmpAndSwp {
                remote_addr: atomic.remote_addr,
                rkey: atomic.rkey,
                compare: atomic.compare_add,
                swap: atomic.swap,
            },
            IBV_WR_ATOMIC_FETCH_AND_ADD => SendOp::AtomicFetchAndAdd {
                remote_addr: atomic.remote_addr,
                rkey: atomic.rkey,
                add: atomic.compare_add,
            },
            IBV_WR_SEND_WITH_INV => SendOp::SendWithInv {
                rkey: w.u_imm_data.invalidate_rkey,
            },
            IBV_WR_ATOMIC_WRITE => SendOp::AtomicWrite {
                remote_addr: rdma.remote_addr,
                rkey: rdma.rkey,
            },
            IBV_WR_LOCAL_INV => SendOp::LocalInv {
                rkey: w.u_imm_data.invalidate_rkey,
            },
            IBV_WR_BIND_MW => {
                // The program's window and region (NULL or live), as the contract says.
                let b = w.u_bind_mw.bind_mw;
                crate::mw::bind_op(b.mw, b.rkey, &b.bind_info)?
            }
            IBV_WR_TSO | IBV_WR_DRIVER1 => {
                return Err(libc::EOPNOTSUPP);
            }
            _ => return Err(libc::EINVAL),
        })
    }
}

/// The send flags of a work request; EINVAL for bits verbs does not define.
/// `IBV_SEND_IP_CSUM` (checksum offload of raw packet QPs) means nothing here and is
/// ignored.
pub(crate) fn send_flags(bits: u32) -> Result<SendFlags, c_int> {
    let known = IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_INLINE;
    if bits & !(known | IBV_SEND_IP_CSUM) != 0 {
        return Err(libc::EINVAL);
    }
    Ok(SendFlags::from_bits_truncate(bits & known))
}

/// The UD destination of an address handle; EINVAL for NULL.
///
/// # Safety
///
/// `ah` is NULL or a live address handle of this library.
pub(crate) unsafe fn ud_dest(
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) -> Result<UdDest, c_int> {
    // SAFETY: by the contract.
    let a = unsafe { crate::ah::ah_from(ah) }.ok_or(libc::EINVAL)?;
    Ok(UdDest {
        ah: Arc::clone(&a.ah),
        remote_qpn,
        remote_qkey,
    })
}

/// Appends the program's bytes at `addr` (`len` of them) to the inline buffer.
///
/// # Safety
///
/// `addr..addr + len` is readable program memory (what verbs requires of inline data).
pub(crate) unsafe fn copy_inline(p: &mut Pending, addr: u64, len: usize) -> Result<(), c_int> {
    if len == 0 {
        return Ok(());
    }
    if addr == 0 {
        return Err(libc::EINVAL);
    }
    // SAFETY: by the contract; the bytes are copied out before the call returns.
    let src = unsafe { std::slice::from_raw_parts(addr as usize as *const u8, len) };
    p.inline.extend_from_slice(src);
    Ok(())
}

/// Reads one `ibv_send_wr` into the batch.
///
/// # Safety
///
/// `w` is the program's work request; its `sg_list` has `num_sge` readable entries and,
/// for an inline send, each names readable memory.
unsafe fn parse_send(
    q: &QpInner,
    w: &ibv_send_wr,
    tag: usize,
    p: &mut Pending,
) -> Result<(), c_int> {
    // SAFETY: by the contract.
    let op = unsafe { send_op(w) }?;
    let flags = send_flags(w.send_flags)?;
    let n = usize::try_from(w.num_sge).map_err(|_| libc::EINVAL)?;
    if n > q.cap.max_send_sge as usize || (n > 0 && w.sg_list.is_null()) {
        return Err(libc::EINVAL);
    }
    let list: &[ibv_sge] = if n == 0 {
        &[]
    } else {
        // SAFETY: by the contract, `n` readable entries.
        unsafe { std::slice::from_raw_parts(w.sg_list, n) }
    };
    let ud = if q.qp_type == QpType::Ud {
        // SAFETY: the union member of a UD work request; `ah` is the program's handle.
        let u = unsafe { w.wr.ud };
        // SAFETY: as above.
        Some(unsafe { ud_dest(u.ah, u.remote_qpn, u.remote_qkey) }?)
    } else {
        None
    };
    let sge_start = p.sges.len() as u32;
    let mut inline = None;
    if flags.contains(SendFlags::INLINE) {
        let total: u64 = list.iter().map(|s| u64::from(s.length)).sum();
        if total > u64::from(q.cap.max_inline_data) {
            return Err(libc::EINVAL);
        }
        let start = p.inline.len() as u32;
        for s in list {
            // SAFETY: by the contract, inline SGEs name readable memory.
            if let Err(e) = unsafe { copy_inline(p, s.addr, s.length as usize) } {
                p.inline.truncate(start as usize);
                return Err(e);
            }
        }
        inline = Some((start, total as u32));
    } else {
        p.sges.extend(list.iter().map(|s| Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        }));
    }
    p.wrs.push(PendingWr {
        wr_id: w.wr_id,
        op,
        flags,
        ud,
        sges: (sge_start, p.sges.len() as u32 - sge_start),
        inline,
        tag,
    });
    Ok(())
}

/// Posts one inline work request through the QP's bounce region.
fn post_inline(q: &QpInner, w: &PendingWr, data: &[u8]) -> Result<(), c_int> {
    let flags = w.flags | SendFlags::INLINE;
    let post = |list: &[Sge]| {
        let wr = SendWr {
            wr_id: w.wr_id,
            op: w.op,
            sg_list: list,
            flags,
            ud: w.ud.clone(),
        };
        q.qp.post_send(std::slice::from_ref(&wr))
            .map_err(|e| e.error.errno())
    };
    if data.is_empty() {
        return post(&[]);
    }
    let Some(bounce) = &q.send.bounce else {
        // max_inline_data is 0: nothing can be inline.
        return Err(libc::EINVAL);
    };
    // Held while remem copies the bytes out (at post).
    let b = bounce.lock().unwrap_or_else(|e| e.into_inner());
    b.buf.write(0, data).map_err(|_| libc::EINVAL)?;
    post(&[Sge {
        addr: b.mr.addr(),
        length: data.len() as u32,
        lkey: b.mr.lkey(),
    }])
}

/// Posts the batch in order, then empties it. On failure, the tag of the first work
/// request not posted (those before it are) and its errno; the batch is emptied too.
pub(crate) fn flush(q: &QpInner, p: &mut Pending) -> Result<(), (usize, c_int)> {
    let r = flush_inner(q, p).map_err(|(i, e)| (p.wrs[i].tag, e));
    p.clear();
    r
}

fn flush_inner(q: &QpInner, p: &Pending) -> Result<(), (usize, c_int)> {
    let make = |w: &PendingWr| SendWr {
        wr_id: w.wr_id,
        op: w.op,
        sg_list: &p.sges[w.sges.0 as usize..(w.sges.0 + w.sges.1) as usize],
        flags: w.flags,
        ud: w.ud.clone(),
    };
    let post = |wrs: &[SendWr<'_>], base: usize| {
        q.qp.post_send(wrs)
            .map_err(|PostError { index, error }| (base + index, error.errno()))
    };
    let mut i = 0;
    while i < p.wrs.len() {
        if let Some((start, len)) = p.wrs[i].inline {
            let data = &p.inline[start as usize..(start + len) as usize];
            post_inline(q, &p.wrs[i], data).map_err(|e| (i, e))?;
            i += 1;
            continue;
        }
        let end = p.wrs[i..]
            .iter()
            .take(SEND_BATCH)
            .position(|w| w.inline.is_some())
            .map_or((i + SEND_BATCH).min(p.wrs.len()), |k| i + k);
        if end - i == 1 {
            post(std::slice::from_ref(&make(&p.wrs[i])), i)?;
        } else {
            let batch: [SendWr<'_>; SEND_BATCH] = std::array::from_fn(|k| match p.wrs.get(i + k) {
                Some(w) if i + k < end => make(w),
                _ => SendWr::new(0, SendOp::Send, &[]),
            });
            post(&batch[..end - i], i)?;
        }
        i = end;
    }
    Ok(())
}

/// `ibv_context_ops::post_send` (verbs.h's inline `ibv_post_send`): 0, or the errno of
/// the first work request not posted, which `bad_wr` names.
///
/// # Safety
///
/// `qp` is a live QP; `wr` is a valid list of work requests; `bad_wr` is NULL or
/// writable.
pub unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    let set_bad = |p: *mut ibv_send_wr| {
        if !bad_wr.is_null() {
            // SAFETY: writable by the contract.
            unsafe { bad_wr.write(p) };
        }
    };
    guard_int("ibv_post_send", || {
        // SAFETY: by the contract.
        let Some(q) = (unsafe { qp_from(qp) }) else {
            set_bad(wr);
            return libc::EINVAL;
        };
        let mut p = q.send.old.lock().unwrap_or_else(|e| e.into_inner());
        let mut cur = wr;
        while !cur.is_null() {
            // Read up to a batch, stopping at the first work request refused.
            let mut refused = None;
            while !cur.is_null() && p.wrs.len() < SEND_BATCH {
                // SAFETY: each element of the program's list is a readable work request.
                let w = unsafe { &*cur };
                // SAFETY: as above, with its SGEs and inline data.
                if let Err(e) = unsafe { parse_send(q, w, cur as usize, &mut p) } {
                    refused = Some((cur, e));
                    break;
                }
                cur = w.next;
            }
            if let Err((tag, e)) = flush(q, &mut p) {
                set_bad(tag as *mut ibv_send_wr);
                return e;
            }
            if let Some((bad, e)) = refused {
                set_bad(bad);
                return e;
            }
        }
        0
    })
}

/// Posts one `ibv_recv_wr` with `post`, its scatter list copied to the stack.
///
/// # Safety
///
/// `w` is the program's work request with `num_sge` readable entries.
unsafe fn recv_one(
    w: &ibv_recv_wr,
    max_sge: u32,
    post: impl FnOnce(&RecvWr<'_>) -> Result<(), PostError>,
) -> Result<(), c_int> {
    let n = usize::try_from(w.num_sge).map_err(|_| libc::EINVAL)?;
    if n > max_sge as usize || n > MAX_SGE || (n > 0 && w.sg_list.is_null()) {
        return Err(libc::EINVAL);
    }
    let mut sges = [Sge::default(); MAX_SGE];
    if n > 0 {
        // SAFETY: by the contract, `n` readable entries.
        let list = unsafe { std::slice::from_raw_parts(w.sg_list, n) };
        for (d, s) in sges.iter_mut().zip(list) {
            *d = Sge {
                addr: s.addr,
                length: s.length,
                lkey: s.lkey,
            };
        }
    }
    post(&RecvWr {
        wr_id: w.wr_id,
        sg_list: &sges[..n],
    })
    .map_err(|e| e.error.errno())
}

/// Posts a list of receives one by one; the first refused is `bad_wr`.
///
/// # Safety
///
/// `wr` is a valid list; `bad_wr` is NULL or writable.
unsafe fn post_recv_list(
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    max_sge: u32,
    post: impl Fn(&RecvWr<'_>) -> Result<(), PostError>,
) -> c_int {
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: each element of the program's list is a readable work request.
        let w = unsafe { &*cur };
        // SAFETY: as above, with its SGEs.
        if let Err(e) = unsafe { recv_one(w, max_sge, &post) } {
            if !bad_wr.is_null() {
                // SAFETY: writable by the contract.
                unsafe { bad_wr.write(cur) };
            }
            return e;
        }
        cur = w.next;
    }
    0
}

/// `ibv_context_ops::post_recv` (verbs.h's inline `ibv_post_recv`). A QP that takes its
/// receives from an SRQ refuses them (EINVAL).
///
/// # Safety
///
/// `qp` is a live QP; `wr` is a valid list; `bad_wr` is NULL or writable.
pub unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard_int("ibv_post_recv", || {
        // SAFETY: by the contract.
        let Some(q) = (unsafe { qp_from(qp) }) else {
            if !bad_wr.is_null() {
                // SAFETY: writable by the contract.
                unsafe { bad_wr.write(wr) };
            }
            return libc::EINVAL;
        };
        // SAFETY: by the contract.
        unsafe {
            post_recv_list(wr, bad_wr, q.cap.max_recv_sge, |r| {
                q.qp.post_recv(std::slice::from_ref(r))
            })
        }
    })
}

/// `ibv_context_ops::post_srq_recv` (verbs.h's inline `ibv_post_srq_recv`).
///
/// # Safety
///
/// `srq` is a live SRQ; `wr` is a valid list; `bad_wr` is NULL or writable.
pub unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard_int("ibv_post_srq_recv", || {
        // SAFETY: by the contract.
        let Some(s) = (unsafe { srq_from(srq) }) else {
            if !bad_wr.is_null() {
                // SAFETY: writable by the contract.
                unsafe { bad_wr.write(wr) };
            }
            return libc::EINVAL;
        };
        // SAFETY: by the contract.
        unsafe {
            post_recv_list(wr, bad_wr, s.max_sge, |r| {
                s.srq.post_recv(std::slice::from_ref(r))
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_opcodes() {
        assert_eq!(
            send_flags(IBV_SEND_SIGNALED | IBV_SEND_INLINE).unwrap(),
            SendFlags::SIGNALED | SendFlags::INLINE
        );
        assert_eq!(send_flags(IBV_SEND_IP_CSUM).unwrap(), SendFlags::empty());
        assert_eq!(send_flags(1 << 7), Err(libc::EINVAL));

        // SAFETY: a zeroed work request is a valid value (all fields integers or NULL).
        let mut w: ibv_send_wr = unsafe { std::mem::zeroed() };
        w.opcode = IBV_WR_SEND_WITH_IMM;
        w.u_imm_data.imm_data = 0x0102_0304u32.to_be();
        // SAFETY: `w` is a local work request.
        let op = unsafe { send_op(&w) };
        assert_eq!(op, Ok(SendOp::SendWithImm { imm: 0x0102_0304 }));
        w.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
        w.wr.atomic = ibv_send_wr_atomic {
            remote_addr: 0x1000,
            compare_add: 1,
            swap: 2,
            rkey: 9,
        };
        assert_eq!(
            // SAFETY: as above.
            unsafe { send_op(&w) },
            Ok(SendOp::AtomicCmpAndSwp {
                remote_addr: 0x1000,
                rkey: 9,
                compare: 1,
                swap: 2
            })
        );
        w.opcode = IBV_WR_LOCAL_INV;
        w.u_imm_data.invalidate_rkey = 0x1234_5678;
        assert_eq!(
            // SAFETY: as above.
            unsafe { send_op(&w) },
            Ok(SendOp::LocalInv { rkey: 0x1234_5678 })
        );
        // A bind names a window: none is EINVAL.
        w.opcode = IBV_WR_BIND_MW;
        // SAFETY: as above.
        assert_eq!(unsafe { send_op(&w) }, Err(libc::EINVAL));
        w.opcode = IBV_WR_TSO;
        // SAFETY: as above.
        assert_eq!(unsafe { send_op(&w) }, Err(libc::EOPNOTSUPP));
        w.opcode = 77;
        // SAFETY: as above.
        assert_eq!(unsafe { send_op(&w) }, Err(libc::EINVAL));
    }
}

#[cfg(test)]
#[path = "queues_tests.rs"]
mod queues_tests;
