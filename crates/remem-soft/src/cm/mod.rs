//! The RDMA connection manager of a soft device: `rdma_cm`/`ib_cm` on the wire, the
//! provider-neutral CM API ([`remem_verbs::cm`]) to the application.
//!
//! Every soft device has a GSI (QP 1): a received UD SEND ONLY to QP 1 with Q_Key
//! [`GSI_QKEY`] carries a 256-byte MAD, handed by the engine to the device's CM through
//! its GSI port (`crate::engine::GsiPort`, implemented by `crate::verbs::cm_id::CmDevice`);
//! the MADs it sends leave the same way (source QP 1, P_Key 0xFFFF), as kernel rxe does.
//! The agent reports what MADs bring as events (a new connection request among them); the
//! verbs layer makes the CM ids of new requests as it takes those events.
//!
//! This folder is the protocol, [`agent`]: a deterministic sans-IO state machine per
//! device (REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR REQ/REP; timers, retries, TimeWait;
//! budgets). The shell that runs it — CM ids, their channels, the device's CM state and
//! the QPs it moves — is `crate::verbs::cm_id`.

#![forbid(unsafe_code)]

pub mod agent;

pub use agent::{AgentStats, CmConfig};
pub use remem_wire::mad::{GSI_QKEY, GSI_QPN, MAD_LEN};
