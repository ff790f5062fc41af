//! Management datagrams (MADs) of the communication-management class (IBTA vol. 1, ch. 12),
//! as the Linux kernel's `ib_cm` and `rdma_cm` put them on the wire.
//!
//! A connection manager talks to its peer's with 256-byte MADs sent as UD SEND ONLY packets
//! to QP 1 (the GSI) with Q_Key [`GSI_QKEY`]. Every MAD starts with the 24-byte common
//! [`MadHeader`]; the attribute ID says which CM message follows ([`CmMessage`]).
//!
//! * [`CmMad::parse`] reads a whole MAD into a typed [`CmMad`]; malformed input is a typed
//!   [`MadError`], never a panic. Reserved bits are ignored.
//! * [`CmMad::emit`] writes one back, byte-exact with the kernel (reserved bits zero, the
//!   private data zero padded to the message's full private-data field). A field value wider
//!   than its wire field is a [`MadError::FieldRange`], never silently cut.
//! * [`CmaIpHeader`] is the 36-byte IP addressing header `rdma_cm` puts at the start of the
//!   private data of a REQ / SIDR REQ for the IP port spaces.
//!
//! Field positions are those of IBTA tables 106–120 (the same facts as the kernel's
//! `include/rdma/ibta_vol1_c12.h` and Wireshark's InfiniBand dissector). The IBTA counts a
//! message's bytes from the end of the 24-byte MAD header; so does this module's code
//! (`D + offset`), while the tests also name the absolute MAD offsets.
//!
//! ```
//! use remem_wire::mad::{CmMad, CmMessage, CmRtu, CM_ATTR_RTU};
//!
//! let rtu = CmMad::new(0x1234, CmMessage::Rtu(CmRtu {
//!     local_comm_id: 7,
//!     remote_comm_id: 9,
//!     ..CmRtu::default()
//! }));
//! let bytes = rtu.emit().unwrap();
//! assert_eq!(u16::from_be_bytes([bytes[16], bytes[17]]), CM_ATTR_RTU);
//! let back = CmMad::parse(&bytes).unwrap();
//! assert_eq!(back.header.transaction_id, 0x1234);
//! let CmMessage::Rtu(r) = back.message else { unreachable!() };
//! assert_eq!((r.local_comm_id, r.remote_comm_id), (7, 9));
//! assert_eq!(r.private_data.len(), 224); // the whole field, zero padded
//! ```

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

/// Length of every (non-OPA) MAD: header plus data, the UD payload of a GSI packet.
pub const MAD_LEN: usize = 256;
/// Length of the common MAD header.
pub const MAD_HEADER_LEN: usize = 24;
/// The well-known Q_Key of the GSI (QP 1).
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The GSI's queue pair number.
pub const GSI_QPN: u32 = 1;
/// Management class of communication management.
pub const MGMT_CLASS_CM: u8 = 0x07;
/// The MAD base version of every InfiniBand MAD (OPA's larger MADs use another).
pub const MAD_BASE_VERSION: u8 = 1;
/// The CM class version `ib_cm` speaks (and the only one it accepts).
pub const CM_CLASS_VERSION: u8 = 2;
/// Mask of the 24-bit QP, EE-context, PSN and vendor-ID fields.
pub const QPN_MASK: u32 = 0x00ff_ffff;

/// MAD method Get.
pub const MAD_METHOD_GET: u8 = 0x01;
/// MAD method Set.
pub const MAD_METHOD_SET: u8 = 0x02;
/// MAD method Send: every CM message is sent with it.
pub const MAD_METHOD_SEND: u8 = 0x03;
/// MAD method Trap.
pub const MAD_METHOD_TRAP: u8 = 0x05;
/// MAD method Report.
pub const MAD_METHOD_REPORT: u8 = 0x06;
/// MAD method TrapRepress.
pub const MAD_METHOD_TRAP_REPRESS: u8 = 0x07;
/// The response bit of the method field (GetResp = Get | this).
pub const MAD_METHOD_RESPONSE: u8 = 0x80;
/// MAD method GetResp.
pub const MAD_METHOD_GET_RESP: u8 = 0x81;
/// MAD method ReportResp.
pub const MAD_METHOD_REPORT_RESP: u8 = 0x86;

/// CM attribute ClassPortInfo.
pub const CM_ATTR_CLASS_PORT_INFO: u16 = 0x0001;
/// CM attribute ConnectRequest (REQ).
pub const CM_ATTR_REQ: u16 = 0x0010;
/// CM attribute MsgRcptAck (MRA).
pub const CM_ATTR_MRA: u16 = 0x0011;
/// CM attribute ConnectReject (REJ).
pub const CM_ATTR_REJ: u16 = 0x0012;
/// CM attribute ConnectReply (REP).
pub const CM_ATTR_REP: u16 = 0x0013;
/// CM attribute ReadyToUse (RTU).
pub const CM_ATTR_RTU: u16 = 0x0014;
/// CM attribute DisconnectRequest (DREQ).
pub const CM_ATTR_DREQ: u16 = 0x0015;
/// CM attribute DisconnectReply (DREP).
pub const CM_ATTR_DREP: u16 = 0x0016;
/// CM attribute ServiceIDResReq (SIDR REQ).
pub const CM_ATTR_SIDR_REQ: u16 = 0x0017;
/// CM attribute ServiceIDResReqResp (SIDR REP).
pub const CM_ATTR_SIDR_REP: u16 = 0x0018;
/// CM attribute LoadAlternatePath (LAP); not parsed by this module.
pub const CM_ATTR_LAP: u16 = 0x0019;
/// CM attribute AlternatePathResponse (APR); not parsed by this module.
pub const CM_ATTR_APR: u16 = 0x001a;

/// REQ/REP transport service type: reliable connection.
pub const TRANSPORT_RC: u8 = 0;
/// REQ/REP transport service type: unreliable connection.
pub const TRANSPORT_UC: u8 = 1;
/// REQ/REP transport service type: reliable datagram.
pub const TRANSPORT_RD: u8 = 2;
/// REQ transport service type: see the extended transport type (XRC).
pub const TRANSPORT_EXTENDED: u8 = 3;

/// SIDR REP status: the service ID resolved, QPN and Q_Key are valid.
pub const SIDR_SUCCESS: u8 = 0;
/// SIDR REP status: service ID not supported (nobody listens).
pub const SIDR_UNSUPPORTED: u8 = 1;
/// SIDR REP status: rejected by the service provider.
pub const SIDR_REJECT: u8 = 2;
/// SIDR REP status: no QP available.
pub const SIDR_NO_QP: u8 = 3;
/// SIDR REP status: redirect (additional information holds ClassPortInfo).
pub const SIDR_REDIRECT: u8 = 4;
/// SIDR REP status: unsupported class version.
pub const SIDR_UNSUPPORTED_VERSION: u8 = 5;

/// REJ reason codes (IBTA table 109; `enum ib_cm_rej_reason`).
pub mod rej_reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// No EE context available.
    pub const NO_EEC: u16 = 2;
    /// No resources available.
    pub const NO_RESOURCES: u16 = 3;
    /// The sender of the REJ timed out waiting for a response.
    pub const TIMEOUT: u16 = 4;
    /// The REQ is not supported.
    pub const UNSUPPORTED: u16 = 5;
    /// Invalid communication ID.
    pub const INVALID_COMM_ID: u16 = 6;
    /// Invalid communication instance.
    pub const INVALID_COMM_INSTANCE: u16 = 7;
    /// Invalid service ID: nobody listens on it.
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Invalid transport service type.
    pub const INVALID_TRANSPORT_TYPE: u16 = 9;
    /// Stale connection.
    pub const STALE_CONN: u16 = 10;
    /// RDC does not exist.
    pub const RDC_NOT_EXIST: u16 = 11;
    /// Primary remote port GID rejected.
    pub const INVALID_GID: u16 = 12;
    /// Primary remote port LID rejected.
    pub const INVALID_LID: u16 = 13;
    /// Invalid primary SL.
    pub const INVALID_SL: u16 = 14;
    /// Invalid primary traffic class.
    pub const INVALID_TRAFFIC_CLASS: u16 = 15;
    /// Invalid primary hop limit.
    pub const INVALID_HOP_LIMIT: u16 = 16;
    /// Invalid primary packet rate.
    pub const INVALID_PACKET_RATE: u16 = 17;
    /// Alternate remote port GID rejected.
    pub const INVALID_ALT_GID: u16 = 18;
    /// Alternate remote port LID rejected.
    pub const INVALID_ALT_LID: u16 = 19;
    /// Invalid alternate SL.
    pub const INVALID_ALT_SL: u16 = 20;
    /// Invalid alternate traffic class.
    pub const INVALID_ALT_TRAFFIC_CLASS: u16 = 21;
    /// Invalid alternate hop limit.
    pub const INVALID_ALT_HOP_LIMIT: u16 = 22;
    /// Invalid alternate packet rate.
    pub const INVALID_ALT_PACKET_RATE: u16 = 23;
    /// Port CM redirect.
    pub const PORT_CM_REDIRECT: u16 = 24;
    /// Port redirect.
    pub const PORT_REDIRECT: u16 = 25;
    /// Invalid path MTU.
    pub const INVALID_MTU: u16 = 26;
    /// Insufficient responder resources.
    pub const INSUFFICIENT_RESP_RESOURCES: u16 = 27;
    /// Consumer reject (the application said no, with its private data).
    pub const CONSUMER_DEFINED: u16 = 28;
    /// Invalid RNR retry count.
    pub const INVALID_RNR_RETRY: u16 = 29;
    /// Duplicate local communication ID.
    pub const DUPLICATE_LOCAL_COMM_ID: u16 = 30;
    /// Unsupported class version.
    pub const INVALID_CLASS_VERSION: u16 = 31;
    /// Invalid primary flow label.
    pub const INVALID_FLOW_LABEL: u16 = 32;
    /// Invalid alternate flow label.
    pub const INVALID_ALT_FLOW_LABEL: u16 = 33;
    /// Vendor option (ECE) not supported.
    pub const VENDOR_OPTION_NOT_SUPPORTED: u16 = 35;
}

/// Why bytes are not a CM MAD this module understands, or why a message cannot be emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MadError {
    /// Shorter than the structure needs.
    #[error("truncated: {needed} bytes needed, {got} present")]
    Truncated {
        /// Bytes needed.
        needed: usize,
        /// Bytes present.
        got: usize,
    },
    /// Base version other than [`MAD_BASE_VERSION`].
    #[error("unsupported MAD base version {0}")]
    BaseVersion(u8),
    /// Management class other than [`MGMT_CLASS_CM`].
    #[error("management class {0:#04x} is not communication management")]
    NotCm(u8),
    /// An attribute ID that is not one of the CM messages this module knows.
    #[error("unsupported CM attribute {0:#06x}")]
    UnknownAttribute(u16),
    /// A REJ's rejected-info length or a SIDR REP's additional-information length larger
    /// than the 72-byte field.
    #[error("additional rejection information of {0} bytes exceeds the 72-byte field")]
    AriTooLong(usize),
    /// Private data longer than the message's private-data field.
    #[error("{len} bytes of private data exceed the message's {max}-byte field")]
    PrivateDataTooLong {
        /// Bytes given.
        len: usize,
        /// The field's size.
        max: usize,
    },
    /// A field value wider than its wire field.
    #[error("{field} = {value:#x} does not fit in {bits} bits")]
    FieldRange {
        /// The field's name.
        field: &'static str,
        /// The value given.
        value: u64,
        /// The field's width.
        bits: u32,
    },
    /// [`CmMad::emit`]: the header's attribute ID is not the message's.
    #[error("header attribute {header:#06x} but a {message:#06x} message")]
    AttributeMismatch {
        /// The header's attribute ID.
        header: u16,
        /// The attribute ID of the message.
        message: u16,
    },
    /// An `rdma_cm` IP header whose IP version is neither 4 nor 6.
    #[error("rdma_cm IP header: IP version {0}")]
    IpVersion(u8),
    /// An `rdma_cm` IP header with an IPv4 and an IPv6 address.
    #[error("rdma_cm IP header: source and destination are of different IP versions")]
    MixedIpVersions,
}

// ---------------------------------------------------------------------------------------
// Bit-level access to a whole MAD. Offsets are constants below MAD_LEN, so indexing a
// `[u8; MAD_LEN]` cannot fail; input length is checked once, up front.

fn rd8(m: &[u8; MAD_LEN], at: usize) -> u8 {
    m[at]
}

/// `width` bits of byte `at`, starting `bit` bits below its most significant bit (the
/// IBTA's Byte[Bit] notation).
fn rdbits(m: &[u8; MAD_LEN], at: usize, bit: u32, width: u32) -> u8 {
    (m[at] >> (8 - bit - width)) & ((1u16 << width) - 1) as u8
}

fn rd16(m: &[u8; MAD_LEN], at: usize) -> u16 {
    u16::from_be_bytes([m[at], m[at + 1]])
}

fn rd24(m: &[u8; MAD_LEN], at: usize) -> u32 {
    u32::from_be_bytes([0, m[at], m[at + 1], m[at + 2]])
}

fn rd32(m: &[u8; MAD_LEN], at: usize) -> u32 {
    u32::from_be_bytes([m[at], m[at + 1], m[at + 2], m[at + 3]])
}

fn rd64(m: &[u8; MAD_LEN], at: usize) -> u64 {
    (u64::from(rd32(m, at)) << 32) | u64::from(rd32(m, at + 4))
}

fn rd128(m: &[u8; MAD_LEN], at: usize) -> [u8; 16] {
    let mut g = [0u8; 16];
    g.copy_from_slice(&m[at..at + 16]);
    g
}

fn check(field: &'static str, value: u64, bits: u32) -> Result<(), MadError> {
    if bits < 64 && value >> bits != 0 {
        Err(MadError::FieldRange { field, value, bits })
    } else {
        Ok(())
    }
}

fn wr8(m: &mut [u8; MAD_LEN], at: usize, v: u8) {
    m[at] = v;
}

/// OR `v` (checked to fit `width` bits) into byte `at` at IBTA bit position `bit`.
fn wrbits(
    m: &mut [u8; MAD_LEN],
    at: usize,
    bit: u32,
    width: u32,
    v: u8,
    field: &'static str,
) -> Result<(), MadError> {
    check(field, u64::from(v), width)?;
    m[at] |= v << (8 - bit - width);
    Ok(())
}

fn wr16(m: &mut [u8; MAD_LEN], at: usize, v: u16) {
    m[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

fn wr24(m: &mut [u8; MAD_LEN], at: usize, v: u32, field: &'static str) -> Result<(), MadError> {
    check(field, u64::from(v), 24)?;
    m[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
    Ok(())
}

fn wr32(m: &mut [u8; MAD_LEN], at: usize, v: u32) {
    m[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

fn wr64(m: &mut [u8; MAD_LEN], at: usize, v: u64) {
    m[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

fn wr128(m: &mut [u8; MAD_LEN], at: usize, v: &[u8; 16]) {
    m[at..at + 16].copy_from_slice(v);
}

/// The private-data field `[at, MAD_LEN)` in full.
fn rd_private(m: &[u8; MAD_LEN], at: usize) -> Vec<u8> {
    m[at..].to_vec()
}

/// Copy `data` to the field `[at, at + max)`; the rest of the field stays zero.
fn wr_bytes(m: &mut [u8; MAD_LEN], at: usize, max: usize, data: &[u8]) -> Result<(), MadError> {
    if data.len() > max {
        return Err(MadError::PrivateDataTooLong {
            len: data.len(),
            max,
        });
    }
    m[at..at + data.len()].copy_from_slice(data);
    Ok(())
}

/// Size of the REJ ARI / SIDR REP additional-information field.
pub const ARI_LEN: usize = 72;

fn rd_ari(m: &[u8; MAD_LEN], at: usize, len: u8) -> Result<Vec<u8>, MadError> {
    let len = usize::from(len);
    if len > ARI_LEN {
        return Err(MadError::AriTooLong(len));
    }
    Ok(m[at..at + len].to_vec())
}

fn wr_ari(m: &mut [u8; MAD_LEN], at: usize, ari: &[u8]) -> Result<(), MadError> {
    if ari.len() > ARI_LEN {
        return Err(MadError::AriTooLong(ari.len()));
    }
    m[at..at + ari.len()].copy_from_slice(ari);
    Ok(())
}

// ---------------------------------------------------------------------------------------

/// The common MAD header (IBTA 13.4.3), the first 24 bytes of every MAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MadHeader {
    /// Base version: 1 ([`MAD_BASE_VERSION`]).
    pub base_version: u8,
    /// Management class: [`MGMT_CLASS_CM`] for the CM.
    pub mgmt_class: u8,
    /// Class version: [`CM_CLASS_VERSION`] for the CM.
    pub class_version: u8,
    /// Method, response bit included ([`MAD_METHOD_SEND`] for every CM message).
    pub method: u8,
    /// Status (0 in CM messages).
    pub status: u16,
    /// Class-specific field (0 in CM messages).
    pub class_specific: u16,
    /// Transaction ID: a REQ's TID is reused by the REP/REJ/MRA/RTU answering it; `ib_cm`
    /// puts its agent's high 32 bits above a per-sender counter.
    pub transaction_id: u64,
    /// Attribute ID: which message ([`CM_ATTR_REQ`], …).
    pub attribute_id: u16,
    /// Attribute modifier (the ECE options in a REQ/REP, else 0).
    pub attribute_modifier: u32,
}

impl Default for MadHeader {
    /// A CM Send header: base version 1, class CM version 2, everything else zero.
    fn default() -> Self {
        MadHeader {
            base_version: MAD_BASE_VERSION,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: MAD_METHOD_SEND,
            status: 0,
            class_specific: 0,
            transaction_id: 0,
            attribute_id: 0,
            attribute_modifier: 0,
        }
    }
}

impl MadHeader {
    /// A CM header for `attribute_id` with transaction ID `tid` (method Send).
    pub fn cm(attribute_id: u16, tid: u64) -> MadHeader {
        MadHeader {
            transaction_id: tid,
            attribute_id,
            ..MadHeader::default()
        }
    }

    /// Read the first [`MAD_HEADER_LEN`] bytes of `buf` (any class, any version; the two
    /// reserved bytes are ignored).
    pub fn parse(buf: &[u8]) -> Result<MadHeader, MadError> {
        let Some(h) = buf.get(..MAD_HEADER_LEN) else {
            return Err(MadError::Truncated {
                needed: MAD_HEADER_LEN,
                got: buf.len(),
            });
        };
        let u16_at = |at: usize| u16::from_be_bytes([h[at], h[at + 1]]);
        let u32_at = |at: usize| u32::from_be_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
        Ok(MadHeader {
            base_version: h[0],
            mgmt_class: h[1],
            class_version: h[2],
            method: h[3],
            status: u16_at(4),
            class_specific: u16_at(6),
            transaction_id: (u64::from(u32_at(8)) << 32) | u64::from(u32_at(12)),
            attribute_id: u16_at(16),
            attribute_modifier: u32_at(20),
        })
    }

    /// Write the header into the first [`MAD_HEADER_LEN`] bytes of `buf` (reserved bytes
    /// zero).
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), MadError> {
        let got = buf.len();
        let Some(h) = buf.get_mut(..MAD_HEADER_LEN) else {
            return Err(MadError::Truncated {
                needed: MAD_HEADER_LEN,
                got,
            });
        };
        h[0] = self.base_version;
        h[1] = self.mgmt_class;
        h[2] = self.class_version;
        h[3] = self.method;
        h[4..6].copy_from_slice(&self.status.to_be_bytes());
        h[6..8].copy_from_slice(&self.class_specific.to_be_bytes());
        h[8..16].copy_from_slice(&self.transaction_id.to_be_bytes());
        h[16..18].copy_from_slice(&self.attribute_id.to_be_bytes());
        h[18..20].fill(0);
        h[20..24].copy_from_slice(&self.attribute_modifier.to_be_bytes());
        Ok(())
    }

    /// Whether the method's response bit is set.
    pub fn is_response(&self) -> bool {
        self.method & MAD_METHOD_RESPONSE != 0
    }
}

/// Which message an MRA acknowledges or a REJ rejects (the 2-bit "message MRAed" /
/// "message rejected" field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MsgRef {
    /// The REQ (0).
    #[default]
    Req,
    /// The REP (1).
    Rep,
    /// MRA: a LAP; REJ: no message, e.g. a REJ on timeout (2).
    Other,
    /// The reserved value 3, kept so that parsing is total.
    Reserved,
}

impl MsgRef {
    /// The 2-bit wire value.
    pub fn value(self) -> u8 {
        match self {
            MsgRef::Req => 0,
            MsgRef::Rep => 1,
            MsgRef::Other => 2,
            MsgRef::Reserved => 3,
        }
    }

    /// From the low 2 bits of `v`.
    pub fn from_value(v: u8) -> MsgRef {
        match v & 3 {
            0 => MsgRef::Req,
            1 => MsgRef::Rep,
            2 => MsgRef::Other,
            _ => MsgRef::Reserved,
        }
    }
}

/// A GID (16 bytes, network order). RoCEv2 GIDs are IPv6 addresses, IPv4 ones as
/// IPv4-mapped (`::ffff:a.b.c.d`): see [`gid_to_ip`] / [`ip_to_gid`].
pub type Gid = [u8; 16];

/// The IP address a RoCEv2 GID stands for: IPv4 for an IPv4-mapped GID, else IPv6.
pub fn gid_to_ip(gid: &Gid) -> IpAddr {
    let v6 = Ipv6Addr::from(*gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// The RoCEv2 GID of an IP address (IPv4-mapped for IPv4).
pub fn ip_to_gid(ip: IpAddr) -> Gid {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// A CM timeout field (response timeouts, local ACK timeout, MRA service timeout, target
/// ACK delay) as a duration: 4.096 µs × 2^`exp`. Exponents above 31 (wider than the 5-bit
/// field) count as 31.
pub fn timeout_duration(exp: u8) -> Duration {
    Duration::from_nanos(4096u64 << exp.min(31))
}

/// The smallest 5-bit exponent whose [`timeout_duration`] is at least `d` (31 at most).
pub fn timeout_exponent(d: Duration) -> u8 {
    (0u8..31).find(|&e| timeout_duration(e) >= d).unwrap_or(31)
}

/// One path of a REQ: the primary (IBTA bytes 52–95) or the alternate (96–139).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CmPath {
    /// Local port LID (0xffff on RoCE).
    pub local_lid: u16,
    /// Remote port LID (0xffff on RoCE).
    pub remote_lid: u16,
    /// Local port GID.
    pub local_gid: Gid,
    /// Remote port GID.
    pub remote_gid: Gid,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits, IBTA rate encoding; 0 = port current).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local.
    pub subnet_local: bool,
    /// Local ACK timeout (5-bit exponent, see [`timeout_duration`]).
    pub local_ack_timeout: u8,
}

impl CmPath {
    /// Read the 44-byte path at MAD offset `at`.
    fn read(m: &[u8; MAD_LEN], at: usize) -> CmPath {
        CmPath {
            local_lid: rd16(m, at),
            remote_lid: rd16(m, at + 2),
            local_gid: rd128(m, at + 4),
            remote_gid: rd128(m, at + 20),
            flow_label: rd32(m, at + 36) >> 12,
            packet_rate: rdbits(m, at + 39, 2, 6),
            traffic_class: rd8(m, at + 40),
            hop_limit: rd8(m, at + 41),
            sl: rdbits(m, at + 42, 0, 4),
            subnet_local: rdbits(m, at + 42, 4, 1) != 0,
            local_ack_timeout: rdbits(m, at + 43, 0, 5),
        }
    }

    fn write(&self, m: &mut [u8; MAD_LEN], at: usize) -> Result<(), MadError> {
        wr16(m, at, self.local_lid);
        wr16(m, at + 2, self.remote_lid);
        wr128(m, at + 4, &self.local_gid);
        wr128(m, at + 20, &self.remote_gid);
        check("flow_label", u64::from(self.flow_label), 20)?;
        wr32(m, at + 36, self.flow_label << 12);
        wrbits(m, at + 39, 2, 6, self.packet_rate, "packet_rate")?;
        wr8(m, at + 40, self.traffic_class);
        wr8(m, at + 41, self.hop_limit);
        wrbits(m, at + 42, 0, 4, self.sl, "sl")?;
        wrbits(
            m,
            at + 42,
            4,
            1,
            u8::from(self.subnet_local),
            "subnet_local",
        )?;
        wrbits(
            m,
            at + 43,
            0,
            5,
            self.local_ack_timeout,
            "local_ack_timeout",
        )
    }
}

/// Offset of the first byte after the MAD header.
const D: usize = MAD_HEADER_LEN;

/// ConnectRequest (REQ, IBTA table 106).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct CmReq {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// ECE vendor ID (24 bits; 0 without ECE).
    pub vendor_id: u32,
    /// Service ID (`rdma_cm`: port space and port, see [`CmaIpHeader`]).
    pub service_id: u64,
    /// The sender's CA GUID.
    pub local_ca_guid: u64,
    /// The sender's Q_Key (RD only; 0 for RC/UC).
    pub local_qkey: u32,
    /// The sender's QPN (24 bits).
    pub local_qpn: u32,
    /// Responder resources: RDMA reads/atomics the sender accepts in flight.
    pub responder_resources: u8,
    /// The sender's EE context number (24 bits, RD only).
    pub local_eecn: u32,
    /// Initiator depth: RDMA reads/atomics the sender issues in flight.
    pub initiator_depth: u8,
    /// The remote EE context number (24 bits, RD only).
    pub remote_eecn: u32,
    /// Remote CM response timeout (5-bit exponent): how long the sender waits for the
    /// receiver's answer (REP, REJ or MRA) before resending the REQ.
    pub remote_cm_response_timeout: u8,
    /// Transport service type (2 bits, [`TRANSPORT_RC`] …).
    pub transport_service_type: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// The sender's starting PSN (24 bits).
    pub starting_psn: u32,
    /// Local CM response timeout (5-bit exponent): how long the sender itself takes to
    /// answer (the receiver's wait for the RTU before resending the REP).
    pub local_cm_response_timeout: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// Partition key.
    pub partition_key: u16,
    /// Path packet payload MTU (4 bits: 1 = 256 … 5 = 4096).
    pub path_mtu: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR retry count (3 bits; 7 = infinite).
    pub rnr_retry_count: u8,
    /// Max CM retries (4 bits).
    pub max_cm_retries: u8,
    /// The sender's QP uses an SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits; XRC when the service type is
    /// [`TRANSPORT_EXTENDED`]).
    pub extended_transport_type: u8,
    /// The primary path.
    pub primary_path: CmPath,
    /// The alternate path (all zero when there is none).
    pub alternate_path: CmPath,
    /// SAP supported.
    pub sap_supported: bool,
    /// Private data, at most [`CmReq::PRIVATE_DATA_LEN`] bytes (parsed: the whole field).
    pub private_data: Vec<u8>,
}

impl CmReq {
    /// Size of the REQ private-data field.
    pub const PRIVATE_DATA_LEN: usize = 92;
    const PD: usize = D + 140;

    fn read(m: &[u8; MAD_LEN]) -> CmReq {
        CmReq {
            local_comm_id: rd32(m, D),
            vendor_id: rd24(m, D + 5),
            service_id: rd64(m, D + 8),
            local_ca_guid: rd64(m, D + 16),
            local_qkey: rd32(m, D + 28),
            local_qpn: rd24(m, D + 32),
            responder_resources: rd8(m, D + 35),
            local_eecn: rd24(m, D + 36),
            initiator_depth: rd8(m, D + 39),
            remote_eecn: rd24(m, D + 40),
            remote_cm_response_timeout: rdbits(m, D + 43, 0, 5),
            transport_service_type: rdbits(m, D + 43, 5, 2),
            end_to_end_flow_control: rdbits(m, D + 43, 7, 1) != 0,
            starting_psn: rd24(m, D + 44),
            local_cm_response_timeout: rdbits(m, D + 47, 0, 5),
            retry_count: rdbits(m, D + 47, 5, 3),
            partition_key: rd16(m, D + 48),
            path_mtu: rdbits(m, D + 50, 0, 4),
            rdc_exists: rdbits(m, D + 50, 4, 1) != 0,
            rnr_retry_count: rdbits(m, D + 50, 5, 3),
            max_cm_retries: rdbits(m, D + 51, 0, 4),
            srq: rdbits(m, D + 51, 4, 1) != 0,
            extended_transport_type: rdbits(m, D + 51, 5, 3),
            primary_path: CmPath::read(m, D + 52),
            alternate_path: CmPath::read(m, D + 96),
            sap_supported: rdbits(m, D + 139, 5, 1) != 0,
            private_data: rd_private(m, Self::PD),
        }
    }

    fn write(&self, m: &mut [u8; MAD_LEN]) -> Result<(), MadError> {
        wr32(m, D, self.local_comm_id);
        wr24(m, D + 5, self.vendor_id, "vendor_id")?;
        wr64(m, D + 8, self.service_id);
        wr64(m, D + 16, self.local_ca_guid);
        wr32(m, D + 28, self.local_qkey);
        wr24(m, D + 32, self.local_qpn, "local_qpn")?;
        wr8(m, D + 35, self.responder_resources);
        wr24(m, D + 36, self.local_eecn, "local_eecn")?;
        wr8(m, D + 39, self.initiator_depth);
        wr24(m, D + 40, self.remote_eecn, "remote_eecn")?;
        let t = self.remote_cm_response_timeout;
        wrbits(m, D + 43, 0, 5, t, "remote_cm_response_timeout")?;
        let t = self.transport_service_type;
        wrbits(m, D + 43, 5, 2, t, "transport_service_type")?;
        let f = u8::from(self.end_to_end_flow_control);
        wrbits(m, D + 43, 7, 1, f, "end_to_end_flow_control")?;
        wr24(m, D + 44, self.starting_psn, "starting_psn")?;
        let t = self.local_cm_response_timeout;
        wrbits(m, D + 47, 0, 5, t, "local_cm_response_timeout")?;
        wrbits(m, D + 47, 5, 3, self.retry_count, "retry_count")?;
        wr16(m, D + 48, self.partition_key);
        wrbits(m, D + 50, 0, 4, self.path_mtu, "path_mtu")?;
        wrbits(m, D + 50, 4, 1, u8::from(self.rdc_exists), "rdc_exists")?;
        wrbits(m, D + 50, 5, 3, self.rnr_retry_count, "rnr_retry_count")?;
        wrbits(m, D + 51, 0, 4, self.max_cm_retries, "max_cm_retries")?;
        wrbits(m, D + 51, 4, 1, u8::from(self.srq), "srq")?;
        let x = self.extended_transport_type;
        wrbits(m, D + 51, 5, 3, x, "extended_transport_type")?;
        self.primary_path.write(m, D + 52)?;
        self.alternate_path.write(m, D + 96)?;
        let s = u8::from(self.sap_supported);
        wrbits(m, D + 139, 5, 1, s, "sap_supported")?;
        wr_bytes(m, Self::PD, Self::PRIVATE_DATA_LEN, &self.private_data)
    }
}

/// MsgRcptAck (MRA, IBTA table 107): "your message arrived, the answer takes a while".
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct CmMra {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID (for an MRA of a REQ: the REQ's local comm ID).
    pub remote_comm_id: u32,
    /// Which message is acknowledged (REQ, REP or LAP).
    pub message_mraed: MsgRef,
    /// Service timeout (5-bit exponent): how long the sender needs to answer.
    pub service_timeout: u8,
    /// Private data, at most [`CmMra::PRIVATE_DATA_LEN`] bytes.
    pub private_data: Vec<u8>,
}

impl CmMra {
    /// Size of the MRA private-data field.
    pub const PRIVATE_DATA_LEN: usize = 222;
    const PD: usize = D + 10;

    fn read(m: &[u8; MAD_LEN]) -> CmMra {
        CmMra {
            local_comm_id: rd32(m, D),
            remote_comm_id: rd32(m, D + 4),
            message_mraed: MsgRef::from_value(rdbits(m, D + 8, 0, 2)),
            service_timeout: rdbits(m, D + 9, 0, 5),
            private_data: rd_private(m, Self::PD),
        }
    }

    fn write(&self, m: &mut [u8; MAD_LEN]) -> Result<(), MadError> {
        wr32(m, D, self.local_comm_id);
        wr32(m, D + 4, self.remote_comm_id);
        wrbits(m, D + 8, 0, 2, self.message_mraed.value(), "message_mraed")?;
        wrbits(m, D + 9, 0, 5, self.service_timeout, "service_timeout")?;
        wr_bytes(m, Self::PD, Self::PRIVATE_DATA_LEN, &self.private_data)
    }
}

/// ConnectReject (REJ, IBTA table 108).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct CmRej {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID (0 if unknown, e.g. rejecting a REQ).
    pub remote_comm_id: u32,
    /// Which message is rejected (REQ, REP, or none).
    pub message_rejected: MsgRef,
    /// Reason ([`rej_reason`]).
    pub reason: u16,
    /// Additional rejection information, at most [`ARI_LEN`] bytes; its length is the
    /// "rejected info length" field.
    pub ari: Vec<u8>,
    /// Private data, at most [`CmRej::PRIVATE_DATA_LEN`] bytes.
    pub private_data: Vec<u8>,
}

impl CmRej {
    /// Size of the REJ private-data field.
    pub const PRIVATE_DATA_LEN: usize = 148;
    const PD: usize = D + 84;

    fn read(m: &[u8; MAD_LEN]) -> Result<CmRej, MadError> {
        Ok(CmRej {
            local_comm_id: rd32(m, D),
            remote_comm_id: rd32(m, D + 4),
            message_rejected: MsgRef::from_value(rdbits(m, D + 8, 0, 2)),
            reason: rd16(m, D + 10),
            ari: rd_ari(m, D + 12, rdbits(m, D + 9, 0, 7))?,
            private_data: rd_private(m, Self::PD),
        })
    }

    fn write(&self, m: &mut [u8; MAD_LEN]) -> Result<(), MadError> {
        wr32(m, D, self.local_comm_id);
        wr32(m, D + 4, self.remote_comm_id);
        let r = self.message_rejected.value();
        wrbits(m, D + 8, 0, 2, r, "message_rejected")?;
        wr_ari(m, D + 12, &self.ari)?;
        // ARI_LEN < 128: the length fits the 7-bit field.
        wrbits(m, D + 9, 0, 7, self.ari.len() as u8, "rejected_info_length")?;
        wr16(m, D + 10, self.reason);
        wr_bytes(m, Self::PD, Self::PRIVATE_DATA_LEN, &self.private_data)
    }
}

/// ConnectReply (REP, IBTA table 110).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct CmRep {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The REQ sender's communication ID.
    pub remote_comm_id: u32,
    /// The sender's Q_Key (RD only).
    pub local_qkey: u32,
    /// The sender's QPN (24 bits).
    pub local_qpn: u32,
    /// ECE vendor ID (24 bits, carried in three separate bytes; 0 without ECE).
    pub vendor_id: u32,
    /// The sender's EE context number (24 bits, RD only).
    pub local_eecn: u32,
    /// The sender's starting PSN (24 bits).
    pub starting_psn: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Target ACK delay (5-bit exponent).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits: 0 accepted, 1 not supported, 2 rejected).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// The sender's QP uses an SRQ.
    pub srq: bool,
    /// The sender's CA GUID.
    pub local_ca_guid: u64,
    /// Private data, at most [`CmRep::PRIVATE_DATA_LEN`] bytes.
    pub private_data: Vec<u8>,
}

impl CmRep {
    /// Size of the REP private-data field.
    pub const PRIVATE_DATA_LEN: usize = 196;
    const PD: usize = D + 36;

    fn read(m: &[u8; MAD_LEN]) -> CmRep {
        CmRep {
            local_comm_id: rd32(m, D),
            remote_comm_id: rd32(m, D + 4),
            local_qkey: rd32(m, D + 8),
            local_qpn: rd24(m, D + 12),
            vendor_id: u32::from_be_bytes([0, m[D + 15], m[D + 19], m[D + 23]]),
            local_eecn: rd24(m, D + 16),
            starting_psn: rd24(m, D + 20),
            responder_resources: rd8(m, D + 24),
            initiator_depth: rd8(m, D + 25),
            target_ack_delay: rdbits(m, D + 26, 0, 5),
            failover_accepted: rdbits(m, D + 26, 5, 2),
            end_to_end_flow_control: rdbits(m, D + 26, 7, 1) != 0,
            rnr_retry_count: rdbits(m, D + 27, 0, 3),
            srq: rdbits(m, D + 27, 3, 1) != 0,
            local_ca_guid: rd64(m, D + 28),
            private_data: rd_private(m, Self::PD),
        }
    }

    fn write(&self, m: &mut [u8; MAD_LEN]) -> Result<(), MadError> {
        wr32(m, D, self.local_comm_id);
        wr32(m, D + 4, self.remote_comm_id);
        wr32(m, D + 8, self.local_qkey);
        wr24(m, D + 12, self.local_qpn, "local_qpn")?;
        check("vendor_id", u64::from(self.vendor_id), 24)?;
        let [_, h, mid, l] = self.vendor_id.to_be_bytes();
        wr8(m, D + 15, h);
        wr24(m, D + 16, self.local_eecn, "local_eecn")?;
        wr8(m, D + 19, mid);
        wr24(m, D + 20, self.starting_psn, "starting_psn")?;
        wr8(m, D + 23, l);
        wr8(m, D + 24, self.responder_resources);
        wr8(m, D + 25, self.initiator_depth);
        wrbits(m, D + 26, 0, 5, self.target_ack_delay, "target_ack_delay")?;
        let f = self.failover_accepted;
        wrbits(m, D + 26, 5, 2, f, "failover_accepted")?;
        let f = u8::from(self.end_to_end_flow_control);
        wrbits(m, D + 26, 7, 1, f, "end_to_end_flow_control")?;
        wrbits(m, D + 27, 0, 3, self.rnr_retry_count, "rnr_retry_count")?;
        wrbits(m, D + 27, 3, 1, u8::from(self.srq), "srq")?;
        wr64(m, D + 28, self.local_ca_guid);
        wr_bytes(m, Self::PD, Self::PRIVATE_DATA_LEN, &self.private_data)
    }
}

/// ReadyToUse (RTU, IBTA table 111).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct CmRtu {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Private data, at most [`CmRtu::PRIVATE_DATA_LEN`] bytes.
    pub private_data: Vec<u8>,
}

impl CmRtu {
    /// Size of the RTU private-data field.
    pub const PRIVATE_DATA_LEN: usize = 224;
}

/// DisconnectRequest (DREQ, IBTA table 112).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct CmDreq {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// The receiver's QPN or EECN (24 bits).
    pub remote_qpn_eecn: u32,
    /// Private data, at most [`CmDreq::PRIVATE_DATA_LEN`] bytes.
    pub private_data: Vec<u8>,
}

impl CmDreq {
    /// Size of the DREQ private-data field.
    pub const PRIVATE_DATA_LEN: usize = 220;
    const PD: usize = D + 12;
}

/// DisconnectReply (DREP, IBTA table 113).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct CmDrep {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Private data, at most [`CmDrep::PRIVATE_DATA_LEN`] bytes.
    pub private_data: Vec<u8>,
}

impl CmDrep {
    /// Size of the DREP private-data field.
    pub const PRIVATE_DATA_LEN: usize = 224;
}

/// ServiceIDResReq (SIDR REQ, IBTA table 119): which UD QP serves this service ID?
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct CmSidrReq {
    /// The sender's request ID (the SIDR REP echoes it).
    pub request_id: u32,
    /// Partition key.
    pub partition_key: u16,
    /// Service ID.
    pub service_id: u64,
    /// Private data, at most [`CmSidrReq::PRIVATE_DATA_LEN`] bytes (`rdma_cm` starts it
    /// with a [`CmaIpHeader`]).
    pub private_data: Vec<u8>,
}

impl CmSidrReq {
    /// Size of the SIDR REQ private-data field.
    pub const PRIVATE_DATA_LEN: usize = 216;
    const PD: usize = D + 16;
}

/// ServiceIDResReqResp (SIDR REP, IBTA table 120).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct CmSidrRep {
    /// The SIDR REQ's request ID.
    pub request_id: u32,
    /// Status ([`SIDR_SUCCESS`] …).
    pub status: u8,
    /// ECE vendor ID (24 bits, carried as 16 + 8 bits; 0 without ECE).
    pub vendor_id: u32,
    /// The serving UD QP's number (24 bits).
    pub qpn: u32,
    /// Service ID.
    pub service_id: u64,
    /// The serving QP's Q_Key.
    pub qkey: u32,
    /// Additional information, at most [`ARI_LEN`] bytes; its length is the "additional
    /// information length" field.
    pub ari: Vec<u8>,
    /// Private data, at most [`CmSidrRep::PRIVATE_DATA_LEN`] bytes.
    pub private_data: Vec<u8>,
}

impl CmSidrRep {
    /// Size of the SIDR REP private-data field.
    pub const PRIVATE_DATA_LEN: usize = 136;
    const PD: usize = D + 96;

    fn read(m: &[u8; MAD_LEN]) -> Result<CmSidrRep, MadError> {
        Ok(CmSidrRep {
            request_id: rd32(m, D),
            status: rd8(m, D + 4),
            vendor_id: (u32::from(rd16(m, D + 6)) << 8) | u32::from(rd8(m, D + 11)),
            qpn: rd24(m, D + 8),
            service_id: rd64(m, D + 12),
            qkey: rd32(m, D + 20),
            ari: rd_ari(m, D + 24, rd8(m, D + 5))?,
            private_data: rd_private(m, Self::PD),
        })
    }

    fn write(&self, m: &mut [u8; MAD_LEN]) -> Result<(), MadError> {
        wr32(m, D, self.request_id);
        wr8(m, D + 4, self.status);
        wr_ari(m, D + 24, &self.ari)?;
        wr8(m, D + 5, self.ari.len() as u8);
        check("vendor_id", u64::from(self.vendor_id), 24)?;
        wr16(m, D + 6, (self.vendor_id >> 8) as u16);
        wr24(m, D + 8, self.qpn, "qpn")?;
        wr8(m, D + 11, self.vendor_id as u8);
        wr64(m, D + 12, self.service_id);
        wr32(m, D + 20, self.qkey);
        wr_bytes(m, Self::PD, Self::PRIVATE_DATA_LEN, &self.private_data)
    }
}

/// One CM message: the body of a CM MAD.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CmMessage {
    /// ConnectRequest.
    Req(CmReq),
    /// MsgRcptAck.
    Mra(CmMra),
    /// ConnectReject.
    Rej(CmRej),
    /// ConnectReply.
    Rep(CmRep),
    /// ReadyToUse.
    Rtu(CmRtu),
    /// DisconnectRequest.
    Dreq(CmDreq),
    /// DisconnectReply.
    Drep(CmDrep),
    /// ServiceIDResReq.
    SidrReq(CmSidrReq),
    /// ServiceIDResReqResp.
    SidrRep(CmSidrRep),
}

impl CmMessage {
    /// The attribute ID that carries this message.
    pub fn attribute_id(&self) -> u16 {
        match self {
            CmMessage::Req(_) => CM_ATTR_REQ,
            CmMessage::Mra(_) => CM_ATTR_MRA,
            CmMessage::Rej(_) => CM_ATTR_REJ,
            CmMessage::Rep(_) => CM_ATTR_REP,
            CmMessage::Rtu(_) => CM_ATTR_RTU,
            CmMessage::Dreq(_) => CM_ATTR_DREQ,
            CmMessage::Drep(_) => CM_ATTR_DREP,
            CmMessage::SidrReq(_) => CM_ATTR_SIDR_REQ,
            CmMessage::SidrRep(_) => CM_ATTR_SIDR_REP,
        }
    }

    /// The message's name as the IBTA writes it ("REQ", "SIDR_REP", …).
    pub fn name(&self) -> &'static str {
        match self {
            CmMessage::Req(_) => "REQ",
            CmMessage::Mra(_) => "MRA",
            CmMessage::Rej(_) => "REJ",
            CmMessage::Rep(_) => "REP",
            CmMessage::Rtu(_) => "RTU",
            CmMessage::Dreq(_) => "DREQ",
            CmMessage::Drep(_) => "DREP",
            CmMessage::SidrReq(_) => "SIDR_REQ",
            CmMessage::SidrRep(_) => "SIDR_REP",
        }
    }

    /// The private data.
    pub fn private_data(&self) -> &[u8] {
        match self {
            CmMessage::Req(m) => &m.private_data,
            CmMessage::Mra(m) => &m.private_data,
            CmMessage::Rej(m) => &m.private_data,
            CmMessage::Rep(m) => &m.private_data,
            CmMessage::Rtu(m) => &m.private_data,
            CmMessage::Dreq(m) => &m.private_data,
            CmMessage::Drep(m) => &m.private_data,
            CmMessage::SidrReq(m) => &m.private_data,
            CmMessage::SidrRep(m) => &m.private_data,
        }
    }

    /// The size of this message's private-data field.
    pub fn private_data_len(&self) -> usize {
        match self {
            CmMessage::Req(_) => CmReq::PRIVATE_DATA_LEN,
            CmMessage::Mra(_) => CmMra::PRIVATE_DATA_LEN,
            CmMessage::Rej(_) => CmRej::PRIVATE_DATA_LEN,
            CmMessage::Rep(_) => CmRep::PRIVATE_DATA_LEN,
            CmMessage::Rtu(_) => CmRtu::PRIVATE_DATA_LEN,
            CmMessage::Dreq(_) => CmDreq::PRIVATE_DATA_LEN,
            CmMessage::Drep(_) => CmDrep::PRIVATE_DATA_LEN,
            CmMessage::SidrReq(_) => CmSidrReq::PRIVATE_DATA_LEN,
            CmMessage::SidrRep(_) => CmSidrRep::PRIVATE_DATA_LEN,
        }
    }

    /// The sender's communication ID (the request ID for SIDR messages).
    pub fn local_comm_id(&self) -> u32 {
        match self {
            CmMessage::Req(m) => m.local_comm_id,
            CmMessage::Mra(m) => m.local_comm_id,
            CmMessage::Rej(m) => m.local_comm_id,
            CmMessage::Rep(m) => m.local_comm_id,
            CmMessage::Rtu(m) => m.local_comm_id,
            CmMessage::Dreq(m) => m.local_comm_id,
            CmMessage::Drep(m) => m.local_comm_id,
            CmMessage::SidrReq(m) => m.request_id,
            CmMessage::SidrRep(m) => m.request_id,
        }
    }

    /// The receiver's communication ID; `None` for REQ and the SIDR messages, which carry
    /// none.
    pub fn remote_comm_id(&self) -> Option<u32> {
        match self {
            CmMessage::Mra(m) => Some(m.remote_comm_id),
            CmMessage::Rej(m) => Some(m.remote_comm_id),
            CmMessage::Rep(m) => Some(m.remote_comm_id),
            CmMessage::Rtu(m) => Some(m.remote_comm_id),
            CmMessage::Dreq(m) => Some(m.remote_comm_id),
            CmMessage::Drep(m) => Some(m.remote_comm_id),
            CmMessage::Req(_) | CmMessage::SidrReq(_) | CmMessage::SidrRep(_) => None,
        }
    }

    fn read(attribute_id: u16, m: &[u8; MAD_LEN]) -> Result<CmMessage, MadError> {
        let comm_ids = |m: &[u8; MAD_LEN]| (rd32(m, D), rd32(m, D + 4));
        Ok(match attribute_id {
            CM_ATTR_REQ => CmMessage::Req(CmReq::read(m)),
            CM_ATTR_MRA => CmMessage::Mra(CmMra::read(m)),
            CM_ATTR_REJ => CmMessage::Rej(CmRej::read(m)?),
            CM_ATTR_REP => CmMessage::Rep(CmRep::read(m)),
            CM_ATTR_RTU => {
                let (local_comm_id, remote_comm_id) = comm_ids(m);
                CmMessage::Rtu(CmRtu {
                    local_comm_id,
                    remote_comm_id,
                    private_data: rd_private(m, D + 8),
                })
            }
            CM_ATTR_DREQ => {
                let (local_comm_id, remote_comm_id) = comm_ids(m);
                CmMessage::Dreq(CmDreq {
                    local_comm_id,
                    remote_comm_id,
                    remote_qpn_eecn: rd24(m, D + 8),
                    private_data: rd_private(m, CmDreq::PD),
                })
            }
            CM_ATTR_DREP => {
                let (local_comm_id, remote_comm_id) = comm_ids(m);
                CmMessage::Drep(CmDrep {
                    local_comm_id,
                    remote_comm_id,
                    private_data: rd_private(m, D + 8),
                })
            }
            CM_ATTR_SIDR_REQ => CmMessage::SidrReq(CmSidrReq {
                request_id: rd32(m, D),
                partition_key: rd16(m, D + 4),
                service_id: rd64(m, D + 8),
                private_data: rd_private(m, CmSidrReq::PD),
            }),
            CM_ATTR_SIDR_REP => CmMessage::SidrRep(CmSidrRep::read(m)?),
            other => return Err(MadError::UnknownAttribute(other)),
        })
    }

    fn write(&self, m: &mut [u8; MAD_LEN]) -> Result<(), MadError> {
        match self {
            CmMessage::Req(r) => r.write(m),
            CmMessage::Mra(r) => r.write(m),
            CmMessage::Rej(r) => r.write(m),
            CmMessage::Rep(r) => r.write(m),
            CmMessage::Rtu(r) => {
                wr32(m, D, r.local_comm_id);
                wr32(m, D + 4, r.remote_comm_id);
                wr_bytes(m, D + 8, CmRtu::PRIVATE_DATA_LEN, &r.private_data)
            }
            CmMessage::Dreq(r) => {
                wr32(m, D, r.local_comm_id);
                wr32(m, D + 4, r.remote_comm_id);
                wr24(m, D + 8, r.remote_qpn_eecn, "remote_qpn_eecn")?;
                wr_bytes(m, CmDreq::PD, CmDreq::PRIVATE_DATA_LEN, &r.private_data)
            }
            CmMessage::Drep(r) => {
                wr32(m, D, r.local_comm_id);
                wr32(m, D + 4, r.remote_comm_id);
                wr_bytes(m, D + 8, CmDrep::PRIVATE_DATA_LEN, &r.private_data)
            }
            CmMessage::SidrReq(r) => {
                wr32(m, D, r.request_id);
                wr16(m, D + 4, r.partition_key);
                wr64(m, D + 8, r.service_id);
                let pd = &r.private_data;
                wr_bytes(m, CmSidrReq::PD, CmSidrReq::PRIVATE_DATA_LEN, pd)
            }
            CmMessage::SidrRep(r) => r.write(m),
        }
    }
}

macro_rules! from_message {
    ($($t:ident => $v:ident),* $(,)?) => {$(
        impl From<$t> for CmMessage {
            fn from(m: $t) -> CmMessage {
                CmMessage::$v(m)
            }
        }
    )*};
}

from_message!(
    CmReq => Req,
    CmMra => Mra,
    CmRej => Rej,
    CmRep => Rep,
    CmRtu => Rtu,
    CmDreq => Dreq,
    CmDrep => Drep,
    CmSidrReq => SidrReq,
    CmSidrRep => SidrRep,
);

/// A whole CM MAD: header and message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmMad {
    /// The common header. Its attribute ID must be `message.attribute_id()` ([`CmMad::new`]
    /// and [`CmMad::reply`] set it; [`CmMad::emit`] refuses a mismatch).
    pub header: MadHeader,
    /// The message.
    pub message: CmMessage,
}

impl CmMad {
    /// A CM MAD with a Send header for `message`, transaction ID `tid`.
    pub fn new(tid: u64, message: impl Into<CmMessage>) -> CmMad {
        let message = message.into();
        CmMad {
            header: MadHeader::cm(message.attribute_id(), tid),
            message,
        }
    }

    /// A MAD answering `self` (a REP, REJ or MRA to a REQ, an RTU to a REP, a DREP to a
    /// DREQ, a SIDR REP to a SIDR REQ): same transaction ID, method Send.
    pub fn reply(&self, message: impl Into<CmMessage>) -> CmMad {
        CmMad::new(self.header.transaction_id, message)
    }

    /// Parse a CM MAD from the first [`MAD_LEN`] bytes of `buf` (a GSI UD payload; bytes
    /// beyond [`MAD_LEN`] are ignored). The base version must be 1 and the class CM; the
    /// class version and method are kept for the caller to judge. Never panics.
    pub fn parse(buf: &[u8]) -> Result<CmMad, MadError> {
        let Some(m) = buf
            .get(..MAD_LEN)
            .and_then(|m| <&[u8; MAD_LEN]>::try_from(m).ok())
        else {
            return Err(MadError::Truncated {
                needed: MAD_LEN,
                got: buf.len(),
            });
        };
        let header = MadHeader::parse(m)?;
        if header.base_version != MAD_BASE_VERSION {
            return Err(MadError::BaseVersion(header.base_version));
        }
        if header.mgmt_class != MGMT_CLASS_CM {
            return Err(MadError::NotCm(header.mgmt_class));
        }
        let message = CmMessage::read(header.attribute_id, m)?;
        Ok(CmMad { header, message })
    }

    /// The MAD's 256 bytes: reserved bits zero, private data zero padded. Fails (never
    /// panics) when a field does not fit its wire width, the private data or ARI is too
    /// long, or the header's attribute ID is not the message's.
    pub fn emit(&self) -> Result<[u8; MAD_LEN], MadError> {
        let message = self.message.attribute_id();
        if self.header.attribute_id != message {
            return Err(MadError::AttributeMismatch {
                header: self.header.attribute_id,
                message,
            });
        }
        let mut m = [0u8; MAD_LEN];
        self.header.emit(&mut m)?;
        self.message.write(&mut m)?;
        Ok(m)
    }

    /// [`emit`](CmMad::emit) into the first [`MAD_LEN`] bytes of `buf`.
    pub fn emit_into(&self, buf: &mut [u8]) -> Result<(), MadError> {
        let got = buf.len();
        let Some(out) = buf.get_mut(..MAD_LEN) else {
            return Err(MadError::Truncated {
                needed: MAD_LEN,
                got,
            });
        };
        out.copy_from_slice(&self.emit()?);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------

/// `rdma_cm`'s IP addressing header (`struct cma_hdr`), the first 36 bytes of the private
/// data of a REQ or SIDR REQ for the IP port spaces (TCP, UDP, IPoIB): the consumer's
/// private data follows it.
///
/// Wire layout: byte 0 the CMA version (0x00), byte 1 the IP version in its high nibble,
/// bytes 2–3 the source port (big-endian), bytes 4–19 the source address, bytes 20–35 the
/// destination address. An IPv4 address takes the last 4 bytes of its 16, after 12 zero
/// bytes (not IPv4-mapped). The destination port is not here: it is the low 16 bits of the
/// service ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmaIpHeader {
    /// CMA version ([`CmaIpHeader::VERSION`]).
    pub cma_version: u8,
    /// The active side's source port.
    pub src_port: u16,
    /// The active side's address.
    pub src: IpAddr,
    /// The passive side's address.
    pub dst: IpAddr,
}

impl Default for CmaIpHeader {
    fn default() -> Self {
        CmaIpHeader {
            cma_version: CmaIpHeader::VERSION,
            src_port: 0,
            src: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            dst: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        }
    }
}

impl CmaIpHeader {
    /// Length on the wire.
    pub const LEN: usize = 36;
    /// The CMA version `rdma_cm` writes and requires.
    pub const VERSION: u8 = 0x00;

    /// The IP version, 4 or 6 (that of `src`).
    pub fn ip_version(&self) -> u8 {
        if self.src.is_ipv4() { 4 } else { 6 }
    }

    /// Read from the first [`CmaIpHeader::LEN`] bytes of `buf` (a REQ's private data); the
    /// consumer's private data is `&buf[CmaIpHeader::LEN..]`. The CMA version is returned
    /// as found, for the caller to check against [`CmaIpHeader::VERSION`].
    pub fn parse(buf: &[u8]) -> Result<CmaIpHeader, MadError> {
        let Some(h) = buf.get(..Self::LEN) else {
            return Err(MadError::Truncated {
                needed: Self::LEN,
                got: buf.len(),
            });
        };
        let addr16 = |at: usize| {
            let mut a = [0u8; 16];
            a.copy_from_slice(&h[at..at + 16]);
            a
        };
        let (src, dst) = match h[1] >> 4 {
            4 => (
                IpAddr::V4(Ipv4Addr::new(h[16], h[17], h[18], h[19])),
                IpAddr::V4(Ipv4Addr::new(h[32], h[33], h[34], h[35])),
            ),
            6 => (
                IpAddr::V6(Ipv6Addr::from(addr16(4))),
                IpAddr::V6(Ipv6Addr::from(addr16(20))),
            ),
            v => return Err(MadError::IpVersion(v)),
        };
        Ok(CmaIpHeader {
            cma_version: h[0],
            src_port: u16::from_be_bytes([h[2], h[3]]),
            src,
            dst,
        })
    }

    /// Write into the first [`CmaIpHeader::LEN`] bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), MadError> {
        let got = buf.len();
        let Some(h) = buf.get_mut(..Self::LEN) else {
            return Err(MadError::Truncated {
                needed: Self::LEN,
                got,
            });
        };
        h.fill(0);
        h[0] = self.cma_version;
        h[1] = self.ip_version() << 4;
        h[2..4].copy_from_slice(&self.src_port.to_be_bytes());
        match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                h[16..20].copy_from_slice(&s.octets());
                h[32..36].copy_from_slice(&d.octets());
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                h[4..20].copy_from_slice(&s.octets());
                h[20..36].copy_from_slice(&d.octets());
            }
            _ => return Err(MadError::MixedIpVersions),
        }
        Ok(())
    }

    /// The private data of a REQ / SIDR REQ: this header followed by the consumer's
    /// `data` (at most `field_len - 36` bytes, where `field_len` is the message's
    /// private-data field size, e.g. [`CmReq::PRIVATE_DATA_LEN`]).
    pub fn with_private_data(&self, data: &[u8], field_len: usize) -> Result<Vec<u8>, MadError> {
        let max = field_len.saturating_sub(Self::LEN);
        if data.len() > max {
            return Err(MadError::PrivateDataTooLong {
                len: data.len(),
                max,
            });
        }
        let mut out = vec![0u8; Self::LEN + data.len()];
        self.emit(&mut out)?;
        out[Self::LEN..].copy_from_slice(data);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts() {
        assert_eq!(timeout_duration(0), Duration::from_nanos(4096));
        assert_eq!(timeout_duration(20), Duration::from_nanos(4096 << 20));
        assert_eq!(timeout_duration(31), timeout_duration(200));
        assert_eq!(timeout_exponent(Duration::from_nanos(4096 << 20)), 20);
        assert_eq!(timeout_exponent(Duration::from_nanos((4096 << 20) + 1)), 21);
        assert_eq!(timeout_exponent(Duration::ZERO), 0);
        assert_eq!(timeout_exponent(Duration::from_secs(1 << 20)), 31);
    }

    #[test]
    fn gids() {
        let ip: IpAddr = "192.168.77.1".parse().unwrap();
        let g = ip_to_gid(ip);
        assert_eq!(&g[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
        assert_eq!(gid_to_ip(&g), ip);
        let v6: IpAddr = "fe80::1".parse().unwrap();
        assert_eq!(gid_to_ip(&ip_to_gid(v6)), v6);
    }
}
