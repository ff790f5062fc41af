//! Memory regions: local ones (registered memory of this process) and remote tokens.
//!
//! # The memory model
//!
//! Memory a NIC (or the peer, through it) may touch is never handed out as `&[u8]` or
//! `&mut [u8]`: the peer could change it while the slice lives, which Rust forbids. Local
//! memory regions are read and written through copies ([`LocalMr::read`],
//! [`LocalMr::write`], [`LocalMr::to_vec`]), which use the same word-sized atomic accesses
//! as the soft NIC, so a concurrent remote write is a race on values, never undefined
//! behaviour. Rust's borrow rules still order local use: an operation that fills a region
//! (READ, atomics' results) takes it by `&mut`, one that only reads it takes it by `&`, and
//! [`LocalMr::get`] / [`LocalMr::get_mut`] give sub-ranges with the same rules.
//!
//! An operation in flight keeps its memory alive: dropping the future, or the region,
//! cannot free memory the NIC is still writing — the registration ends when the last
//! operation on it completes.

use crate::error::{Error, Result};
use remem_verbs::{AccessFlags, MemRegion, MemoryBuffer, MemoryRegion, ProtectionDomain, Sge};
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex};

/// A registered memory region, or a block of one (a pool allocation), and the buffer
/// behind it.
pub(crate) struct MrInner {
    pub(crate) mr: Arc<dyn MemoryRegion>,
    /// Where the block starts within `mr`.
    offset: usize,
    len: usize,
    /// The access rights lending grants (the registration's own, or for a pool block,
    /// which is registered for local access only, the rights it was allocated with).
    access: AccessFlags,
    /// The pool block, returned to its pool when the last user is gone.
    _block: Option<crate::pool::Block>,
    /// A pool block's own registration for remote access, made when it is first lent.
    lent: Mutex<Option<Arc<dyn MemoryRegion>>>,
}

impl std::fmt::Debug for MrInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.mr.lkey()))
            .finish()
    }
}

impl MrInner {
    fn addr(&self) -> u64 {
        self.mr.addr() + self.offset as u64
    }

    /// Checks `offset..offset + len` against the block and returns its offset in `mr`.
    fn at(&self, offset: usize, len: usize) -> Result<usize> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.offset + offset),
            _ => Err(Error::OutOfRange {
                start: offset,
                end: offset.saturating_add(len),
                len: self.len,
            }),
        }
    }

    fn region(&self) -> &MemRegion {
        self.mr.region()
    }
}

/// A registered local memory region (`ibv_mr` with its memory), owned by this process.
///
/// # The memory model
///
/// Memory a NIC (or the peer, through it) may touch is never handed out as `&[u8]` or
/// `&mut [u8]`: the peer could change it while the slice lives, which Rust forbids. Local
/// memory regions are read and written through copies ([`LocalMr::read`],
/// [`LocalMr::write`], [`LocalMr::to_vec`]), which use the same word-sized atomic accesses
/// as the soft NIC, so a concurrent remote write is a race on values, never undefined
/// behaviour. Rust's borrow rules still order local use: an operation that fills a region
/// (READ, atomics' results) takes it by `&mut`, one that only reads it takes it by `&`, and
/// [`LocalMr::get`] / [`LocalMr::get_mut`] give sub-ranges with the same rules.
///
/// An operation in flight keeps its memory alive: dropping the future, or the region,
/// cannot free memory the NIC is still writing — the registration ends when the last
/// operation on it completes.
///
/// Not `Clone`: `&mut LocalMr` means no local operation reads or writes it meanwhile.
///
/// The borrow rules at work (each block fails to compile, with the error named):
///
/// A region being filled by a READ cannot be looked at until the READ is done:
///
/// ```compile_fail,E0502
/// async fn f(conn: &remem::Connection, mr: &mut remem::LocalMr, remote: &remem::RemoteMr) {
///     let read = conn.read(mr, remote);
///     let _peek = mr.to_vec(); // `mr` is borrowed by the READ in flight
///     read.await.unwrap();
/// }
/// ```
///
/// Two exclusive views of one region cannot exist at once:
///
/// ```compile_fail,E0499
/// fn f(mr: &mut remem::LocalMr) {
///     let a = mr.get_mut(0..4).unwrap();
///     let b = mr.get_mut(4..8).unwrap();
///     drop((a, b));
/// }
/// ```
///
/// Memory added to a batch stays borrowed until the batch is done:
///
/// ```compile_fail,E0502
/// async fn f(conn: &remem::Connection, mr: &mut remem::LocalMr, remote: &remem::RemoteMr) {
///     let mut batch = conn.batch();
///     batch.read(mr, remote).unwrap();
///     mr.write(0, b"x").unwrap(); // `mr` is the batch's READ target
///     batch.submit().await.unwrap();
/// }
/// ```
///
/// Once the operation is done, the region is free again:
///
/// ```
/// async fn f(conn: &remem::Connection, mr: &mut remem::LocalMr, remote: &remem::RemoteMr) {
///     conn.read(mr, remote).await.unwrap();
///     let _peek = mr.to_vec();
///     let mut batch = conn.batch();
///     batch.read(mr, remote).unwrap();
///     batch.submit().await.unwrap();
///     mr.write(0, b"x").unwrap();
/// }
/// ```
#[derive(Debug)]
pub struct LocalMr {
    pub(crate) inner: Arc<MrInner>,
}

/// A part of a [`LocalMr`], borrowed shared: a source for WRITE and SEND.
#[derive(Debug, Clone, Copy)]
pub struct LocalMrRef<'a> {
    mr: &'a LocalMr,
    offset: usize,
    len: usize,
}

/// A part of a [`LocalMr`], borrowed exclusively: a target for READ and atomics, or a
/// source.
#[derive(Debug)]
pub struct LocalMrMut<'a> {
    mr: &'a mut LocalMr,
    offset: usize,
    len: usize,
}

/// Where a local operand lies: the region (kept alive while the operation runs) and the
/// range within it.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct Span {
    pub(crate) inner: Arc<MrInner>,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

impl Span {
    /// The span as a region of its buffer (for a registration of exactly this range).
    pub(crate) fn region(&self) -> Result<MemRegion> {
        let inner = &self.inner;
        let start = inner.region().offset() + inner.offset + self.offset;
        Ok(MemRegion::new(
            inner.region().buffer().clone(),
            start..start + self.len,
        )?)
    }

    pub(crate) fn sge(&self) -> Sge {
        Sge {
            addr: self.inner.addr() + self.offset as u64,
            length: self.len as u32,
            lkey: self.inner.mr.lkey(),
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// Local memory an operation reads: [`LocalMr`], [`LocalMrRef`], [`LocalMrMut`].
pub trait Local: sealed::Sealed {
    #[doc(hidden)]
    fn span(&self) -> Span;
}

/// Local memory an operation writes: [`LocalMr`], [`LocalMrMut`] (taken by `&mut`).
pub trait LocalMut: Local {}

/// `(start, len)` of `start..end` within `0..len`, or the range that does not fit.
fn resolve_bounds(len: u64, start: Bound<u64>, end: Bound<u64>) -> Result<(u64, u64)> {
    let start = match start {
        Bound::Included(s) => s,
        Bound::Excluded(s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match end {
        Bound::Included(e) => e.saturating_add(1),
        Bound::Excluded(e) => e,
        Bound::Unbounded => len,
    };
    if start > end || end > len {
        return Err(Error::OutOfRange {
            start: start as usize,
            end: end as usize,
            len: len as usize,
        });
    }
    Ok((start, end - start))
}

fn resolve(len: usize, range: impl RangeBounds<usize>) -> Result<(usize, usize)> {
    let widen = |b: Bound<&usize>| b.map(|&x| x as u64);
    let (start, n) = resolve_bounds(
        len as u64,
        widen(range.start_bound()),
        widen(range.end_bound()),
    )?;
    Ok((start as usize, n as usize))
}

impl LocalMr {
    pub(crate) fn new(mr: Arc<dyn MemoryRegion>) -> Self {
        let (len, access) = (mr.len(), mr.access());
        LocalMr {
            inner: Arc::new(MrInner {
                mr,
                offset: 0,
                len,
                access,
                _block: None,
                lent: Mutex::new(None),
            }),
        }
    }

    /// A region over a pool block: `len` bytes at `offset` in the block's registration.
    pub(crate) fn from_block(block: crate::pool::Block, len: usize, access: AccessFlags) -> Self {
        LocalMr {
            inner: Arc::new(MrInner {
                mr: block.mr().clone(),
                offset: block.offset(),
                len,
                access,
                _block: Some(block),
                lent: Mutex::new(None),
            }),
        }
    }

    /// Bytes in the region.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The access rights the peer gets when the region is lent.
    pub fn access(&self) -> AccessFlags {
        self.inner.access
    }

    /// The virtual address of its first byte (as the NIC and the peer see it).
    pub fn addr(&self) -> u64 {
        self.inner.addr()
    }

    /// The local key.
    pub fn lkey(&self) -> u32 {
        self.inner.mr.lkey()
    }

    /// Copies bytes at `offset` into `dst`.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let at = self.inner.at(offset, dst.len())?;
        Ok(self.inner.region().read(at, dst)?)
    }

    /// Copies `src` into the region at `offset`.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        let at = self.inner.at(offset, src.len())?;
        Ok(self.inner.region().write(at, src)?)
    }

    /// A copy of the whole region.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len()];
        // In bounds by construction.
        let _ = self.read(0, &mut v);
        v
    }

    /// The 8-byte word at `offset` (8-byte aligned), read atomically.
    pub fn load_u64(&self, offset: usize) -> Result<u64> {
        let at = self.inner.at(offset, 8)?;
        Ok(self.inner.region().load_u64(at)?)
    }

    /// Stores the 8-byte word at `offset` (8-byte aligned) atomically.
    pub fn store_u64(&self, offset: usize, value: u64) -> Result<()> {
        let at = self.inner.at(offset, 8)?;
        Ok(self.inner.region().store_u64(at, value)?)
    }

    /// Makes `[offset, offset + len)` of the region durable here: for a file-backed region
    /// ([`crate::Rdma::register_file`]) its dirty pages are written back to the file
    /// (`msync`); other memory has no backing store and only the range is checked. What a
    /// server does for a peer that asks it to persist a range (librpma's GPSPM).
    pub fn persist(&self, offset: usize, len: usize) -> Result<()> {
        let at = self.inner.at(offset, len)?;
        Ok(self.inner.region().persist(at, len)?)
    }

    pub(crate) fn fill_zero(&self) -> Result<()> {
        let at = self.inner.at(0, self.len())?;
        Ok(self
            .inner
            .region()
            .buffer()
            .fill(self.inner.region().offset() + at, self.len(), 0)?)
    }

    /// A shared view of `range`, usable as an operation's source.
    pub fn get(&self, range: impl RangeBounds<usize>) -> Result<LocalMrRef<'_>> {
        let (offset, len) = resolve(self.len(), range)?;
        Ok(LocalMrRef {
            mr: self,
            offset,
            len,
        })
    }

    /// An exclusive view of `range`, usable as an operation's target.
    pub fn get_mut(&mut self, range: impl RangeBounds<usize>) -> Result<LocalMrMut<'_>> {
        let (offset, len) = resolve(self.len(), range)?;
        Ok(LocalMrMut {
            mr: self,
            offset,
            len,
        })
    }

    /// Ends every remote access to this region and returns the same memory (same range)
    /// registered for local access only: a pool block drops its own registration for the
    /// peer (the pool's is local-only); any other region is registered anew for local
    /// access, and its old registration ends once no operation of this side uses it.
    pub(crate) fn revoke_remote(self, pd: &Arc<dyn ProtectionDomain>) -> Result<LocalMr> {
        let inner = &self.inner;
        if inner._block.is_some() {
            inner.lent.lock().unwrap_or_else(|p| p.into_inner()).take();
            return Ok(self);
        }
        let start = inner.region().offset() + inner.offset;
        let range = MemRegion::new(inner.region().buffer().clone(), start..start + inner.len)?;
        let local = pd.reg_mr(range, AccessFlags::LOCAL_WRITE)?;
        Ok(LocalMr::new(local))
    }

    /// A token the peer can use to reach this whole region with the rights it was
    /// allocated with. A pool block is registered for local access only: lending it
    /// registers exactly its range for remote access (once; the registration ends with the
    /// region), so the peer reaches nothing else of the pool.
    pub(crate) fn token(&self, pd: &Arc<dyn ProtectionDomain>) -> Result<RemoteMr> {
        let inner = &self.inner;
        let rkey = if inner._block.is_none() {
            inner.mr.rkey()
        } else {
            let mut lent = inner.lent.lock().unwrap_or_else(|p| p.into_inner());
            match &*lent {
                Some(mr) => mr.rkey(),
                None => {
                    let start = inner.region().offset() + inner.offset;
                    let range =
                        MemRegion::new(inner.region().buffer().clone(), start..start + inner.len)?;
                    let mr = pd.reg_mr(range, inner.access)?;
                    let rkey = mr.rkey();
                    *lent = Some(mr);
                    rkey
                }
            }
        };
        Ok(RemoteMr {
            addr: self.addr(),
            len: self.len() as u64,
            rkey,
            access: inner.access & AccessFlags::REMOTE,
        })
    }

    /// A descriptor of this region for a peer: address, length, remote key, the rights it
    /// grants and the FLUSH placements it supports, in a compact versioned encoding
    /// ([`RemoteMr::from_descriptor`] turns it back into a remote region). Pass it by any
    /// means, e.g. in a connection's private data. A pool
    /// block is registered for the peer on first use, as when it is shared over a
    /// connection.
    pub fn descriptor(&self, rdma: &crate::Rdma) -> Result<Vec<u8>> {
        Ok(self.token(rdma.pd())?.descriptor())
    }
}

/// What both views offer.
macro_rules! view {
    ($view:ident) => {
        impl $view<'_> {
            /// Bytes in the view.
            pub fn len(&self) -> usize {
                self.len
            }

            /// Whether the view is empty.
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }

            /// A copy of the bytes in the view.
            pub fn to_vec(&self) -> Vec<u8> {
                let mut v = vec![0; self.len];
                let _ = self.mr.read(self.offset, &mut v);
                v
            }
        }
    };
}

view!(LocalMrRef);
view!(LocalMrMut);

impl LocalMrMut<'_> {
    /// Copies `src` into the view at `offset`.
    pub fn write(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        if offset.checked_add(src.len()).is_none_or(|e| e > self.len) {
            return Err(Error::OutOfRange {
                start: offset,
                end: offset.saturating_add(src.len()),
                len: self.len,
            });
        }
        self.mr.write(self.offset + offset, src)
    }
}

impl sealed::Sealed for LocalMr {}
impl sealed::Sealed for LocalMrRef<'_> {}
impl sealed::Sealed for LocalMrMut<'_> {}

impl Local for LocalMr {
    fn span(&self) -> Span {
        Span {
            inner: self.inner.clone(),
            offset: 0,
            len: self.len(),
        }
    }
}

impl Local for LocalMrRef<'_> {
    fn span(&self) -> Span {
        Span {
            inner: self.mr.inner.clone(),
            offset: self.offset,
            len: self.len,
        }
    }
}

impl Local for LocalMrMut<'_> {
    fn span(&self) -> Span {
        Span {
            inner: self.mr.inner.clone(),
            offset: self.offset,
            len: self.len,
        }
    }
}

impl LocalMut for LocalMr {}
impl LocalMut for LocalMrMut<'_> {}

/// A peer's memory region, or part of one: address, length, remote key and the rights it
/// grants. Obtained from the peer through a connection
/// ([`crate::Connection::receive_shared_mr`] and the agent's lending), or decoded from a
/// descriptor the peer made ([`LocalMr::descriptor`], [`RemoteMr::from_descriptor`]).
///
/// Descriptors are bytes, so a remote region can be made up from bytes that no peer
/// produced; that gains nothing: the peer's NIC checks every access against its
/// registration (key, protection domain, bounds, rights), so a made-up or stale region
/// reaches no memory and the access fails with a remote access error. Ending a lease or
/// revoking a region ([`LocalMr`]) ends the registration, whatever copies of its
/// descriptor exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteMr {
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) rkey: u32,
    /// The remote rights of the registration (REMOTE_*, FLUSH_*).
    pub(crate) access: AccessFlags,
}

/// Bytes of a region token on the wire (address, length, key, rights).
pub(crate) const TOKEN_LEN: usize = 24;

/// Magic and version of an MR descriptor.
const DESC_MAGIC: &[u8; 3] = b"RMR";
const DESC_VERSION: u8 = 1;
/// Bytes of an MR descriptor.
pub const MR_DESCRIPTOR_LEN: usize = 4 + TOKEN_LEN;

impl RemoteMr {
    /// Bytes in the region.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The part of the region in `range`.
    pub fn get(&self, range: impl RangeBounds<u64>) -> Result<RemoteMr> {
        let (start, len) = resolve_bounds(
            self.len,
            range.start_bound().cloned(),
            range.end_bound().cloned(),
        )?;
        Ok(RemoteMr {
            addr: self.addr + start,
            len,
            rkey: self.rkey,
            access: self.access,
        })
    }

    /// The remote rights the peer registered the region with (`REMOTE_READ`,
    /// `REMOTE_WRITE`, `REMOTE_ATOMIC`, `FLUSH_GLOBAL`, `FLUSH_PERSISTENT`).
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// Whether the peer's region takes a RoCEv2 FLUSH of this placement type.
    pub fn supports_flush(&self, flush: crate::FlushType) -> bool {
        self.access.contains(match flush {
            crate::FlushType::Visibility => AccessFlags::FLUSH_GLOBAL,
            crate::FlushType::Persistent => AccessFlags::FLUSH_PERSISTENT,
        })
    }

    /// Encodes the region as an MR descriptor ([`MR_DESCRIPTOR_LEN`] bytes: magic `RMR`,
    /// version, then address, length, key and rights, big-endian).
    pub fn descriptor(&self) -> Vec<u8> {
        let mut d = Vec::with_capacity(MR_DESCRIPTOR_LEN);
        d.extend_from_slice(DESC_MAGIC);
        d.push(DESC_VERSION);
        d.extend_from_slice(&self.to_bytes());
        d
    }

    /// Decodes an MR descriptor. Total: any input that is not a descriptor of this
    /// version (length, magic, version, unknown rights bits, a range wrapping past 2^64)
    /// is an [`Error::Descriptor`], never a panic.
    pub fn from_descriptor(bytes: &[u8]) -> Result<RemoteMr> {
        let bad = |why: &str| Error::Descriptor(why.to_string());
        if bytes.len() != MR_DESCRIPTOR_LEN {
            return Err(bad("wrong length for an MR descriptor"));
        }
        if &bytes[..3] != DESC_MAGIC {
            return Err(bad("not an MR descriptor"));
        }
        if bytes[3] != DESC_VERSION {
            return Err(Error::Descriptor(format!(
                "MR descriptor version {} (this is version {DESC_VERSION})",
                bytes[3]
            )));
        }
        let mr = RemoteMr::from_bytes(&bytes[4..]).ok_or_else(|| bad("malformed fields"))?;
        if mr.addr.checked_add(mr.len).is_none() {
            return Err(bad("the region wraps past the end of the address space"));
        }
        Ok(mr)
    }

    pub(crate) fn to_bytes(self) -> [u8; TOKEN_LEN] {
        let mut b = [0; TOKEN_LEN];
        b[..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..16].copy_from_slice(&self.len.to_be_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        b[20..].copy_from_slice(&self.access.bits().to_be_bytes());
        b
    }

    /// Decodes a token; `None` if it is short or names rights that are not remote ones.
    pub(crate) fn from_bytes(b: &[u8]) -> Option<RemoteMr> {
        let bits = u32::from_be_bytes(b.get(20..24)?.try_into().ok()?);
        let access = AccessFlags::from_bits(bits).filter(|a| AccessFlags::REMOTE.contains(*a))?;
        Some(RemoteMr {
            addr: u64::from_be_bytes(b.get(..8)?.try_into().ok()?),
            len: u64::from_be_bytes(b.get(8..16)?.try_into().ok()?),
            rkey: u32::from_be_bytes(b.get(16..20)?.try_into().ok()?),
            access,
        })
    }
}

/// Registers `buf` in `pd` with `access`.
pub(crate) fn register(
    pd: &Arc<dyn remem_verbs::ProtectionDomain>,
    buf: MemoryBuffer,
    access: AccessFlags,
) -> Result<LocalMr> {
    let region = MemRegion::whole(Arc::new(buf));
    Ok(LocalMr::new(pd.reg_mr(region, access)?))
}
