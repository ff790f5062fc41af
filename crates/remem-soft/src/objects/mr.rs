//! Memory regions and the device's key table.

use super::DeviceShared;
use super::keys::KeyGen;
use crate::qp::LocalMemory;
use crate::transport::RemoteKeyError;
use crate::wqe::PdId;
use remem_verbs::{AccessFlags, Error, MemRegion, Result, Sge};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

/// What the key table knows of a registration.
#[derive(Debug)]
pub struct MrEntry {
    /// Protection domain.
    pub pd: PdId,
    /// The memory.
    pub region: MemRegion,
    /// Access rights.
    pub access: AccessFlags,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
}

#[derive(Debug, Default)]
struct Tables {
    by_lkey: HashMap<u32, Arc<MrEntry>>,
    by_rkey: HashMap<u32, Arc<MrEntry>>,
}

/// The memory regions of a device, by lkey and by rkey.
#[derive(Debug, Default)]
pub struct MrTable {
    tables: RwLock<Tables>,
    keys: Mutex<KeyGen>,
}

impl MrTable {
    /// Registers `region` for `pd` with fresh keys.
    pub fn insert(&self, pd: PdId, region: MemRegion, access: AccessFlags) -> Arc<MrEntry> {
        let (lkey, rkey) = {
            let mut k = self.keys.lock().unwrap_or_else(|p| p.into_inner());
            (k.next_key(), k.next_key())
        };
        let e = Arc::new(MrEntry {
            pd,
            region,
            access,
            lkey,
            rkey,
        });
        let mut t = self.tables.write().unwrap_or_else(|p| p.into_inner());
        t.by_lkey.insert(lkey, e.clone());
        t.by_rkey.insert(rkey, e.clone());
        e
    }

    /// Removes a registration: its keys stop working at once.
    pub fn remove(&self, e: &MrEntry) {
        let mut t = self.tables.write().unwrap_or_else(|p| p.into_inner());
        t.by_lkey.remove(&e.lkey);
        t.by_rkey.remove(&e.rkey);
    }

    /// Number of registrations.
    pub fn len(&self) -> usize {
        self.tables
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .by_lkey
            .len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn sub(region: &MemRegion, off: usize, len: u64) -> Option<MemRegion> {
        let start = region.offset() + off;
        MemRegion::new(region.buffer().clone(), start..start + len as usize).ok()
    }

    /// Resolves a remote access for the responder.
    pub fn remote(
        &self,
        pd: PdId,
        rkey: u32,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> std::result::Result<MemRegion, RemoteKeyError> {
        let t = self.tables.read().unwrap_or_else(|p| p.into_inner());
        let e = t.by_rkey.get(&rkey).ok_or(RemoteKeyError::UnknownKey)?;
        if e.pd != pd {
            return Err(RemoteKeyError::OtherPd);
        }
        if !e.access.contains(need) {
            return Err(RemoteKeyError::MissingAccess);
        }
        let off = e
            .region
            .offset_of(va, len)
            .map_err(|_| RemoteKeyError::OutOfBounds)?;
        Self::sub(&e.region, off, len).ok_or(RemoteKeyError::OutOfBounds)
    }
}

impl LocalMemory for MrTable {
    fn local(&self, pd: PdId, sge: &Sge, need_write: bool) -> Result<MemRegion> {
        let t = self.tables.read().unwrap_or_else(|p| p.into_inner());
        let e = t
            .by_lkey
            .get(&sge.lkey)
            .filter(|e| e.pd == pd)
            .ok_or(Error::InvalidLkey { lkey: sge.lkey })?;
        if need_write && !e.access.contains(AccessFlags::LOCAL_WRITE) {
            return Err(Error::LocalAccess { lkey: sge.lkey });
        }
        let out = Error::SgeOutOfBounds {
            addr: sge.addr,
            length: sge.length,
            lkey: sge.lkey,
        };
        let off = e
            .region
            .offset_of(sge.addr, u64::from(sge.length))
            .map_err(|_| Error::SgeOutOfBounds {
                addr: sge.addr,
                length: sge.length,
                lkey: sge.lkey,
            })?;
        Self::sub(&e.region, off, u64::from(sge.length)).ok_or(out)
    }
}

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

impl remem_verbs::MemoryRegion for SoftMr {
    fn lkey(&self) -> u32 {
        self.entry.lkey
    }
    fn rkey(&self) -> u32 {
        self.entry.rkey
    }
    fn region(&self) -> &MemRegion {
        &self.entry.region
    }
    fn access(&self) -> AccessFlags {
        self.entry.access
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use remem_verbs::MemoryBuffer;

    #[test]
    fn lookups_and_every_error_cause() {
        let t = MrTable::default();
        let buf = Arc::new(MemoryBuffer::zeroed(4096).unwrap());
        let region = MemRegion::new(buf.clone(), 1000..2000).unwrap();
        let e = t.insert(
            PdId(1),
            region.clone(),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        );
        assert_ne!(e.lkey, e.rkey);
        let va = region.addr();
        let w = AccessFlags::REMOTE_WRITE;
        let r = t.remote(PdId(1), e.rkey, va + 10, 100, w).unwrap();
        assert_eq!((r.addr(), r.len()), (va + 10, 100));
        assert_eq!(
            t.remote(PdId(1), e.rkey ^ 1, va, 1, w).err(),
            Some(RemoteKeyError::UnknownKey)
        );
        assert_eq!(
            t.remote(PdId(1), e.lkey, va, 1, w).err(),
            Some(RemoteKeyError::UnknownKey)
        );
        assert_eq!(
            t.remote(PdId(2), e.rkey, va, 1, w).err(),
            Some(RemoteKeyError::OtherPd)
        );
        assert_eq!(
            t.remote(PdId(1), e.rkey, va, 1, AccessFlags::REMOTE_READ)
                .err(),
            Some(RemoteKeyError::MissingAccess)
        );
        assert_eq!(
            t.remote(PdId(1), e.rkey, va + 999, 2, w).err(),
            Some(RemoteKeyError::OutOfBounds)
        );
        assert_eq!(
            t.remote(PdId(1), e.rkey, va - 1, 1, w).err(),
            Some(RemoteKeyError::OutOfBounds)
        );
        assert_eq!(
            t.remote(PdId(1), e.rkey, u64::MAX - 1, 4, w).err(),
            Some(RemoteKeyError::OutOfBounds),
            "wrapping past 2^64"
        );
        let sge = Sge {
            addr: va,
            length: 10,
            lkey: e.lkey,
        };
        assert_eq!(t.local(PdId(1), &sge, true).unwrap().len(), 10);
        assert!(matches!(
            t.local(PdId(2), &sge, false),
            Err(Error::InvalidLkey { .. })
        ));
        let oob = Sge {
            addr: va + 995,
            length: 10,
            lkey: e.lkey,
        };
        assert!(matches!(
            t.local(PdId(1), &oob, false),
            Err(Error::SgeOutOfBounds { .. })
        ));
        let zero = Sge {
            addr: va,
            length: 0,
            lkey: e.lkey,
        };
        assert_eq!(t.local(PdId(1), &zero, false).unwrap().len(), 0);
        t.remove(&e);
        assert_eq!(
            t.remote(PdId(1), e.rkey, va, 1, w).err(),
            Some(RemoteKeyError::UnknownKey)
        );
        assert!(t.local(PdId(1), &sge, false).is_err());
        assert!(t.is_empty());
    }

    #[test]
    fn read_only_region_refuses_local_write() {
        let t = MrTable::default();
        let buf = Arc::new(MemoryBuffer::zeroed(64).unwrap());
        let e = t.insert(
            PdId(1),
            MemRegion::whole(buf.clone()),
            AccessFlags::REMOTE_READ,
        );
        let sge = Sge {
            addr: buf.addr(),
            length: 8,
            lkey: e.lkey,
        };
        assert!(matches!(
            t.local(PdId(1), &sge, true),
            Err(Error::LocalAccess { .. })
        ));
        assert!(t.local(PdId(1), &sge, false).is_ok());
    }
}
