//! Typed access to memory regions: plain-old-data values at an offset, and 8-byte words
//! for atomics.
//!
//! A value type is anything [`zerocopy`] can view as bytes: reading needs
//! [`FromBytes`] (every bit pattern is a valid `T`: the peer may have written anything),
//! writing needs [`IntoBytes`] + [`Immutable`] (no padding, no interior mutability). The
//! integers, floats, arrays of them, and `#[repr(C)]` structs deriving those traits
//! qualify; remem re-exports the crate as [`crate::zerocopy`], so an application derives
//! them without a dependency of its own (`#[zerocopy(crate = "remem::zerocopy")]`).
//!
//! - Local: [`LocalMr::read_value`] / [`LocalMr::write_value`] copy a value out of or into
//!   the region; [`LocalMr::compare_and_swap_u64`] / [`LocalMr::fetch_and_add_u64`] are
//!   atomic read-modify-writes of one of its words.
//! - Remote: [`RemoteMr::at`] names a value of the peer's region ([`RemoteValue`]),
//!   [`RemoteMr::word`] an aligned word for atomics ([`RemoteWord`]), both checked once,
//!   when they are made; [`Connection::read_value`] / [`Connection::write_value`] move a
//!   value with one RDMA READ / WRITE through a small registered bounce buffer of this
//!   side (from the allocation pool: no registration per call).
//!
//! Offsets are bytes from the start of the region, `usize` on both sides, as for
//! [`LocalMr::get`] and [`RemoteMr::get`]. Values need no alignment (they are copied);
//! words do: an atomic acts on an 8-byte aligned address (IBTA), checked when the word is
//! named, so the error comes before anything is posted.
//!
//! # Local and remote atomics on one word
//!
//! An RDMA atomic is atomic with respect to other RDMA atomics on the same word; whether
//! it is atomic with respect to the host CPU's atomics on that memory depends on the
//! device. [`Rdma::local_atomics_coherent`] says: the soft provider executes the peer's
//! atomics as CPU atomics ([`std::sync::atomic::AtomicU64`]) on the region's memory, the
//! same word [`LocalMr::fetch_and_add_u64`] uses, so they are; an RDMA NIC's are only
//! where the device reports `IBV_ATOMIC_GLOB` ([`remem_verbs::AtomicCap::Glob`] in
//! [`remem_verbs::DeviceAttr::atomic_cap`]). With `IBV_ATOMIC_HCA` (most NICs, and kernel
//! Soft-RoCE), mix them and updates may be lost: let the host go through its own NIC (an
//! atomic on a loopback connection) instead.

use crate::conn::Connection;
use crate::error::{Error, Result};
use crate::mr::{LocalMr, RemoteMr};
use crate::rdma::Rdma;
use remem_verbs::{AtomicCap, MemError};
use std::alloc::Layout;
use std::marker::PhantomData;
use std::ops::Deref;
use zerocopy::{FromBytes, Immutable, IntoBytes};

/// Bytes of an atomic word, and its alignment.
const WORD: usize = 8;

/// Values up to this size are assembled on the stack.
const SMALL: usize = 64;

/// The error for an atomic word at an address that is not 8-byte aligned (the one the
/// memory layer gives, so local and remote words fail alike).
fn misaligned(addr: u64) -> Error {
    MemError::Misaligned { addr }.into()
}

/// A `T` made from `size_of::<T>()` bytes that `fill` writes.
fn assemble<T: FromBytes>(fill: impl FnOnce(&mut [u8]) -> Result<()>) -> Result<T> {
    let size = std::mem::size_of::<T>();
    let mut small = [0u8; SMALL];
    let mut large = Vec::new();
    let bytes = if size <= SMALL {
        &mut small[..size]
    } else {
        large.resize(size, 0);
        &mut large[..]
    };
    fill(bytes)?;
    // The length is exactly the value's.
    T::read_from_bytes(bytes).map_err(|_| Error::InvalidArgument("value size".into()))
}

/// A value of type `T` in a peer's region: the region's `size_of::<T>()` bytes at an offset
/// ([`RemoteMr::at`]), checked to lie inside it. Read and written with
/// [`Connection::read_value`] and [`Connection::write_value`]; it dereferences to that
/// part of the region ([`RemoteMr`]), for the untyped operations.
///
/// ```
/// use remem::zerocopy::{FromBytes, Immutable, IntoBytes};
///
/// #[derive(FromBytes, IntoBytes, Immutable, Debug, PartialEq, Clone, Copy)]
/// #[zerocopy(crate = "remem::zerocopy")]
/// #[repr(C)]
/// struct Entry {
///     version: u64,
///     value: [u8; 16],
/// }
///
/// # fn main() -> Result<(), remem::Error> {
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// # let b = remem::RdmaBuilder::new().device("soft@127.0.0.6:0").build()?;
/// # let a = remem::RdmaBuilder::new().device("soft@127.0.0.5:0").build()?;
/// # let listener = b.listen("127.0.0.1:0").await?;
/// # let (conn, peer) = tokio::join!(a.connect(listener.local_addr()?), listener.accept());
/// # let (conn, peer) = (conn?, peer?);
/// let table = b.alloc_local_mr(std::alloc::Layout::from_size_align(4096, 8).unwrap())?;
/// peer.share_local_mr(&table).await?;
/// let remote = conn.receive_shared_mr().await?;
///
/// // The third entry of the peer's table, bounds-checked once.
/// let slot = remote.at::<Entry>(2 * size_of::<Entry>())?;
/// let entry = Entry { version: 7, value: *b"sixteen bytes..." };
/// conn.write_value(&slot, &entry).await?;
/// assert_eq!(conn.read_value(&slot).await?, entry);
/// assert_eq!(table.read_value::<Entry>(48)?, entry);
///
/// // A value that does not fit is refused when it is named.
/// assert!(matches!(remote.at::<Entry>(4090), Err(remem::Error::OutOfRange { .. })));
/// # Ok(()) })
/// # }
/// ```
pub struct RemoteValue<T> {
    mr: RemoteMr,
    // Names a `T` without owning one: `Send`, `Sync` and `Copy` whatever `T` is.
    _type: PhantomData<fn() -> T>,
}

impl<T> RemoteValue<T> {
    /// The bytes of the value, as an untyped region.
    pub fn mr(&self) -> &RemoteMr {
        &self.mr
    }
}

impl<T> Clone for RemoteValue<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for RemoteValue<T> {}

impl<T> PartialEq for RemoteValue<T> {
    fn eq(&self, other: &Self) -> bool {
        self.mr == other.mr
    }
}

impl<T> Eq for RemoteValue<T> {}

impl<T> std::fmt::Debug for RemoteValue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteValue")
            .field("type", &std::any::type_name::<T>())
            .field("addr", &format_args!("{:#x}", self.mr.addr))
            .finish()
    }
}

impl<T> Deref for RemoteValue<T> {
    type Target = RemoteMr;

    fn deref(&self) -> &RemoteMr {
        &self.mr
    }
}

/// An 8-byte word of a peer's region at an 8-byte aligned address ([`RemoteMr::word`]):
/// the target of RDMA atomics. It dereferences to its 8 bytes ([`RemoteMr`]), so the
/// atomics take it as they are: [`Connection::fetch_and_add`],
/// [`Connection::compare_and_swap`], [`Connection::atomic_write`].
///
/// ```
/// # fn main() -> Result<(), remem::Error> {
/// # tokio::runtime::Runtime::new()?.block_on(async {
/// # let b = remem::RdmaBuilder::new().device("soft@127.0.0.8:0").build()?;
/// # let a = remem::RdmaBuilder::new().device("soft@127.0.0.7:0").build()?;
/// # let listener = b.listen("127.0.0.1:0").await?;
/// # let (conn, peer) = tokio::join!(a.connect(listener.local_addr()?), listener.accept());
/// # let (conn, peer) = (conn?, peer?);
/// let counters = b.alloc_local_mr(std::alloc::Layout::from_size_align(64, 8).unwrap())?;
/// peer.share_local_mr(&counters).await?;
/// let remote = conn.receive_shared_mr().await?;
///
/// let hits = remote.word(8)?;
/// assert_eq!(conn.fetch_and_add(&hits, 1).await?, 0);
/// assert_eq!(conn.compare_and_swap(&hits, 1, 10).await?, 1);
/// assert_eq!(conn.read_value(&hits.value()).await?, 10);
/// assert_eq!(counters.load_u64(8)?, 10);
///
/// // Atomics need an 8-byte aligned word: refused before anything is posted.
/// assert!(remote.word(4).is_err());
/// # Ok(()) })
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteWord {
    mr: RemoteMr,
}

impl RemoteWord {
    /// Its 8 bytes, as an untyped region.
    pub fn mr(&self) -> &RemoteMr {
        &self.mr
    }

    /// The word as a `u64` value, for [`Connection::read_value`] and
    /// [`Connection::write_value`] (one RDMA READ or WRITE of its 8 bytes: not an
    /// atomic).
    pub fn value(&self) -> RemoteValue<u64> {
        RemoteValue {
            mr: self.mr,
            _type: PhantomData,
        }
    }
}

impl Deref for RemoteWord {
    type Target = RemoteMr;

    fn deref(&self) -> &RemoteMr {
        &self.mr
    }
}

impl From<RemoteWord> for RemoteValue<u64> {
    fn from(w: RemoteWord) -> Self {
        w.value()
    }
}

impl RemoteMr {
    /// The `T` at `offset` of the region (its `size_of::<T>()` bytes there), for
    /// [`Connection::read_value`] and [`Connection::write_value`]. An [`Error::OutOfRange`]
    /// if it does not lie inside the region; any offset inside is fine (values are
    /// copied, not accessed in place). See [`RemoteValue`] for an example.
    pub fn at<T>(&self, offset: usize) -> Result<RemoteValue<T>> {
        let size = std::mem::size_of::<T>();
        let end = offset.checked_add(size).ok_or(Error::OutOfRange {
            start: offset,
            end: usize::MAX,
            len: self.len(),
        })?;
        Ok(RemoteValue {
            mr: self.get(offset..end)?,
            _type: PhantomData,
        })
    }

    /// The 8-byte word at `offset` of the region, for atomics. An [`Error::OutOfRange`] if
    /// it does not lie inside the region, an [`Error::Verbs`] with
    /// [`MemError::Misaligned`] if its address is not 8-byte aligned (IBTA: atomics act on
    /// aligned words). See [`RemoteWord`] for an example.
    pub fn word(&self, offset: usize) -> Result<RemoteWord> {
        let mr = self.at::<u64>(offset)?.mr;
        if !mr.addr.is_multiple_of(WORD as u64) {
            return Err(misaligned(mr.addr));
        }
        Ok(RemoteWord { mr })
    }
}

impl LocalMr {
    /// A copy of the `T` at `offset` of the region (its `size_of::<T>()` bytes there; any
    /// offset, no alignment needed). An [`Error::OutOfRange`] if it does not lie inside
    /// the region. Like [`LocalMr::read`], a copy: a peer writing meanwhile races on
    /// values (the copy may mix old and new bytes), never on memory safety.
    ///
    /// ```
    /// # fn main() -> Result<(), remem::Error> {
    /// let rdma = remem::RdmaBuilder::new().device("soft@127.0.0.9:0").build()?;
    /// let mr = rdma.alloc_local_mr(std::alloc::Layout::from_size_align(64, 8).unwrap())?;
    /// mr.write_value(3, &0x0102_0304u32)?;
    /// assert_eq!(mr.read_value::<u32>(3)?, 0x0102_0304);
    /// assert_eq!(mr.read_value::<[u8; 2]>(3)?, 0x0102_0304u32.to_ne_bytes()[..2]);
    /// assert!(mr.read_value::<u64>(60).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn read_value<T: FromBytes>(&self, offset: usize) -> Result<T> {
        assemble(|bytes| self.read(offset, bytes))
    }

    /// Copies `value` into the region at `offset` (any offset, no alignment needed). An
    /// [`Error::OutOfRange`] if it does not fit; then nothing is written. See
    /// [`LocalMr::read_value`] for an example.
    pub fn write_value<T: IntoBytes + Immutable + ?Sized>(
        &self,
        offset: usize,
        value: &T,
    ) -> Result<()> {
        self.write(offset, value.as_bytes())
    }

    /// Compares the 8-byte word at `offset` (8-byte aligned) with `compare` and, if equal,
    /// replaces it with `swap`, atomically; returns the value it held (what
    /// [`Connection::compare_and_swap`] does to a peer's word).
    ///
    /// Atomic with respect to the peer's RDMA atomics on the same word where
    /// [`Rdma::local_atomics_coherent`] says so (soft devices; NICs reporting
    /// `IBV_ATOMIC_GLOB`), and always with respect to this process's other atomics on it.
    ///
    /// ```
    /// # fn main() -> Result<(), remem::Error> {
    /// let rdma = remem::RdmaBuilder::new().device("soft@127.0.0.10:0").build()?;
    /// let mr = rdma.alloc_local_mr(std::alloc::Layout::from_size_align(64, 8).unwrap())?;
    /// // A lock word: taken only if free.
    /// assert_eq!(mr.compare_and_swap_u64(16, 0, 1)?, 0);
    /// assert_eq!(mr.compare_and_swap_u64(16, 0, 1)?, 1); // held: unchanged
    /// assert_eq!(mr.fetch_and_add_u64(24, 5)?, 0);
    /// assert_eq!(mr.load_u64(24)?, 5);
    /// assert!(rdma.local_atomics_coherent()); // a soft device
    /// assert!(mr.fetch_and_add_u64(20, 1).is_err()); // not 8-byte aligned
    /// # Ok(())
    /// # }
    /// ```
    pub fn compare_and_swap_u64(&self, offset: usize, compare: u64, swap: u64) -> Result<u64> {
        let at = self.word_at(offset)?;
        Ok(self.inner.mr.region().compare_swap_u64(at, compare, swap)?)
    }

    /// Adds `add` to the 8-byte word at `offset` (8-byte aligned, wrapping), atomically;
    /// returns the value it held (what [`Connection::fetch_and_add`] does to a peer's
    /// word). Coherent with the peer's RDMA atomics as [`LocalMr::compare_and_swap_u64`]
    /// is, which has an example.
    pub fn fetch_and_add_u64(&self, offset: usize, add: u64) -> Result<u64> {
        let at = self.word_at(offset)?;
        Ok(self.inner.mr.region().fetch_add_u64(at, add)?)
    }

    /// The offset in the registration of the aligned word at `offset`, or why there is
    /// none.
    fn word_at(&self, offset: usize) -> Result<usize> {
        let at = self.inner.at(offset, WORD)?;
        let addr = self.addr().wrapping_add(offset as u64);
        if !addr.is_multiple_of(WORD as u64) {
            return Err(misaligned(addr));
        }
        Ok(at)
    }
}

impl Rdma {
    /// Whether this device's RDMA atomics are atomic with respect to the host CPU's
    /// atomics on the same memory ([`LocalMr::compare_and_swap_u64`],
    /// [`LocalMr::fetch_and_add_u64`]), so that this side may update a word with local
    /// atomics while peers update it with RDMA atomics.
    ///
    /// True on soft devices (they execute RDMA atomics as CPU atomics on the region's
    /// memory) and on devices that report `IBV_ATOMIC_GLOB`
    /// ([`remem_verbs::DeviceAttr::atomic_cap`]); false on those that report
    /// `IBV_ATOMIC_HCA` (atomic only among the device's own atomics: most NICs, kernel
    /// Soft-RoCE) or no atomics, and when the device cannot be queried. See
    /// [`LocalMr::compare_and_swap_u64`] for an example.
    pub fn local_atomics_coherent(&self) -> bool {
        let ctx = self.context();
        ctx.info().provider == "soft"
            || ctx
                .query_device()
                .is_ok_and(|a| a.atomic_cap == AtomicCap::Glob)
    }
}

/// The `Rdma` a connection allocates its bounce buffers from.
fn rdma_of(conn: &Connection) -> &Rdma {
    &conn.shared().rdma
}

/// A registered bounce buffer of `size` bytes (at least one) from the pool.
fn bounce(conn: &Connection, size: usize) -> Result<LocalMr> {
    let layout = Layout::from_size_align(size.max(1), 1)
        .map_err(|e| Error::InvalidArgument(e.to_string()))?;
    rdma_of(conn).alloc_local_mr_uninit(layout)
}

impl Connection {
    /// Reads the peer's value `src` ([`RemoteMr::at`]) with one RDMA READ, through a
    /// registered bounce buffer of this side. Not atomic: a value the peer changes
    /// meanwhile may arrive torn (check a version, or use [`RemoteWord`] atomics). Fails
    /// as [`Connection::read`] does. See [`RemoteValue`] for an example.
    pub async fn read_value<T: FromBytes>(&self, src: &RemoteValue<T>) -> Result<T> {
        let size = std::mem::size_of::<T>();
        if size == 0 {
            return assemble(|_| Ok(()));
        }
        let mut buf = bounce(self, size)?;
        self.read(&mut buf, &src.mr).await?;
        assemble(|bytes| buf.read(0, bytes))
    }

    /// Writes `value` into the peer's `dst` ([`RemoteMr::at`]) with one RDMA WRITE, from a
    /// registered bounce buffer of this side (the caller copies nothing into a registered
    /// region). Returns once the write is done; fails as [`Connection::write`] does. See
    /// [`RemoteValue`] for an example.
    pub async fn write_value<T: IntoBytes + Immutable>(
        &self,
        dst: &RemoteValue<T>,
        value: &T,
    ) -> Result<()> {
        let bytes = value.as_bytes();
        if bytes.is_empty() {
            return Ok(());
        }
        let buf = bounce(self, bytes.len())?;
        buf.write(0, bytes)?;
        self.write(&buf, &dst.mr).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{connect, layout};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;
    use zerocopy::{FromBytes, Immutable, IntoBytes};

    use crate::test_util::soft_pair as pair;

    #[derive(FromBytes, IntoBytes, Immutable, Debug, PartialEq, Clone, Copy)]
    #[repr(C)]
    struct Record {
        key: u64,
        len: u32,
        flags: u32,
        data: [u8; 48],
    }

    fn record(k: u8) -> Record {
        Record {
            key: u64::from(k) << 40 | 0xabc,
            len: u32::from(k) * 3,
            flags: 0x8000_0001,
            data: [k; 48],
        }
    }

    /// A region of the peer's: `b` allocates `n` bytes and shares them with `a`'s end.
    async fn shared_region(
        b: &Rdma,
        ca: &Connection,
        cb: &Connection,
        n: usize,
    ) -> (LocalMr, RemoteMr) {
        let target = b.alloc_local_mr(layout(n)).unwrap();
        cb.share_local_mr(&target).await.unwrap();
        (target, ca.receive_shared_mr().await.unwrap())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn values_travel_both_ways_at_any_offset_and_bounds_are_typed_errors() {
        let (a, b) = pair();
        let (ca, cb) = connect(&a, &b).await;
        let (target, remote) = shared_region(&b, &ca, &cb, 4096).await;
        // Unaligned offsets, a value larger than the stack buffer, a small one.
        for (k, at) in [0usize, 1, 13, 4096 - 64].into_iter().enumerate() {
            let r = record(k as u8 + 1);
            let slot = remote.at::<Record>(at).unwrap();
            assert_eq!(slot.len(), 64);
            ca.write_value(&slot, &r).await.unwrap();
            // Landed at exactly those bytes, in this machine's layout.
            assert_eq!(target.read_value::<Record>(at).unwrap(), r);
            assert_eq!(
                target.to_vec()[at..at + 64],
                *r.as_bytes(),
                "the value's bytes at {at}"
            );
            assert_eq!(ca.read_value(&slot).await.unwrap(), r);
        }
        let big = remote.at::<[u64; 100]>(3000).unwrap();
        let values: [u64; 100] = std::array::from_fn(|i| i as u64 * 0x0101_0101);
        ca.write_value(&big, &values).await.unwrap();
        assert_eq!(ca.read_value(&big).await.unwrap(), values);
        assert_eq!(target.read_value::<[u64; 100]>(3000).unwrap(), values);
        target.write_value(7, &0xfeu8).unwrap();
        let byte = remote.at::<u8>(7).unwrap();
        assert_eq!(ca.read_value(&byte).await.unwrap(), 0xfe);
        ca.read_value(&remote.at::<()>(4096).unwrap())
            .await
            .unwrap();

        // Out of range, however far: typed errors, never a panic.
        for at in [4096 - 63, 4096, usize::MAX - 10, usize::MAX] {
            assert!(
                matches!(remote.at::<Record>(at), Err(Error::OutOfRange { .. })),
                "{at}"
            );
            assert!(matches!(
                target.read_value::<Record>(at),
                Err(Error::OutOfRange { .. })
            ));
            assert!(matches!(
                target.write_value(at, &record(1)),
                Err(Error::OutOfRange { .. })
            ));
        }
        // A part of the region bounds its values.
        let part = remote.get(100..200).unwrap();
        assert!(part.at::<[u8; 100]>(0).is_ok());
        assert!(part.at::<[u8; 100]>(1).is_err());
        // Nothing failed on the connection.
        assert!(ca.closed().is_none());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn words_are_checked_for_alignment_and_serve_the_atomics() {
        let (a, b) = pair();
        let (ca, cb) = connect(&a, &b).await;
        let (target, remote) = shared_region(&b, &ca, &cb, 64).await;
        for at in [1, 4, 7, 12, 52] {
            match remote.word(at) {
                Err(Error::Verbs(remem_verbs::Error::Mem(MemError::Misaligned { addr }))) => {
                    assert_eq!(addr, remote.addr() + at as u64)
                }
                other => panic!("word at {at}: {other:?}"),
            }
            assert!(target.fetch_and_add_u64(at, 1).is_err());
            assert!(target.compare_and_swap_u64(at, 0, 1).is_err());
        }
        for at in [64, 57, usize::MAX - 3] {
            assert!(matches!(remote.word(at), Err(Error::OutOfRange { .. })));
            assert!(matches!(
                target.fetch_and_add_u64(at, 1),
                Err(Error::OutOfRange { .. })
            ));
        }
        // A part of the region at an odd offset names no aligned word at its start.
        assert!(remote.get(4..).unwrap().word(0).is_err());
        assert!(remote.get(4..).unwrap().word(4).is_ok());

        let w = remote.word(56).unwrap();
        assert_eq!(w.len(), 8);
        assert_eq!(ca.fetch_and_add(&w, 40).await.unwrap(), 0);
        assert_eq!(ca.compare_and_swap(&w, 40, 42).await.unwrap(), 40);
        assert_eq!(ca.compare_and_swap(&w, 40, 0).await.unwrap(), 42);
        assert_eq!(ca.read_value(&w.value()).await.unwrap(), 42);
        ca.atomic_write(&w, 7).await.unwrap();
        assert_eq!(target.load_u64(56).unwrap(), 7);
        ca.write_value(&w.into(), &9u64).await.unwrap();
        assert_eq!(target.compare_and_swap_u64(56, 9, 10).unwrap(), 9);
        assert_eq!(ca.fetch_and_add(&w, 1).await.unwrap(), 10);
    }

    /// The peer adds to a word with RDMA fetch-and-add while this side adds to it with
    /// local fetch-and-add and compare-and-swap loops, at the same time: no update is
    /// lost. The local side starts once the first remote add has landed, and the remote
    /// side keeps adding until the local side is done, so the two overlap.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn local_atomics_and_the_peers_remote_atomics_lose_no_update() {
        const REMOTE: u64 = 1 << 32;
        const LOCAL_ADDS: u64 = 20_000;
        const LOCAL_CAS: u64 = 20_000;
        let (a, b) = pair();
        assert!(a.local_atomics_coherent() && b.local_atomics_coherent());
        let (ca, cb) = connect(&a, &b).await;
        let (target, remote) = shared_region(&b, &ca, &cb, 64).await;
        let target = Arc::new(target);
        let word = remote.word(24).unwrap();
        let done = Arc::new(AtomicBool::new(false));

        let local = std::thread::spawn({
            let (target, done) = (target.clone(), done.clone());
            move || {
                // Wait for the peer's first add (an event: the word changes).
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                while target.load_u64(24).unwrap() == 0 {
                    assert!(std::time::Instant::now() < deadline, "no remote add");
                    std::hint::spin_loop();
                }
                let mut retries = 0u64;
                for i in 0..LOCAL_ADDS.max(LOCAL_CAS) {
                    if i == LOCAL_ADDS.max(LOCAL_CAS) / 2 {
                        // Halfway, wait for one more remote add: it lands between local
                        // ones, whatever the scheduler does.
                        let remote_now = target.load_u64(24).unwrap() / REMOTE;
                        while target.load_u64(24).unwrap() / REMOTE == remote_now {
                            assert!(std::time::Instant::now() < deadline, "no remote add");
                            std::hint::spin_loop();
                        }
                    }
                    if i < LOCAL_ADDS {
                        target.fetch_and_add_u64(24, 1).unwrap();
                    }
                    if i < LOCAL_CAS {
                        // An increment by compare-and-swap, retried when the word moved.
                        let mut seen = target.load_u64(24).unwrap();
                        loop {
                            match target.compare_and_swap_u64(24, seen, seen + 1).unwrap() {
                                v if v == seen => break,
                                v => (seen, retries) = (v, retries + 1),
                            }
                        }
                    }
                }
                done.store(true, Ordering::Release);
                retries
            }
        });

        let mut remote_adds = 0u64;
        let mut saw_local_between = false;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while !done.load(Ordering::Acquire) || remote_adds < 100 {
            assert!(tokio::time::Instant::now() < deadline, "bounded");
            let before = ca.fetch_and_add(&word, REMOTE).await.unwrap();
            // Each add returns what it replaced: the remote part counts our earlier adds.
            assert_eq!(before / REMOTE, remote_adds);
            let local_part = before % REMOTE;
            saw_local_between |= local_part > 0 && local_part < LOCAL_ADDS + LOCAL_CAS;
            remote_adds += 1;
        }
        let retries = local.join().unwrap();
        assert_eq!(
            target.load_u64(24).unwrap(),
            remote_adds * REMOTE + LOCAL_ADDS + LOCAL_CAS,
            "lost updates ({remote_adds} remote adds, {retries} local CAS retries)"
        );
        assert!(saw_local_between, "a remote add landed between local ones");
    }
}
