//! The `remem-verbs` trait implementations of a soft device: the open device
//! ([`context`]), protection domains ([`pd`]), memory regions and windows with the key
//! table ([`mr`]), completion queues ([`cq`]), shared receive queues ([`srq`]), address
//! handles ([`ah`]), queue pairs ([`qp`]) and RDMA CM ids ([`cm_id`]).

#![forbid(unsafe_code)]

pub mod ah;
pub mod cm_id;
pub mod context;
pub mod cq;
pub mod mr;
pub mod pd;
pub mod qp;
pub mod srq;
