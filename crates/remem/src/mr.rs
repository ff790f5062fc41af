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
    /// The registration of exactly this range through which the peer reaches it, when it
    /// is not reached through `mr` (a pool block, whose slab is registered for local
    /// access only, or a region given away or lent, [`LocalMr::give_token`]): made on
    /// first use, dropped when access is revoked ([`LocalMr::revoke_remote`]) or with the
    /// region (first: see `Drop`).
    lent: Mutex<Option<Lent>>,
    pub(crate) mr: Arc<dyn MemoryRegion>,
    /// Where the block starts within `mr`.
    offset: usize,
    len: usize,
    /// The access rights lending grants (the registration's own, or for memory registered
    /// for local access only, such as a pool block, the rights it was allocated with).
    access: AccessFlags,
    /// The pool block, returned to its pool when the region is dropped — after `lent`
    /// has ended ([`MrInner`]'s `Drop`).
    block: Option<crate::pool::Block>,
}

/// A registration for remote access of exactly a region's range. Held by its region
/// alone (private, not `Clone`), which ends it before anything else of it, so a pool
/// block never goes back to its pool (to be handed out for other data) while a key a peer
/// holds for it still works.
struct Lent {
    mr: Arc<dyn MemoryRegion>,
}

impl Drop for MrInner {
    fn drop(&mut self) {
        // The peer's registration ends (its key reaches nothing) before the block returns
        // to the pool, which happens when the fields drop, after this.
        self.end_lent();
    }
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
    pub(crate) fn at(&self, offset: usize, len: usize) -> Result<usize> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.offset + offset),
            _ => Err(Error::OutOfRange {
                start: offset,
                end: offset.saturating_add(len),
                len: self.len,
            }),
        }
    }

    pub(crate) fn region(&self) -> &MemRegion {
        self.mr.region()
    }

    /// The first `len` bytes of this region (of its block, for a pool region) as a
    /// region of the buffer, to register anew.
    fn range(&self, len: usize) -> Result<MemRegion> {
        let start = self.region().offset() + self.offset;
        Ok(MemRegion::new(
            self.region().buffer().clone(),
            start..start + len,
        )?)
    }

    /// Whether the peer reaches the region through its own registration (memory the
    /// application registered for remote access), rather than through one made for it
    /// (`lent`).
    fn remote_via_own(&self) -> bool {
        self.block.is_none() && self.mr.access().intersects(AccessFlags::REMOTE)
    }

    /// The remote key of the registration made for the peer (made now if there is none).
    fn lent_rkey(&self, pd: &Arc<dyn ProtectionDomain>) -> Result<u32> {
        let mut lent = self.lent.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = &*lent {
            return Ok(l.mr.rkey());
        }
        // A pool block is at least 64 bytes: an empty one is registered as one byte, which
        // providers accept (some refuse empty registrations) and which is still its own.
        let len = if self.block.is_some() {
            self.len.max(1)
        } else {
            self.len
        };
        let mr = pd.reg_mr(self.range(len)?, self.access)?;
        let rkey = mr.rkey();
        *lent = Some(Lent { mr });
        Ok(rkey)
    }

    /// Ends the registration made for the peer, if any: its key reaches nothing from now
    /// on, whoever else still holds the region.
    fn end_lent(&self) {
        let lent = self.lent.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(lent);
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
        let access = mr.access();
        Self::lending(mr, access)
    }

    /// A region over the whole of `mr` that grants `access` when it is lent (through a
    /// registration of its own when `mr` is registered for local access only).
    pub(crate) fn lending(mr: Arc<dyn MemoryRegion>, access: AccessFlags) -> Self {
        LocalMr {
            inner: Arc::new(MrInner {
                lent: Mutex::new(None),
                offset: 0,
                len: mr.len(),
                mr,
                access,
                block: None,
            }),
        }
    }

    /// A region over a pool block: `len` bytes at `offset` in the block's registration.
    pub(crate) fn from_block(block: crate::pool::Block, len: usize, access: AccessFlags) -> Self {
        LocalMr {
            inner: Arc::new(MrInner {
                lent: Mutex::new(None),
                mr: block.mr().clone(),
                offset: block.offset(),
                len,
                access,
                block: Some(block),
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
    /// registered for local access only. The registration made for the peer
    /// ([`LocalMr::give_token`]) ends now, whoever else still holds the region (an
    /// operation of this side still in flight); a region whose own registration grants
    /// remote access (memory the application registered so, and shared before) is
    /// registered anew for local access, and its old registration ends once no operation
    /// of this side uses it. The region keeps the rights it grants when lent again.
    pub(crate) fn revoke_remote(self, pd: &Arc<dyn ProtectionDomain>) -> Result<LocalMr> {
        let inner = &self.inner;
        inner.end_lent();
        if !inner.remote_via_own() {
            return Ok(self);
        }
        let local = pd.reg_mr(inner.range(inner.len)?, AccessFlags::LOCAL_WRITE)?;
        Ok(LocalMr::lending(local, inner.access))
    }

    /// A token the peer can use to reach this whole region with the rights it was
    /// allocated with. Memory registered for local access only (a pool block) is
    /// registered for the peer on first use — exactly its range (once; the registration
    /// ends with the region), so the peer reaches nothing else of the pool.
    pub(crate) fn token(&self, pd: &Arc<dyn ProtectionDomain>) -> Result<RemoteMr> {
        let inner = &self.inner;
        let rkey = if inner.remote_via_own() {
            inner.mr.rkey()
        } else {
            inner.lent_rkey(pd)?
        };
        Ok(self.remote(rkey))
    }

    /// Ends the registration made for the peer ([`LocalMr::give_token`]) now, whoever
    /// else still holds the region.
    pub(crate) fn end_remote(&self) {
        self.inner.end_lent();
    }

    /// A token for a region that is given away or lent: always through a registration
    /// made for the peer, which [`LocalMr::revoke_remote`] (ownership coming back) or the
    /// region's end deregisters — whatever else still holds the region, such as an
    /// operation of this side still in flight.
    pub(crate) fn give_token(&self, pd: &Arc<dyn ProtectionDomain>) -> Result<RemoteMr> {
        Ok(self.remote(self.inner.lent_rkey(pd)?))
    }

    fn remote(&self, rkey: u32) -> RemoteMr {
        RemoteMr {
            addr: self.addr(),
            len: self.len() as u64,
            rkey,
            access: self.inner.access & AccessFlags::REMOTE,
        }
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

impl<'a> LocalMrRef<'a> {
    /// The part of the view in `range`, in bytes from the view's start (the same rules as
    /// [`LocalMr::get`] and [`RemoteMr::get`]: a part of a part is sliced alike on both
    /// sides).
    ///
    /// ```
    /// # fn main() -> Result<(), remem::Error> {
    /// let rdma = remem::RdmaBuilder::new().device("soft@127.0.0.11:0").build()?;
    /// let mr = rdma.alloc_local_mr(std::alloc::Layout::array::<u8>(64).unwrap())?;
    /// mr.write(0, &(0..64).collect::<Vec<u8>>())?;
    /// let record = mr.get(16..48)?;
    /// assert_eq!(record.get(4..8)?.to_vec(), [20, 21, 22, 23]);
    /// assert!(record.get(30..34).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn get(&self, range: impl RangeBounds<usize>) -> Result<LocalMrRef<'a>> {
        let (offset, len) = resolve(self.len, range)?;
        Ok(LocalMrRef {
            mr: self.mr,
            offset: self.offset + offset,
            len,
        })
    }
}

impl LocalMrMut<'_> {
    /// A shared view of the part of this view in `range`, in bytes from its start (as
    /// [`LocalMrRef::get`]).
    pub fn get(&self, range: impl RangeBounds<usize>) -> Result<LocalMrRef<'_>> {
        let (offset, len) = resolve(self.len, range)?;
        Ok(LocalMrRef {
            mr: self.mr,
            offset: self.offset + offset,
            len,
        })
    }

    /// An exclusive view of the part of this view in `range`, in bytes from its start,
    /// usable as an operation's target.
    ///
    /// ```
    /// # fn main() -> Result<(), remem::Error> {
    /// let rdma = remem::RdmaBuilder::new().device("soft@127.0.0.12:0").build()?;
    /// let mut mr = rdma.alloc_local_mr(std::alloc::Layout::array::<u8>(64).unwrap())?;
    /// let mut record = mr.get_mut(16..48)?;
    /// record.get_mut(4..8)?.write(0, b"abcd")?;
    /// assert_eq!(record.get(4..8)?.to_vec(), b"abcd");
    /// assert!(record.get_mut(..33).is_err());
    /// assert_eq!(&mr.to_vec()[20..24], b"abcd");
    /// # Ok(())
    /// # }
    /// ```
    pub fn get_mut(&mut self, range: impl RangeBounds<usize>) -> Result<LocalMrMut<'_>> {
        let (offset, len) = resolve(self.len, range)?;
        Ok(LocalMrMut {
            mr: &mut *self.mr,
            offset: self.offset + offset,
            len,
        })
    }
}

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
    pub fn len(&self) -> usize {
        // Every region this crate holds fits (`RemoteMr::decode` refuses others).
        usize::try_from(self.len).unwrap_or(usize::MAX)
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The virtual address of its first byte in the peer's address space (what an RDMA
    /// work request names; the peer's NIC checks it against the registration).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The part of the region in `range`, in bytes from its start — the same index type
    /// and the same rules as [`LocalMr::get`]. A range outside the region is an
    /// [`Error::OutOfRange`] (checked arithmetic throughout: a region near the top of the
    /// address space gives an error, never an overflow).
    ///
    /// ```
    /// # fn f(remote: &remem::RemoteMr, local: &remem::LocalMr) -> Result<(), remem::Error> {
    /// // One index type for both sides: byte offsets as `usize`.
    /// let at: usize = 64;
    /// let dst = remote.get(at..at + 16)?;
    /// let src = local.get(at..at + 16)?;
    /// assert_eq!(dst.len(), src.len());
    /// assert!(remote.get(..remote.len() + 1).is_err());
    /// # Ok(()) }
    /// ```
    pub fn get(&self, range: impl RangeBounds<usize>) -> Result<RemoteMr> {
        let widen = |b: Bound<&usize>| b.map(|&x| x as u64);
        let (start, len) = resolve_bounds(
            self.len,
            widen(range.start_bound()),
            widen(range.end_bound()),
        )?;
        let addr = self
            .addr
            .checked_add(start)
            .filter(|a| a.checked_add(len).is_some())
            .ok_or(Error::OutOfRange {
                start: usize::try_from(start).unwrap_or(usize::MAX),
                end: usize::try_from(start.saturating_add(len)).unwrap_or(usize::MAX),
                len: self.len(),
            })?;
        Ok(RemoteMr {
            addr,
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
        RemoteMr::decode(&bytes[4..])
    }

    pub(crate) fn to_bytes(self) -> [u8; TOKEN_LEN] {
        let mut b = [0; TOKEN_LEN];
        b[..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..16].copy_from_slice(&self.len.to_be_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        b[20..].copy_from_slice(&self.access.bits().to_be_bytes());
        b
    }

    /// Decodes a token from the peer; `None` if it is not a valid one ([`RemoteMr::decode`]).
    pub(crate) fn from_bytes(b: &[u8]) -> Option<RemoteMr> {
        RemoteMr::decode(b).ok()
    }

    /// Decodes a token ([`TOKEN_LEN`] bytes or more; the rest is ignored): an
    /// [`Error::Descriptor`] if it is short, names rights that are not remote ones, or
    /// describes a range wrapping past the end of the address space (`addr + len` above
    /// 2^64), so every region this crate holds can be sliced and addressed without
    /// overflow.
    pub(crate) fn decode(b: &[u8]) -> Result<RemoteMr> {
        let bad = |why: &str| Error::Descriptor(why.to_string());
        let field = |r: std::ops::Range<usize>| b.get(r).ok_or_else(|| bad("a short token"));
        let be64 = |r| field(r).map(|f| u64::from_be_bytes(f.try_into().unwrap_or_default()));
        let (addr, len) = (be64(0..8)?, be64(8..16)?);
        let rkey = u32::from_be_bytes(field(16..20)?.try_into().unwrap_or_default());
        let bits = u32::from_be_bytes(field(20..24)?.try_into().unwrap_or_default());
        let access = AccessFlags::from_bits(bits)
            .filter(|a| AccessFlags::REMOTE.contains(*a))
            .ok_or_else(|| bad("malformed fields: rights that are not remote ones"))?;
        if addr.checked_add(len).is_none() {
            return Err(bad("the region wraps past the end of the address space"));
        }
        if usize::try_from(len).is_err() {
            return Err(bad("a region larger than this host can index"));
        }
        Ok(RemoteMr {
            addr,
            len,
            rkey,
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn token(addr: u64, len: u64) -> RemoteMr {
        RemoteMr {
            addr,
            len,
            rkey: 0x1234,
            access: AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
        }
    }

    #[test]
    fn a_token_wrapping_past_2_64_is_refused() {
        // The largest region that ends exactly at 2^64 is fine; one byte more wraps.
        let top = token(u64::MAX - 4095, 4095);
        assert_eq!(RemoteMr::from_bytes(&top.to_bytes()), Some(top));
        assert_eq!(top.get(4000..).unwrap().addr, u64::MAX - 95);
        let wraps = token(u64::MAX - 4095, 4097).to_bytes();
        assert_eq!(RemoteMr::from_bytes(&wraps), None);
        assert!(matches!(
            RemoteMr::decode(&wraps),
            Err(Error::Descriptor(_))
        ));
        // A region this crate made up anyway (fields are the crate's own) slices with an
        // error, not an overflow.
        assert!(matches!(
            token(u64::MAX, 16).get(8..16),
            Err(Error::OutOfRange { .. })
        ));
    }

    #[test]
    fn local_and_remote_ranges_take_the_same_index_type() {
        // `usize` byte offsets on both sides, no conversions: a range computed for one
        // slices the other.
        let remote = token(0x10_0000, 4096);
        let (at, n): (usize, usize) = (1000, 24);
        let part = remote.get(at..at + n).unwrap();
        assert_eq!((part.addr(), part.len()), (0x10_0000 + 1000, n));
        assert_eq!(remote.get(at..).unwrap().len(), remote.len() - at);
        assert_eq!(remote.get(..=at).unwrap().len(), at + 1);
        assert!(matches!(
            remote.get(at..remote.len() + 1),
            Err(Error::OutOfRange {
                start: 1000,
                end: 4097,
                len: 4096
            })
        ));
        assert_eq!(resolve(4096, at..at + n).unwrap(), (at, n));
    }

    proptest! {
        /// Tokens near the top of the address space: decoding never panics, refuses
        /// exactly those whose range wraps, and round-trips the others; slicing what
        /// decoded never panics and stays inside the region.
        #[test]
        fn tokens_near_2_64_decode_and_slice_totally(
            below in 0u64..(1 << 20),
            len in prop_oneof![0u64..(1 << 21), (u64::MAX - (1 << 20))..=u64::MAX],
            rkey in any::<u32>(),
            start in any::<u64>(),
            n in 0u64..(1 << 21),
        ) {
            let t = RemoteMr { rkey, ..token(u64::MAX - below, len) };
            let bytes = t.to_bytes();
            match RemoteMr::from_bytes(&bytes) {
                None => prop_assert!(t.addr.checked_add(t.len).is_none()),
                Some(mr) => {
                    prop_assert_eq!(mr, t);
                    prop_assert_eq!(mr.to_bytes(), bytes);
                    let mut d = DESC_MAGIC.to_vec();
                    d.push(DESC_VERSION);
                    d.extend_from_slice(&bytes);
                    prop_assert_eq!(RemoteMr::from_descriptor(&d).unwrap(), t);
                    let start = (start % mr.len.saturating_add(2)) as usize;
                    if let Ok(part) = mr.get(start..start.saturating_add(n as usize)) {
                        prop_assert!(part.addr >= mr.addr);
                        prop_assert!(part.addr.checked_add(part.len).is_some());
                        prop_assert!(part.addr + part.len <= mr.addr + mr.len);
                    }
                    let _ = mr.get(start..);
                    let _ = mr.get(..=start);
                }
            }
        }
    }
}
