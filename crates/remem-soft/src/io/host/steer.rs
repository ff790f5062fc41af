//! Which process of a shared device a datagram is for, and the classic BPF program that
//! makes the kernel deliver it there (see [`crate::io::host`]).
//!
//! Every member of a shared device holds a *slot* (1–254). The slot is the top 8 bits of
//! the member's QP numbers (`slot << 16 | 16 bits`) and of the communication IDs its
//! connection manager hands out (`slot << 24 | 24 bits`), so a packet names its process:
//!
//! | packet | its owner |
//! |---|---|
//! | to a QPN other than 1 and 0xFFFFFF | the QPN's slot (bits 16–23) |
//! | a CM REQ or SIDR REQ (to QP 1) | the member listening on its service ID |
//! | a SIDR REP | the slot of its request ID (the receiver's) |
//! | any other CM MAD (REP, REJ, MRA, RTU, DREQ, DREP, LAP, APR) | the slot of its remote communication ID (the receiver's) |
//! | multicast (QPN 0xFFFFFF), anything else | whoever has it |
//!
//! A slot nobody holds, a service nobody listens on: the receiver keeps the packet (its
//! engine drops a packet for a QPN it does not have and counts it; its CM rejects a REQ for
//! a service nobody listens on, as a NIC's would).
//!
//! Offsets: the kernel runs a reuseport program on the UDP payload, so the BTH is at 0 (its
//! destination QPN the low 24 bits of the big-endian word at 4); a CM MAD follows the BTH
//! (12 bytes) and DETH (8): its attribute ID at 20 + 16 = 36, the CM payload at 20 + 24 =
//! 44 (local or request ID at 44, remote ID at 48, a REQ's service ID at 52).

use crate::io::sys::Insn;

/// The lowest slot (slot 0 would hold QPN 0 and 1, the special QPs).
pub const FIRST_SLOT: u8 = 1;
/// The highest slot (slot 255 would hold QPN 0xFFFFFF, the multicast QPN).
pub const LAST_SLOT: u8 = 254;

const GSI_QPN: u32 = 1;
const MULTICAST_QPN: u32 = 0x00ff_ffff;
const ATTR_OFFSET: usize = 36;
const CM_PAYLOAD: usize = 44;
const ATTR_REQ: u16 = 0x0010;
const ATTR_SIDR_REQ: u16 = 0x0017;
const ATTR_SIDR_REP: u16 = 0x0018;

/// The slot a QP number belongs to.
pub fn slot_of_qpn(qpn: u32) -> u8 {
    (qpn >> 16) as u8
}

/// The slot a communication ID belongs to.
pub fn slot_of_comm_id(id: u32) -> u8 {
    (id >> 24) as u8
}

/// Where a datagram should go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The member holding this slot.
    Slot(u8),
    /// A connection request for this service ID: the member listening on it.
    Service(u64),
    /// No one in particular: whoever received it keeps it.
    Any,
}

fn be32(p: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(p.get(at..at + 4)?.try_into().ok()?))
}

/// Who a UDP payload (a RoCEv2 packet) is for, by the table of the module documentation.
/// Never panics: what is too short to tell is [`Owner::Any`].
pub fn owner(pkt: &[u8]) -> Owner {
    let Some(word) = be32(pkt, 4) else {
        return Owner::Any;
    };
    let qpn = word & 0x00ff_ffff;
    match qpn {
        MULTICAST_QPN => Owner::Any,
        GSI_QPN => {
            let Some(attr) = pkt.get(ATTR_OFFSET..ATTR_OFFSET + 2) else {
                return Owner::Any;
            };
            match u16::from_be_bytes([attr[0], attr[1]]) {
                ATTR_REQ | ATTR_SIDR_REQ => match pkt.get(CM_PAYLOAD + 8..CM_PAYLOAD + 16) {
                    Some(b) => Owner::Service(u64::from_be_bytes(b.try_into().unwrap_or_default())),
                    None => Owner::Any,
                },
                ATTR_SIDR_REP => {
                    be32(pkt, CM_PAYLOAD).map_or(Owner::Any, |id| Owner::Slot(slot_of_comm_id(id)))
                }
                0x0011..=0x0016 | 0x0019 | 0x001a => be32(pkt, CM_PAYLOAD + 4)
                    .map_or(Owner::Any, |id| Owner::Slot(slot_of_comm_id(id))),
                _ => Owner::Any,
            }
        }
        _ => Owner::Slot(slot_of_qpn(qpn)),
    }
}

// Classic BPF opcodes (linux/filter.h, linux/bpf_common.h).
const LD_W_ABS: u16 = 0x20;
const LD_H_ABS: u16 = 0x28;
const AND_K: u16 = 0x54;
const RSH_K: u16 = 0x74;
const JEQ_K: u16 = 0x15;
const JA: u16 = 0x05;
const RET_K: u16 = 0x06;
/// A return value past any group's size: the kernel's hash picks the socket.
const HASH: u32 = u32::MAX;

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> Insn {
    Insn { code, jt, jf, k }
}

/// The reuseport program for a group whose sockets are `members` (slot, index in the
/// group): a packet for a slot goes to that slot's socket, a connection request and a slot
/// nobody holds to the kernel's hash (the member that receives it forwards it, see
/// [`owner`]).
pub fn program(members: &[(u8, u16)]) -> Vec<Insn> {
    let mut p = vec![
        insn(LD_W_ABS, 0, 0, 4),                     // 0: A = word at 4
        insn(AND_K, 0, 0, 0x00ff_ffff),              // 1: the destination QPN
        insn(JEQ_K, 1, 0, GSI_QPN),                  // 2: QP 1 → 4
        insn(JA, 0, 0, 11),                          // 3: → 15 (data)
        insn(LD_H_ABS, 0, 0, 36),                    // 4: A = attribute ID
        insn(JEQ_K, 2, 0, ATTR_REQ.into()),          // 5: REQ → 8
        insn(JEQ_K, 1, 0, ATTR_SIDR_REQ.into()),     // 6: SIDR REQ → 8
        insn(JA, 0, 0, 1),                           // 7: → 9
        insn(RET_K, 0, 0, HASH),                     // 8: by service: the hash, then forwarded
        insn(JEQ_K, 0, 2, ATTR_SIDR_REP.into()),     // 9: SIDR REP → 10, else → 12
        insn(LD_W_ABS, 0, 0, CM_PAYLOAD as u32),     // 10: its request ID
        insn(JA, 0, 0, 1),                           // 11: → 13
        insn(LD_W_ABS, 0, 0, CM_PAYLOAD as u32 + 4), // 12: the remote communication ID
        insn(RSH_K, 0, 0, 24),                       // 13: its slot
        insn(JA, 0, 0, 1),                           // 14: → 16 (the table)
        insn(RSH_K, 0, 0, 16),                       // 15: data: the QPN's slot
    ];
    // 16: the table, a compare and a return per member.
    for &(slot, index) in members {
        p.push(insn(JEQ_K, 0, 1, slot.into()));
        p.push(insn(RET_K, 0, 0, index.into()));
    }
    p.push(insn(RET_K, 0, 0, HASH));
    p
}

/// Runs a classic BPF program as the kernel would on `pkt` (the subset [`program`] uses;
/// a load past the end returns 0, as the kernel's interpreter does). For tests.
#[cfg(test)]
pub fn run(prog: &[Insn], pkt: &[u8]) -> u32 {
    let (mut a, mut pc) = (0u32, 0usize);
    while let Some(i) = prog.get(pc) {
        pc += 1;
        match i.code {
            LD_W_ABS => match be32(pkt, i.k as usize) {
                Some(v) => a = v,
                None => return 0,
            },
            LD_H_ABS => match pkt.get(i.k as usize..i.k as usize + 2) {
                Some(b) => a = u32::from(u16::from_be_bytes([b[0], b[1]])),
                None => return 0,
            },
            AND_K => a &= i.k,
            RSH_K => a >>= i.k,
            JEQ_K => pc += usize::from(if a == i.k { i.jt } else { i.jf }),
            JA => pc += i.k as usize,
            RET_K => return i.k,
            _ => return 0,
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(qpn: u32) -> Vec<u8> {
        let mut p = vec![0u8; 64];
        p[0] = 0x04; // RC SEND ONLY
        p[4..8].copy_from_slice(&qpn.to_be_bytes());
        p
    }

    fn mad(attr: u16, id_at_44: u32, id_at_48: u32, service: u64) -> Vec<u8> {
        let mut p = vec![0u8; 12 + 8 + 256 + 4];
        p[0] = 0x64; // UD SEND ONLY
        p[4..8].copy_from_slice(&1u32.to_be_bytes());
        p[36..38].copy_from_slice(&attr.to_be_bytes());
        p[44..48].copy_from_slice(&id_at_44.to_be_bytes());
        p[48..52].copy_from_slice(&id_at_48.to_be_bytes());
        p[52..60].copy_from_slice(&service.to_be_bytes());
        p
    }

    #[test]
    fn packets_name_their_owner() {
        assert_eq!(owner(&data(0x07_1234)), Owner::Slot(7));
        assert_eq!(owner(&data(0x00ff_ffff)), Owner::Any);
        assert_eq!(owner(&[1, 2, 3]), Owner::Any);
        // REQ and SIDR REQ: by the service ID; the remote ID of a REQ is 0.
        assert_eq!(
            owner(&mad(0x10, 0x0900_0001, 0, 0x1_0600_1234)),
            Owner::Service(0x1_0600_1234)
        );
        assert_eq!(
            owner(&mad(0x17, 0x0900_0001, 0, 0x2_0000_0007)),
            Owner::Service(0x2_0000_0007)
        );
        // REP, RTU, DREQ, DREP, REJ, MRA: the receiver's ID is the remote one.
        for attr in [0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x19, 0x1a] {
            assert_eq!(
                owner(&mad(attr, 0x0900_0001, 0x0500_0002, 0)),
                Owner::Slot(5),
                "{attr:#x}"
            );
        }
        // SIDR REP: its request ID is the requester's.
        assert_eq!(owner(&mad(0x18, 0x0600_0003, 0, 0)), Owner::Slot(6));
        // A MAD cut short is anyone's.
        assert_eq!(owner(&mad(0x13, 1, 2, 3)[..40]), Owner::Any);
    }

    #[test]
    fn the_program_returns_the_owners_index() {
        let members = [(3u8, 0u16), (9, 1), (4, 2)];
        let prog = program(&members);
        for (slot, index) in members {
            let qpn = u32::from(slot) << 16 | 0x1234;
            assert_eq!(run(&prog, &data(qpn)), u32::from(index));
            assert_eq!(
                run(&prog, &mad(0x13, 1, u32::from(slot) << 24 | 5, 0)),
                u32::from(index)
            );
            assert_eq!(
                run(&prog, &mad(0x18, u32::from(slot) << 24 | 5, 0, 0)),
                u32::from(index)
            );
        }
        // A slot nobody holds, a request by service: the kernel's hash.
        assert_eq!(run(&prog, &data(0x20_0001)), HASH);
        assert_eq!(run(&prog, &mad(0x10, 0x0300_0001, 0, 9)), HASH);
        assert_eq!(run(&prog, &mad(0x17, 0x0300_0001, 0, 9)), HASH);
        // The program agrees with `owner` on every slot.
        for slot in FIRST_SLOT..=LAST_SLOT {
            let want = members
                .iter()
                .find(|m| m.0 == slot)
                .map_or(HASH, |m| u32::from(m.1));
            assert_eq!(run(&prog, &data(u32::from(slot) << 16 | 77)), want);
        }
    }

    #[test]
    fn a_full_table_fits_the_kernels_limits() {
        let members: Vec<(u8, u16)> = (FIRST_SLOT..=LAST_SLOT)
            .map(|s| (s, u16::from(s) - 1))
            .collect();
        let prog = program(&members);
        assert!(prog.len() <= 4096, "BPF_MAXINSNS");
        assert_eq!(run(&prog, &data(254 << 16 | 1)), 253);
    }
}
