//! The provider-neutral RDMA verbs model of remem.
//!
//! Every remem provider — the userspace RoCEv2 stack (`remem-soft`) and the rdma-core
//! provider (`remem-ibverbs`) — implements the object-safe traits in [`provider`]; the async
//! API (`remem`) and the provider conformance suite are written once against them.
//!
//! The types mirror libibverbs (`ibv_*`) closely, so that an RDMA programmer recognises them:
//! each item's documentation names the verbs type or constant it stands for.
//!
//! | verbs | here |
//! |---|---|
//! | `ibv_device`, `ibv_get_device_list` | [`DeviceInfo`], [`Provider::devices`] |
//! | `ibv_context`, `ibv_query_device`, `ibv_query_port`, `ibv_query_gid` | [`Context`], [`DeviceAttr`], [`PortAttr`], [`GidEntry`] |
//! | `ibv_pd`, `ibv_mr`, `ibv_reg_mr` | [`ProtectionDomain`], [`MemoryRegion`], [`MemRegion`] |
//! | `ibv_cq`, `ibv_comp_channel`, `ibv_req_notify_cq` | [`CompletionQueue`], [`CompletionChannel`] |
//! | `ibv_qp`, `ibv_modify_qp`, `ibv_qp_attr`, attribute masks | [`QueuePair`], [`QpAttr`], [`QpAttrMask`], [`check_modify`] |
//! | `ibv_srq` | [`SharedReceiveQueue`] |
//! | `ibv_ah` | [`AddressHandle`], [`AhAttr`] |
//! | `ibv_send_wr`, `ibv_recv_wr`, `ibv_sge` | [`SendWr`], [`RecvWr`], [`Sge`] |
//! | `ibv_wc` | [`WorkCompletion`], [`WcStatus`], [`WcOpcode`] |
//! | `ibv_async_event` | [`AsyncEvent`] |
//! | `rdma_event_channel`, `rdma_cm_id`, `rdma_cm_event`, `rdma_conn_param` | [`CmChannel`], [`CmId`], [`CmEvent`], [`ConnParam`] |
//!
//! Memory that a NIC or a remote peer reads and writes is owned by a [`MemoryBuffer`]; the
//! module [`mem`] is the only place in this crate that uses `unsafe` (the crate denies
//! `unsafe_code`, `mem` allows it, and every other module forbids it).

#![warn(missing_docs)]

pub mod access;
pub mod cm;
pub mod device;
pub mod error;
pub mod event;
pub mod mem;
pub mod provider;
pub mod qp;
pub mod rc;
pub mod types;
pub mod wc;
pub mod wr;

pub use access::AccessFlags;
pub use cm::{
    CmChannel, CmEvent, CmEventKind, CmEventParam, CmId, ConnParam, PeerConnParam, PortSpace,
    PrivateDataLimit, UdParam,
};
pub use device::{
    AtomicCap, DeviceAttr, DeviceInfo, GidEntry, GidType, McastCaps, PortAttr, first_roce_v2_ipv4,
};
pub use error::{Error, MemError, PostError, Result};
pub use event::{AsyncEvent, AsyncEventElement, AsyncEventType};
pub use mem::{MemRegion, MemoryBuffer};
pub use provider::{
    AddressHandle, AsyncEventQueue, CompletionChannel, CompletionQueue, Context, Counter, CqId,
    MemoryRegion, MemoryWindow, MwType, ProtectionDomain, Provider, QueuePair, ROCEV2_UDP_PORT,
    SharedReceiveQueue, SrqAttr,
};
pub use qp::{
    AhAttr, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, RNR_RETRY_INFINITE,
    check_modify,
};
pub use types::{Gid, LinkLayer, Mtu, PortState};
pub use wc::{WcFlags, WcOpcode, WcStatus, WorkCompletion};
pub use wr::{FlushLevel, FlushType, RecvWr, SendFlags, SendOp, SendWr, Sge, UdDest};

/// The crate's unsafe boundary, checked: `mem` alone allows `unsafe_code`, every other
/// module forbids it.
#[cfg(test)]
mod unsafe_boundary {
    #[test]
    fn only_mem_allows_unsafe_code() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut checked = 0;
        for e in std::fs::read_dir(&src).expect("src is readable") {
            let p = e.expect("a directory entry").path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if !name.ends_with(".rs") || name == "lib.rs" {
                continue;
            }
            let text = std::fs::read_to_string(&p).expect("a source file");
            let allows = text.contains("#![allow(unsafe_code)]");
            let forbids = text.contains("#![forbid(unsafe_code)]");
            if name == "mem.rs" {
                assert!(allows && !forbids, "mem.rs is the NIC-memory exception");
            } else {
                assert!(forbids && !allows, "{name} must forbid unsafe_code");
            }
            checked += 1;
        }
        assert!(checked >= 12, "checked {checked} modules");
    }
}
