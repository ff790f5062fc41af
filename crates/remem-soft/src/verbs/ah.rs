//! Address handles.

use crate::transport::wqe::PdId;
use remem_verbs::AhAttr;

/// An address handle (`ibv_ah`): an address vector checked against the device's GID table
/// when created (see `DeviceShared::check_av`).
#[derive(Debug)]
pub struct SoftAh {
    pub(crate) attr: AhAttr,
    pub(crate) pd: PdId,
    pub(crate) device_id: u64,
    pub(crate) _slot: crate::device::quota::Slot,
}

impl remem_verbs::AddressHandle for SoftAh {
    fn attr(&self) -> &AhAttr {
        &self.attr
    }
}
