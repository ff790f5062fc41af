//! RoCEv2 packet formats (IBTA Annex A17, as Linux Soft-RoCE implements them) and the ICRC.
//!
//! Pure: no IO, no `unsafe`, no allocation per packet, and parsing never panics — every
//! malformed input is a typed [`ParseError`].
//!
//! * [`Opcode`] — every RC opcode, UC sends and writes, UD SEND; [`Opcode::layout`] says
//!   which extension headers each carries.
//! * [`headers`] — BTH, RETH, AETH, AtomicETH, AtomicAckETH, DETH, FETH (ImmDt and IETH are
//!   plain `u32`s).
//! * [`Packet::parse`] — a typed view that borrows the UDP payload.
//! * [`Headers::write`] / [`Headers::build`] — build into a caller's buffer; the payload can
//!   be gathered straight into place.
//! * [`icrc`] — the ICRC exactly as rxe computes it, for IPv4 and IPv6.
//! * [`Psn`] — 24-bit sequence numbers with wrap-around ordering.
//! * [`mad`] — communication-management MADs (REQ, REP, RTU, REJ, MRA, DREQ, DREP, SIDR)
//!   as the kernel's `ib_cm` / `rdma_cm` send them to QP 1, and `rdma_cm`'s IP header.
//!
//! ```
//! use remem_wire::{Bth, Headers, Opcode, Packet, Psn, Reth, icrc};
//! use std::net::Ipv4Addr;
//!
//! // An RDMA WRITE ONLY of 5 bytes to QP 0x12.
//! let mut h = Headers::new(Bth::new(Opcode::RcWriteOnly, 0x12, Psn::new(100)));
//! h.bth.ack_req = true;
//! h.reth = Some(Reth { va: 0x1000, rkey: 0xabcd, dma_len: 5 });
//! let mut buf = [0u8; 64];
//! let len = h.build(b"hello", &mut buf).unwrap();
//! let ip = icrc::IpFields::V4 {
//!     src: Ipv4Addr::new(10, 0, 0, 1),
//!     dst: Ipv4Addr::new(10, 0, 0, 2),
//!     id: 0,
//!     flags_frag: icrc::IPV4_DF,
//! };
//! let ports = icrc::UdpPorts { src: 49152, dst: 4791 };
//! icrc::fill(&ip, ports, &mut buf[..len]).unwrap();
//!
//! let p = Packet::parse(&buf[..len]).unwrap();
//! assert_eq!(p.payload, b"hello");
//! assert_eq!(p.headers.reth.unwrap().rkey, 0xabcd);
//! assert!(icrc::verify(&ip, ports, &buf[..len]));
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod headers;
pub mod icrc;
pub mod mad;
pub mod opcode;
pub mod packet;
pub mod psn;

pub use headers::{Aeth, AtomicEth, Bth, Deth, Feth, Reth, Syndrome};
pub use mad::{CmMad, CmMessage, CmaIpHeader, MadError, MadHeader};
pub use opcode::{Layout, Opcode};
pub use packet::{BuildError, Headers, ICRC_LEN, Packet, ParseError};
pub use psn::Psn;

/// The UDP destination port of RoCEv2.
pub const ROCEV2_PORT: u16 = 4791;
