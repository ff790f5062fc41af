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

#![forbid(unsafe_code)]

use crate::abi::*;
use crate::ffi::wr::{RecvWrRef, SendWrRef};
use crate::qp::QpInner;
use core::ffi::c_int;
use core::mem::MaybeUninit;
use remem_verbs::{
    AccessFlags, MemRegion, MemoryBuffer, MemoryRegion, PostError, ProtectionDomain, QpCap, RecvWr,
    SendFlags, SendOp, SendWr, Sge, UdDest,
};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

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

/// Reads one of the program's send work requests into the batch.
fn parse_send(q: &QpInner, w: SendWrRef<'_>, p: &mut Pending) -> Result<(), c_int> {
    let op = w.op()?;
    let flags = send_flags(w.wr().send_flags)?;
    let list = w.sges()?;
    if list.len() > q.cap.max_send_sge as usize {
        return Err(libc::EINVAL);
    }
    let ud = w.ud_dest()?;
    let sge_start = p.sges.len() as u32;
    let mut inline = None;
    if flags.contains(SendFlags::INLINE) {
        let total: u64 = list.iter().map(|s| u64::from(s.length)).sum();
        if total > u64::from(q.cap.max_inline_data) {
            return Err(libc::EINVAL);
        }
        let start = p.inline.len() as u32;
        for i in 0..list.len() {
            match w.inline_sge(i) {
                Ok(bytes) => p.inline.extend_from_slice(bytes),
                Err(e) => {
                    p.inline.truncate(start as usize);
                    return Err(e);
                }
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
        wr_id: w.wr().wr_id,
        op,
        flags,
        ud,
        sges: (sge_start, p.sges.len() as u32 - sge_start),
        inline,
        tag: w.ptr() as usize,
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

/// `ibv_post_send` once the FFI layer has the program's list: 0, or the errno of the
/// first work request not posted, which `bad` names (`head` for a NULL QP).
pub(crate) fn post_send(
    q: Option<&QpInner>,
    head: *mut ibv_send_wr,
    list: Option<SendWrRef<'_>>,
    bad: Option<&mut MaybeUninit<*mut ibv_send_wr>>,
) -> c_int {
    let set_bad = |p: *mut ibv_send_wr| {
        if let Some(b) = bad {
            b.write(p);
        }
    };
    let Some(q) = q else {
        set_bad(head);
        return libc::EINVAL;
    };
    let mut p = q.send.old.lock().unwrap_or_else(|e| e.into_inner());
    let mut cur = list;
    while cur.is_some() {
        // Read up to a batch, stopping at the first work request refused.
        let mut refused = None;
        while let Some(w) = cur
            && p.wrs.len() < SEND_BATCH
        {
            if let Err(e) = parse_send(q, w, &mut p) {
                refused = Some((w.ptr(), e));
                break;
            }
            cur = w.next();
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
}

/// Posts one receive with `post`, its scatter list copied to the stack.
fn recv_one(
    w: RecvWrRef<'_>,
    max_sge: u32,
    post: impl FnOnce(&RecvWr<'_>) -> Result<(), PostError>,
) -> Result<(), c_int> {
    let list = w.sges()?;
    let n = list.len();
    if n > max_sge as usize || n > MAX_SGE {
        return Err(libc::EINVAL);
    }
    let mut sges = [Sge::default(); MAX_SGE];
    for (d, s) in sges.iter_mut().zip(list) {
        *d = Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        };
    }
    post(&RecvWr {
        wr_id: w.wr().wr_id,
        sg_list: &sges[..n],
    })
    .map_err(|e| e.error.errno())
}

/// `ibv_post_recv` / `ibv_post_srq_recv` once the FFI layer has the program's list: posts
/// the receives one by one with `post`; the first refused is `bad`. A NULL QP or SRQ
/// (`max_sge` `None`) is EINVAL with `bad` the head.
pub(crate) fn post_recv_list(
    head: *mut ibv_recv_wr,
    list: Option<RecvWrRef<'_>>,
    bad: Option<&mut MaybeUninit<*mut ibv_recv_wr>>,
    max_sge: Option<u32>,
    post: impl Fn(&RecvWr<'_>) -> Result<(), PostError>,
) -> c_int {
    let Some(max_sge) = max_sge else {
        if let Some(b) = bad {
            b.write(head);
        }
        return libc::EINVAL;
    };
    let mut cur = list;
    while let Some(w) = cur {
        if let Err(e) = recv_one(w, max_sge, &post) {
            if let Some(b) = bad {
                b.write(w.ptr());
            }
            return e;
        }
        cur = w.next();
    }
    0
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
    }
}
