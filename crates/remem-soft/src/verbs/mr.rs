//! Memory regions (`ibv_mr`) and memory windows (`ibv_mw`): handles on entries of the
//! device's key table ([`crate::mem::mr::MrTable`]).

use crate::device::DeviceShared;
pub use crate::mem::mr::*;
use remem_verbs::{AccessFlags, MemRegion};
use std::sync::Arc;

/// A registered memory region (`ibv_mr`); dropping it deregisters.
#[derive(Debug)]
pub struct SoftMr {
    pub(crate) entry: Arc<MrEntry>,
    pub(crate) dev: Arc<DeviceShared>,
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        self.dev.mrs.remove(&self.entry);
    }
}

/// A memory window (`ibv_mw`); dropping it deallocates it (its binding is revoked).
#[derive(Debug)]
pub struct SoftMw {
    pub(crate) rkey: u32,
    pub(crate) ty: MwType,
    pub(crate) dev: Arc<DeviceShared>,
}

impl Drop for SoftMw {
    fn drop(&mut self) {
        let _ = self.dev.mrs.dealloc_mw(self.rkey);
    }
}

impl remem_verbs::MemoryWindow for SoftMw {
    fn rkey(&self) -> u32 {
        self.rkey
    }
    fn mw_type(&self) -> MwType {
        self.ty
    }
}

impl remem_verbs::MemoryRegion for SoftMr {
    fn lkey(&self) -> u32 {
        self.entry.lkey
    }
    fn rkey(&self) -> u32 {
        self.entry.rkey
    }
    fn region(&self) -> &MemRegion {
        self.entry.region()
    }
    fn access(&self) -> AccessFlags {
        self.entry.access
    }
    fn windows_bound(&self) -> u32 {
        self.dev.mrs.windows_bound(&self.entry)
    }
}
