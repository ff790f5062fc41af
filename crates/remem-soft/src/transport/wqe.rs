//! Work queue entries: work requests after validation, with their scatter/gather entries
//! resolved to memory. Shared by the QP, the SRQ and the transport.
//!
//! Each scatter/gather entry is a [`Grant`] of its lkey's registration: every access checks
//! that the key still stands, so deregistering a region stops the NIC from touching it even
//! through work requests posted before (a receive still waiting for its SEND, a SEND whose
//! packets are still to be built), as rxe looks the lkey up again for every packet.

use crate::transport::glue::PayloadSink;
use crate::transport::{AccessError, Grant};
use remem_verbs::MemError;

pub use crate::mem::PdId;

/// A receive work request, validated: every scatter entry was resolved (at post time) to the
/// exact range of a memory region of the right PD with LOCAL_WRITE access, usable while the
/// region stays registered.
#[derive(Debug, Clone)]
pub struct RecvWqe {
    /// The caller's `wr_id`.
    pub wr_id: u64,
    /// The scatter list: each grant covers exactly one `ibv_sge`.
    pub sges: Vec<Grant>,
    /// Sum of the scatter entries' lengths.
    pub total_len: u64,
}

/// Where a UD send goes (resolved from the work request's address handle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdTarget {
    /// The address vector of the destination port.
    pub av: remem_verbs::AhAttr,
    /// Destination QP number.
    pub remote_qpn: u32,
    /// Destination Q_Key.
    pub remote_qkey: u32,
}

/// The data a send work request carries.
#[derive(Debug, Clone)]
pub enum SendData {
    /// Gather list (SEND, WRITE, ATOMIC WRITE) or scatter list (READ, atomic results):
    /// each grant covers exactly one `ibv_sge` and works while its region stays registered.
    Sges(Vec<Grant>),
    /// Inline data copied at post time (`IBV_SEND_INLINE`).
    Inline(Box<[u8]>),
}

/// A send work request, validated, with its memory resolved.
#[derive(Debug, Clone)]
pub struct SendWqe {
    /// The caller's `wr_id`.
    pub wr_id: u64,
    /// The operation.
    pub op: remem_verbs::SendOp,
    /// The data.
    pub data: SendData,
    /// Bytes moved: the message length (SEND/WRITE), the READ length, 8 for atomics.
    pub len: u64,
    /// Whether a successful completion is reported (SIGNALED or `sq_sig_all`).
    pub signaled: bool,
    /// Solicited event (`IBV_SEND_SOLICITED`).
    pub solicited: bool,
    /// Fence (`IBV_SEND_FENCE`).
    pub fence: bool,
    /// UD destination.
    pub ud: Option<UdTarget>,
}

impl SendWqe {
    /// Copies `dst.len()` bytes of the message starting at `offset` into `dst` (gather).
    /// [`AccessError::Revoked`] if a region it reads was deregistered since it was posted.
    #[cfg(any(test, feature = "internals"))]
    pub fn gather(&self, offset: u64, dst: &mut [u8]) -> Result<(), AccessError> {
        self.gather_into(offset, &mut crate::transport::glue::CopySink(dst))
    }

    /// Puts `out.payload_len()` bytes of the message starting at `offset` into `out`, piece
    /// by piece: inline data as bytes, each scatter/gather entry's part as a range of its
    /// grant (copied or referenced, as the sink does). [`AccessError::Revoked`] if a region
    /// it reads was deregistered since it was posted.
    pub fn gather_into(
        &self,
        mut offset: u64,
        out: &mut dyn PayloadSink,
    ) -> Result<(), AccessError> {
        let want = out.payload_len();
        let out_of_bounds = |offset: u64, size: u64| {
            AccessError::Mem(MemError::OutOfBounds {
                offset,
                len: want as u64,
                size,
            })
        };
        match &self.data {
            SendData::Inline(bytes) => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX);
                match bytes.get(start..).and_then(|b| b.get(..want)) {
                    Some(src) => out.put_bytes(0, src),
                    None => Err(out_of_bounds(offset, bytes.len() as u64)),
                }
            }
            SendData::Sges(sges) => {
                let mut done = 0usize;
                for sge in sges {
                    if done == want {
                        break;
                    }
                    let len = sge.len() as u64;
                    if offset >= len {
                        offset -= len;
                        continue;
                    }
                    let n = ((len - offset) as usize).min(want - done);
                    out.put_grant(done, sge, offset as usize, n)?;
                    done += n;
                    offset = 0;
                }
                if done == want {
                    Ok(())
                } else {
                    Err(out_of_bounds(offset, self.len))
                }
            }
        }
    }

    /// Writes `src` into the scatter list starting at message `offset` (READ responses,
    /// atomic results).
    pub fn scatter(&self, offset: u64, src: &[u8]) -> Result<(), AccessError> {
        match &self.data {
            SendData::Sges(sges) => scatter_into(sges, offset, src),
            SendData::Inline(_) => Err(AccessError::Mem(MemError::OutOfBounds {
                offset,
                len: src.len() as u64,
                size: 0,
            })),
        }
    }

    /// Whether a region of its scatter/gather list was deregistered since it was posted
    /// (inline data was copied when posted and has none).
    pub fn is_revoked(&self) -> bool {
        match &self.data {
            SendData::Sges(sges) => sges.iter().any(Grant::is_revoked),
            SendData::Inline(_) => false,
        }
    }
}

/// Writes `src` into a scatter list at message `offset`; fails (writing nothing past the
/// list) if the list is too short ([`AccessError::Mem`]) or with [`AccessError::Revoked`]
/// if a region of it was deregistered since it was posted.
pub fn scatter_into(sges: &[Grant], mut offset: u64, src: &[u8]) -> Result<(), AccessError> {
    let total: u64 = sges.iter().map(|s| s.len() as u64).sum();
    let end = offset.checked_add(src.len() as u64);
    if end.is_none_or(|e| e > total) {
        return Err(AccessError::Mem(MemError::OutOfBounds {
            offset,
            len: src.len() as u64,
            size: total,
        }));
    }
    let mut done = 0usize;
    for sge in sges {
        if done == src.len() {
            break;
        }
        let len = sge.len() as u64;
        if offset >= len {
            offset -= len;
            continue;
        }
        let n = ((len - offset) as usize).min(src.len() - done);
        sge.write(offset as usize, &src[done..done + n])?;
        done += n;
        offset = 0;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use remem_verbs::{MemRegion, MemoryBuffer, SendOp};
    use std::sync::Arc;

    fn regions() -> (Arc<MemoryBuffer>, Vec<Grant>) {
        let buf = Arc::new(MemoryBuffer::from_vec((0..100u8).collect()));
        let sges = vec![
            MemRegion::new(buf.clone(), 10..13).unwrap().into(),
            MemRegion::new(buf.clone(), 50..50).unwrap().into(),
            MemRegion::new(buf.clone(), 20..25).unwrap().into(),
        ];
        (buf, sges)
    }

    #[test]
    fn gather_across_sges() {
        let (_buf, sges) = regions();
        let wqe = SendWqe {
            wr_id: 1,
            op: SendOp::Send,
            data: SendData::Sges(sges),
            len: 8,
            signaled: true,
            solicited: false,
            fence: false,
            ud: None,
        };
        let mut out = [0; 8];
        wqe.gather(0, &mut out).unwrap();
        assert_eq!(out, [10, 11, 12, 20, 21, 22, 23, 24]);
        let mut out = [0; 3];
        wqe.gather(2, &mut out).unwrap();
        assert_eq!(out, [12, 20, 21]);
        assert!(wqe.gather(6, &mut [0; 3]).is_err());
    }

    #[test]
    fn scatter_across_sges_and_bounds() {
        let (buf, sges) = regions();
        scatter_into(&sges, 1, &[0xa, 0xb, 0xc, 0xd]).unwrap();
        assert_eq!(buf.to_vec(10, 3).unwrap(), [10, 0xa, 0xb]);
        assert_eq!(buf.to_vec(20, 3).unwrap(), [0xc, 0xd, 22]);
        let before = buf.to_vec(0, 100).unwrap();
        assert!(scatter_into(&sges, 5, &[1, 2, 3, 4]).is_err());
        assert_eq!(
            buf.to_vec(0, 100).unwrap(),
            before,
            "failed scatter wrote nothing"
        );
    }

    #[test]
    fn a_deregistered_region_is_neither_gathered_nor_scattered() {
        let buf = Arc::new(MemoryBuffer::from_vec(vec![7; 64]));
        let key = crate::mem::grant::KeyedRegion::new(MemRegion::whole(buf.clone()));
        let sges = vec![key.grant_all().unwrap()];
        let wqe = SendWqe {
            wr_id: 1,
            op: SendOp::Send,
            data: SendData::Sges(sges.clone()),
            len: 64,
            signaled: true,
            solicited: false,
            fence: false,
            ud: None,
        };
        assert!(!wqe.is_revoked());
        key.revoke(); // ibv_dereg_mr after the post
        assert!(wqe.is_revoked());
        let mut out = [0u8; 8];
        assert_eq!(wqe.gather(0, &mut out), Err(AccessError::Revoked));
        assert_eq!(out, [0; 8], "nothing read");
        assert_eq!(scatter_into(&sges, 0, &[1; 8]), Err(AccessError::Revoked));
        assert_eq!(buf.to_vec(0, 64).unwrap(), vec![7; 64], "nothing written");
    }

    #[test]
    fn inline_gather() {
        let wqe = SendWqe {
            wr_id: 1,
            op: SendOp::Send,
            data: SendData::Inline(vec![1, 2, 3].into_boxed_slice()),
            len: 3,
            signaled: true,
            solicited: false,
            fence: false,
            ud: None,
        };
        let mut out = [0; 2];
        wqe.gather(1, &mut out).unwrap();
        assert_eq!(out, [2, 3]);
        assert!(wqe.gather(2, &mut [0; 2]).is_err());
    }
}
