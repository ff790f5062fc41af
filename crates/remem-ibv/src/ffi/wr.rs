//! The program's work requests, as `ibv_post_send` / `ibv_post_recv` receive them: linked
//! lists in program memory, with scatter lists, unions read as the opcode says, address
//! handles and (for inline sends) the bytes to send. [`SendWrRef`] and [`RecvWrRef`] are
//! made once from the list's head, under the verbs contract on the whole list; their
//! methods read what the contract makes readable, so the posting logic
//! ([`crate::post`]) is safe code.

use crate::abi::*;
use core::ffi::c_int;
use remem_verbs::{QpType, SendOp, UdDest};
use std::sync::Arc;

/// One element of the program's send list.
#[derive(Clone, Copy)]
pub struct SendWrRef<'a> {
    ptr: *mut ibv_send_wr,
    w: &'a ibv_send_wr,
    qp_type: QpType,
}

impl<'a> SendWrRef<'a> {
    /// The head of the program's send list for a QP of type `qp_type`; `None` for NULL.
    ///
    /// # Safety
    ///
    /// `p` is NULL or a list of work requests valid for `'a`, as `ibv_post_send` requires:
    /// each element readable and its `next` NULL or the next element; its `sg_list`
    /// holding `num_sge` readable entries; for an inline work request
    /// (`IBV_SEND_INLINE`), each entry naming readable memory; the union member of its
    /// opcode set (a bind's window and region NULL or live objects of this library); for a
    /// UD QP, `wr.ud` set, its `ah` NULL or a live address handle of this library.
    pub unsafe fn new(p: *mut ibv_send_wr, qp_type: QpType) -> Option<Self> {
        // SAFETY: by the contract.
        let w = unsafe { p.as_ref() }?;
        Some(SendWrRef { ptr: p, w, qp_type })
    }

    /// The program's pointer (what `bad_wr` names).
    pub fn ptr(self) -> *mut ibv_send_wr {
        self.ptr
    }

    /// The work request's plain fields.
    pub fn wr(self) -> &'a ibv_send_wr {
        self.w
    }

    /// The next element of the list.
    pub fn next(self) -> Option<SendWrRef<'a>> {
        // SAFETY: `next` is NULL or the next element of the same list (`new`'s contract).
        unsafe { SendWrRef::new(self.w.next, self.qp_type) }
    }

    /// The scatter/gather entries; EINVAL for a negative count or a NULL list with
    /// entries.
    pub fn sges(self) -> Result<&'a [ibv_sge], c_int> {
        let n = usize::try_from(self.w.num_sge).map_err(|_| libc::EINVAL)?;
        // SAFETY: `num_sge` readable entries (`new`'s contract).
        unsafe { super::slice(self.w.sg_list, n) }.ok_or(libc::EINVAL)
    }

    /// The bytes of scatter entry `i` of an inline work request; EINVAL if the work
    /// request is not inline, or for an entry with bytes at address 0.
    pub fn inline_sge(self, i: usize) -> Result<&'a [u8], c_int> {
        if self.w.send_flags & IBV_SEND_INLINE == 0 {
            return Err(libc::EINVAL);
        }
        let s = self.sges()?.get(i).ok_or(libc::EINVAL)?;
        let len = s.length as usize;
        if len == 0 {
            return Ok(&[]);
        }
        if s.addr == 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: an inline work request's entries name readable memory (`new`'s
        // contract); the bytes are copied out before the call returns.
        Ok(unsafe { std::slice::from_raw_parts(s.addr as usize as *const u8, len) })
    }

    /// The UD destination (a UD QP's work request): EINVAL for a NULL address handle;
    /// `None` for other QP types.
    pub fn ud_dest(self) -> Result<Option<UdDest>, c_int> {
        if self.qp_type != QpType::Ud {
            return Ok(None);
        }
        // SAFETY: a UD QP's work request has `wr.ud` set, plain integers and a pointer.
        let u = unsafe { self.w.wr.ud };
        // SAFETY: its `ah` is NULL or a live address handle (`new`'s contract).
        unsafe { ud_dest(u.ah, u.remote_qpn, u.remote_qkey) }.map(Some)
    }

    /// The remem operation: EINVAL for an unknown opcode (or a bad bind,
    /// `crate::mw::bind_op`), EOPNOTSUPP for one remem does not implement (TSO, driver
    /// opcodes).
    pub fn op(self) -> Result<SendOp, c_int> {
        send_op(self.w)
    }
}

/// The remem operation of a work request whose opcode's union member is set.
fn send_op(w: &ibv_send_wr) -> Result<SendOp, c_int> {
    // SAFETY: each union member is read for the opcode that uses it (set, by the verbs
    // contract); all of them are plain integers, any bit pattern valid.
    unsafe {
        let imm = || u32::from_be(w.u_imm_data.imm_data);
        Ok(match w.opcode {
            IBV_WR_RDMA_WRITE => SendOp::RdmaWrite {
                remote_addr: w.wr.rdma.remote_addr,
                rkey: w.wr.rdma.rkey,
            },
            IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::RdmaWriteWithImm {
                remote_addr: w.wr.rdma.remote_addr,
                rkey: w.wr.rdma.rkey,
                imm: imm(),
            },
            IBV_WR_SEND => SendOp::Send,
            IBV_WR_SEND_WITH_IMM => SendOp::SendWithImm { imm: imm() },
            IBV_WR_RDMA_READ => SendOp::RdmaRead {
                remote_addr: w.wr.rdma.remote_addr,
                rkey: w.wr.rdma.rkey,
            },
            IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::AtomicCmpAndSwp {
                remote_addr: w.wr.atomic.remote_addr,
                rkey: w.wr.atomic.rkey,
                compare: w.wr.atomic.compare_add,
                swap: w.wr.atomic.swap,
            },
            IBV_WR_ATOMIC_FETCH_AND_ADD => SendOp::AtomicFetchAndAdd {
                remote_addr: w.wr.atomic.remote_addr,
                rkey: w.wr.atomic.rkey,
                add: w.wr.atomic.compare_add,
            },
            IBV_WR_SEND_WITH_INV => SendOp::SendWithInv {
                rkey: w.u_imm_data.invalidate_rkey,
            },
            IBV_WR_ATOMIC_WRITE => SendOp::AtomicWrite {
                remote_addr: w.wr.rdma.remote_addr,
                rkey: w.wr.rdma.rkey,
            },
            IBV_WR_LOCAL_INV => SendOp::LocalInv {
                rkey: w.u_imm_data.invalidate_rkey,
            },
            IBV_WR_BIND_MW => {
                // The program's window and region (NULL or live), as the contract says.
                let b = w.u_bind_mw.bind_mw;
                bind_op(b.mw, b.rkey, &b.bind_info)?
            }
            IBV_WR_TSO | IBV_WR_DRIVER1 => {
                return Err(libc::EOPNOTSUPP);
            }
            _ => return Err(libc::EINVAL),
        })
    }
}

/// The bind work request of window `mw` with `info`, giving it `rkey`
/// (`crate::mw::bind_op`).
///
/// # Safety
///
/// `mw` is NULL or a live window of this library; `info.mr` is NULL or a live region of
/// this library.
pub(crate) unsafe fn bind_op(
    mw: *mut ibv_mw,
    rkey: u32,
    info: &ibv_mw_bind_info,
) -> Result<SendOp, c_int> {
    // SAFETY: by the contract.
    let mw_rkey =
        unsafe { super::handles::Handle::<crate::mw::Mw>::from_abi(mw) }.map(|h| h.rkey());
    // SAFETY: by the contract, a non-NULL region is live; its `lkey` is read in place.
    let mr_lkey = (!info.mr.is_null()).then(|| unsafe { (*info.mr).lkey });
    crate::mw::bind_op(mw_rkey, rkey, info, mr_lkey)
}

/// One element of the program's receive list.
#[derive(Clone, Copy)]
pub struct RecvWrRef<'a> {
    ptr: *mut ibv_recv_wr,
    w: &'a ibv_recv_wr,
}

impl<'a> RecvWrRef<'a> {
    /// The head of the program's receive list; `None` for NULL.
    ///
    /// # Safety
    ///
    /// `p` is NULL or a list of work requests valid for `'a`, as `ibv_post_recv`
    /// requires: each element readable, its `next` NULL or the next element, its `sg_list`
    /// holding `num_sge` readable entries.
    pub unsafe fn new(p: *mut ibv_recv_wr) -> Option<Self> {
        // SAFETY: by the contract.
        let w = unsafe { p.as_ref() }?;
        Some(RecvWrRef { ptr: p, w })
    }

    /// The program's pointer (what `bad_wr` names).
    pub fn ptr(self) -> *mut ibv_recv_wr {
        self.ptr
    }

    /// The work request's fields.
    pub fn wr(self) -> &'a ibv_recv_wr {
        self.w
    }

    /// The next element of the list.
    pub fn next(self) -> Option<RecvWrRef<'a>> {
        // SAFETY: `next` is NULL or the next element of the same list (`new`'s contract).
        unsafe { RecvWrRef::new(self.w.next) }
    }

    /// The scatter/gather entries; EINVAL for a negative count or a NULL list with
    /// entries.
    pub fn sges(self) -> Result<&'a [ibv_sge], c_int> {
        let n = usize::try_from(self.w.num_sge).map_err(|_| libc::EINVAL)?;
        // SAFETY: `num_sge` readable entries (`new`'s contract).
        unsafe { super::slice(self.w.sg_list, n) }.ok_or(libc::EINVAL)
    }
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
    let a = unsafe { super::handles::ah_from(ah) }.ok_or(libc::EINVAL)?;
    Ok(UdDest {
        ah: Arc::clone(&a.ah),
        remote_qpn,
        remote_qkey,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcodes() {
        let mut w: ibv_send_wr = crate::ffi::zeroed();
        w.opcode = IBV_WR_SEND_WITH_IMM;
        w.u_imm_data.imm_data = 0x0102_0304u32.to_be();
        assert_eq!(send_op(&w), Ok(SendOp::SendWithImm { imm: 0x0102_0304 }));
        w.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
        w.wr.atomic = ibv_send_wr_atomic {
            remote_addr: 0x1000,
            compare_add: 1,
            swap: 2,
            rkey: 9,
        };
        assert_eq!(
            send_op(&w),
            Ok(SendOp::AtomicCmpAndSwp {
                remote_addr: 0x1000,
                rkey: 9,
                compare: 1,
                swap: 2
            })
        );
        w.opcode = IBV_WR_LOCAL_INV;
        w.u_imm_data.invalidate_rkey = 0x1234_5678;
        assert_eq!(send_op(&w), Ok(SendOp::LocalInv { rkey: 0x1234_5678 }));
        // A bind names a window: none is EINVAL.
        w.opcode = IBV_WR_BIND_MW;
        assert_eq!(send_op(&w), Err(libc::EINVAL));
        w.opcode = IBV_WR_TSO;
        assert_eq!(send_op(&w), Err(libc::EOPNOTSUPP));
        w.opcode = 77;
        assert_eq!(send_op(&w), Err(libc::EINVAL));
    }

    #[test]
    fn inline_bytes_only_of_an_inline_work_request() {
        let data = *b"hello";
        let mut sge = ibv_sge {
            addr: data.as_ptr() as u64,
            length: 5,
            lkey: 0,
        };
        let mut w: ibv_send_wr = crate::ffi::zeroed();
        w.sg_list = &raw mut sge;
        w.num_sge = 1;
        // SAFETY: a one-element list of a local work request and entry.
        let r = unsafe { SendWrRef::new(&raw mut w, QpType::Rc) }.unwrap();
        assert_eq!(r.inline_sge(0), Err(libc::EINVAL), "not inline");
        w.send_flags = IBV_SEND_INLINE;
        // SAFETY: as above.
        let r = unsafe { SendWrRef::new(&raw mut w, QpType::Rc) }.unwrap();
        assert_eq!(r.inline_sge(0), Ok(&b"hello"[..]));
        assert_eq!(r.inline_sge(1), Err(libc::EINVAL), "no such entry");
        assert!(r.next().is_none());
        assert_eq!(
            r.ud_dest().map(|d| d.is_none()),
            Ok(true),
            "RC: no UD address"
        );
    }
}
