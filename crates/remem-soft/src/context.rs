//! An open soft device.

use crate::netdev::Netdev;
use remem_verbs::{
    AsyncEvent, AtomicCap, CompletionChannel, CompletionQueue, Context, Counter, DeviceAttr,
    DeviceInfo, Error, GidEntry, LinkLayer, Mtu, PortAttr, ProtectionDomain, Result,
};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixDatagram;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Names of the device counters, as rxe's `hw_counters` plus drops by cause.
pub const COUNTER_NAMES: [&str; 14] = [
    "sent_pkts",
    "rcvd_pkts",
    "duplicate_request",
    "out_of_seq_request",
    "rcvd_rnr_err",
    "send_rnr_err",
    "rcvd_seq_err",
    "retry_exceeded_err",
    "retry_rnr_exceeded_err",
    "completer_retry_err",
    "send_err",
    "drop_malformed",
    "drop_bad_icrc",
    "drop_unknown_qp",
];

/// An open soft device (the soft provider's `ibv_context`).
pub struct SoftContext {
    info: DeviceInfo,
    netdev: Netdev,
    counters: [AtomicU64; COUNTER_NAMES.len()],
    /// Readable end of the async event notification socket pair.
    async_rx: UnixDatagram,
    /// Writable end (used by the transport once it raises events).
    _async_tx: UnixDatagram,
}

impl std::fmt::Debug for SoftContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftContext")
            .field("name", &self.info.name)
            .finish()
    }
}

impl SoftContext {
    /// Opens a soft device on `netdev`, serving RoCEv2 on UDP `port`.
    pub fn new(netdev: Netdev, port: u16) -> Result<Self> {
        let (async_rx, async_tx) = UnixDatagram::pair()?;
        async_rx.set_nonblocking(true)?;
        async_tx.set_nonblocking(true)?;
        Ok(SoftContext {
            info: netdev.device_info(port),
            netdev,
            counters: Default::default(),
            async_rx,
            _async_tx: async_tx,
        })
    }
}

impl Context for SoftContext {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn query_device(&self) -> Result<DeviceAttr> {
        // rxe's limits (rxe_param.h) where a software device has any, except the largest
        // message, which is the IBTA maximum of 2^31 bytes rather than rxe's 8 MiB.
        const MAX: u32 = 1 << 20;
        Ok(DeviceAttr {
            fw_ver: format!("remem-soft {}", env!("CARGO_PKG_VERSION")),
            node_guid: self.info.node_guid,
            sys_image_guid: self.info.node_guid,
            max_mr_size: u64::MAX >> 1,
            page_size_cap: 0xffff_f000,
            vendor_id: 0x00ff_ffff,
            vendor_part_id: 0,
            hw_ver: 0,
            max_qp: MAX - 16,
            max_qp_wr: MAX,
            max_sge: 32,
            max_sge_rd: 32,
            max_cq: MAX,
            max_cqe: (1 << 15) - 1,
            max_mr: MAX >> 1,
            max_pd: MAX,
            max_qp_rd_atom: 128,
            max_qp_init_rd_atom: 128,
            max_res_rd_atom: 0x3f000,
            atomic_cap: AtomicCap::Hca,
            max_srq: MAX,
            max_srq_wr: MAX,
            max_srq_sge: 27,
            max_inline_data: 512,
            max_ah: (1 << 15) - 1,
            phys_port_cnt: 1,
            max_msg_sz: 1 << 31,
        })
    }

    fn query_port(&self, port_num: u8) -> Result<PortAttr> {
        if port_num != 1 {
            return Err(Error::InvalidArgument(format!(
                "port {port_num} does not exist (soft devices have port 1)"
            )));
        }
        Ok(PortAttr {
            state: self.netdev.port_state(),
            max_mtu: Mtu::Mtu4096,
            active_mtu: self.netdev.active_mtu(),
            gid_tbl_len: self.info.gids.len() as u32,
            max_msg_sz: 1 << 31,
            pkey_tbl_len: 1,
            link_layer: LinkLayer::Ethernet,
            active_width: 1,
            active_speed: 1,
            phys_state: if self.netdev.up { 5 } else { 3 },
        })
    }

    fn query_gid(&self, port_num: u8, index: u32) -> Result<GidEntry> {
        self.query_port(port_num)?;
        self.info.gids.get(index as usize).cloned().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "GID index {index} is empty (table has {} entries)",
                self.info.gids.len()
            ))
        })
    }

    fn alloc_pd(&self) -> Result<Arc<dyn ProtectionDomain>> {
        Err(Error::Unsupported(
            "soft provider: protection domains (issue 3)",
        ))
    }

    fn create_comp_channel(&self) -> Result<Arc<dyn CompletionChannel>> {
        Err(Error::Unsupported(
            "soft provider: completion channels (issue 3)",
        ))
    }

    fn create_cq(
        &self,
        _cqe: u32,
        _channel: Option<Arc<dyn CompletionChannel>>,
    ) -> Result<Arc<dyn CompletionQueue>> {
        Err(Error::Unsupported(
            "soft provider: completion queues (issue 3)",
        ))
    }

    fn async_fd(&self) -> BorrowedFd<'_> {
        self.async_rx.as_fd()
    }

    fn get_async_event(&self) -> Option<AsyncEvent> {
        // No object raises events yet; the socket pair is the channel they will use.
        None
    }

    fn counters(&self) -> Vec<Counter> {
        COUNTER_NAMES
            .iter()
            .zip(&self.counters)
            .map(|(name, value)| Counter {
                name,
                value: value.load(Ordering::Relaxed),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SoftProvider;
    use remem_verbs::{GidType, PortState, Provider};

    #[test]
    fn open_loopback_and_query() {
        let p = SoftProvider::new();
        let ctx = p.open("soft-lo").unwrap();
        assert_eq!(ctx.info().name, "soft-lo");
        let dev = ctx.query_device().unwrap();
        assert_eq!(dev.max_qp_rd_atom, 128);
        assert_eq!(dev.phys_port_cnt, 1);
        let port = ctx.query_port(1).unwrap();
        assert_eq!(
            port.active_mtu,
            Mtu::Mtu4096,
            "loopback MTU 65536 gives 4096"
        );
        assert_eq!(port.state, PortState::Active);
        assert_eq!(port.link_layer, LinkLayer::Ethernet);
        assert!(ctx.query_port(2).is_err());
        let table = ctx.gid_table(1).unwrap();
        assert!(
            table
                .iter()
                .any(|g| g.gid_type == GidType::RoceV2 && g.gid.to_ip().is_loopback())
        );
        assert!(ctx.query_gid(1, table.len() as u32).is_err());
        let counters = ctx.counters();
        assert_eq!(counters.len(), COUNTER_NAMES.len());
        assert!(counters.iter().any(|c| c.name == "rcvd_seq_err"));
        assert!(ctx.get_async_event().is_none());
    }

    #[test]
    fn unknown_device_is_an_error() {
        let err = SoftProvider::new().open("soft-nope0").err().unwrap();
        assert!(matches!(err, Error::NoSuchDevice(_)));
    }
}
