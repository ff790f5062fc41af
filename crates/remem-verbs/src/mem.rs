//! Memory that a NIC — or, through it, a remote peer — reads and writes.
//!
//! This is the only module of remem's safe crates that uses `unsafe`. A [`MemoryBuffer`]
//! owns an allocation with a stable address (heap memory it allocated, a caller's `Vec<u8>`,
//! `Box<[u8]>` or `BytesMut`, or — through the unsafe [`MemoryBuffer::from_raw_parts`] —
//! memory someone else owns, such as a file mapping), and never hands out references to it.
//! Every access goes through methods that check bounds first.
//!
//! # The access model
//!
//! The software NIC writes into a buffer from its progress thread while the application may
//! read the same buffer from another thread: a data race if both used plain loads and
//! stores. So every access made here is an atomic access (relaxed ordering; completions
//! carry the happens-before edges), on a grid fixed per buffer:
//!
//! * bytes inside an 8-byte aligned word that lies wholly in the allocation are only ever
//!   accessed as that `AtomicU64` word (a partial write merges its bytes in with a
//!   compare-exchange loop);
//! * the at most 7 + 7 bytes at an unaligned start or end of the allocation are only ever
//!   accessed as single `AtomicU8`s.
//!
//! Each location thus has one access size, so no two accesses of different sizes can race
//! (which Rust's memory model does not allow). Remote atomics (compare-and-swap, fetch-add,
//! atomic write) are 8-byte atomic operations on aligned words, as IBTA requires.
//!
//! One exception, `unsafe` to call: [`MemoryBuffer::write_unshared`] copies with plain
//! stores (a `memcpy`) into bytes that nothing else accesses meanwhile — its caller
//! guarantees that no work request on them is in flight and that no peer may reach them,
//! so every other access is ordered before or after it (a byte stream's send buffer,
//! filled before it is posted).
//!
//! Two reads are made by the kernel instead, outside the Rust memory model as DMA is: the
//! soft NIC's `sendmsg` from [`MemoryBuffer::ptr_at`], and [`MemoryBuffer::read_careful`]
//! (`process_vm_readv`), which fails where the memory is no longer mapped instead of
//! faulting.
//!
//! A hardware NIC writes by DMA, which is outside the Rust memory model altogether; the
//! rdma-core provider relies on the same rule: safe code reaches registered memory only
//! through this module.

#![allow(unsafe_code)]

use crate::error::MemError;
use bytes::BytesMut;
use std::alloc::Layout;
use std::any::Any;
use std::ops::{Bound, RangeBounds};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};

/// Alignment of memory that [`MemoryBuffer::zeroed`] allocates: one page, as a NIC driver
/// prefers for registration.
pub const ALLOC_ALIGN: usize = 4096;

const WORD: usize = 8;

/// The chunk size [`MemoryBuffer::read_chunks`] is meant for: a whole 4096-byte packet
/// payload, so that a CRC over it is one call (`crc32fast`'s widest kernel pays a set-up per
/// call), and still within the L1 cache.
pub const READ_CHUNK: usize = 4096;

enum Owner {
    /// Allocated by `zeroed` with this layout (not used for zero-length buffers).
    Alloc(Layout),
    /// A caller's `Vec<u8>`, taken apart; rebuilt with this capacity on drop.
    Vec { capacity: usize },
    /// A caller's `BytesMut`; its storage does not move while it is not touched.
    Bytes(#[allow(dead_code)] BytesMut),
    /// A memory map: `persist` writes its dirty pages back (msync); `file` says whether a
    /// file backs it (a durable store) or it is anonymous.
    Mmap { map: memmap2::MmapMut, file: bool },
    /// Memory owned by this value (a file mapping, a pinned arena…).
    External(#[allow(dead_code)] Box<dyn Any + Send + Sync>),
    /// Nothing (zero-length buffer with a dangling pointer).
    Empty,
}

/// An owned block of memory at a stable address that can be registered with a provider
/// (the memory behind an `ibv_mr`).
///
/// Shared as `Arc<MemoryBuffer>` between the application and the provider: work requests
/// in flight hold a reference, so the memory outlives every access the NIC may still make,
/// whatever the application drops. See the [module docs](self) for the access model.
pub struct MemoryBuffer {
    ptr: NonNull<u8>,
    len: usize,
    /// First byte (offset) of the aligned-word area.
    words_start: usize,
    /// One past the last byte (offset) of the aligned-word area.
    words_end: usize,
    owner: Owner,
}

// SAFETY: the buffer's memory is only accessed through atomic operations (see the module
// docs) and the owner values are themselves Send (Vec/BytesMut/Layout, or the
// `Send + Sync` box required by `from_raw_parts`).
unsafe impl Send for MemoryBuffer {}
// SAFETY: as for Send: `&MemoryBuffer` gives only atomic access to the memory.
unsafe impl Sync for MemoryBuffer {}

impl std::fmt::Debug for MemoryBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBuffer")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .finish()
    }
}

/// What one kernel copy out of this process's memory did.
enum Careful {
    /// This many bytes (at least one) were copied.
    Copied(usize),
    /// The first byte is not mapped (or not readable).
    Unmapped,
    /// The system call is not available here.
    Refused,
}

/// Copies up to `dst.len()` bytes (at least one) from `src` in this process's memory with
/// `process_vm_readv`: the kernel's copy stops at the first page it cannot read and says
/// so, where a load would fault.
#[cfg(target_os = "linux")]
fn careful_copy(src: *const u8, dst: &mut [u8]) -> Careful {
    let local = libc::iovec {
        iov_base: dst.as_mut_ptr().cast(),
        iov_len: dst.len(),
    };
    let remote = libc::iovec {
        iov_base: src.cast_mut().cast(),
        iov_len: dst.len(),
    };
    // SAFETY: `local` describes `dst`, which is ours to write for its length (the kernel
    // writes at most `iov_len` bytes into it). `remote` is only read, and by the kernel,
    // which checks every page of it and fails instead of faulting: no Rust reference to the
    // source memory is made, and a concurrent writer there races on values only (the
    // access model of `ptr_at`). Both arrays hold one element, as the counts say.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    match usize::try_from(n) {
        Ok(0) => Careful::Unmapped,
        Ok(n) => Careful::Copied(n.min(dst.len())),
        Err(_) => match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EFAULT) => Careful::Unmapped,
            _ => Careful::Refused,
        },
    }
}

/// Elsewhere there is no such call: [`MemoryBuffer::read_careful`] reads as `read` does.
#[cfg(not(target_os = "linux"))]
fn careful_copy(_src: *const u8, _dst: &mut [u8]) -> Careful {
    Careful::Refused
}

impl MemoryBuffer {
    fn new(ptr: NonNull<u8>, len: usize, owner: Owner) -> Self {
        let base = ptr.as_ptr() as usize;
        // Addresses of the first whole aligned word and of the end of the last one inside
        // the allocation (base + len cannot overflow: the allocation is in the address space).
        let first_word = base.next_multiple_of(WORD);
        let end_words = (base + len) / WORD * WORD;
        let (words_start, words_end) = if first_word < end_words {
            (first_word - base, end_words - base)
        } else {
            (len, len) // no whole word inside: every byte is an edge byte
        };
        MemoryBuffer {
            ptr,
            len,
            words_start,
            words_end,
            owner,
        }
    }

    /// Allocates `len` zeroed bytes, page aligned.
    ///
    /// Fails with [`MemError::OutOfBounds`] if `len` is too large for a layout; aborts on
    /// out-of-memory as the standard allocator does.
    pub fn zeroed(len: usize) -> Result<Self, MemError> {
        if len == 0 {
            return Ok(Self::new(NonNull::dangling(), 0, Owner::Empty));
        }
        let layout =
            Layout::from_size_align(len, ALLOC_ALIGN).map_err(|_| MemError::OutOfBounds {
                offset: 0,
                len: len as u64,
                size: isize::MAX as u64,
            })?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        Ok(Self::new(ptr, len, Owner::Alloc(layout)))
    }

    /// Takes ownership of a caller's vector (no copy); its length is the buffer's length.
    /// [`MemoryBuffer::into_vec`] gives it back.
    pub fn from_vec(vec: Vec<u8>) -> Self {
        let mut vec = std::mem::ManuallyDrop::new(vec);
        let len = vec.len();
        let capacity = vec.capacity();
        // A Vec's pointer is never null (dangling when capacity is 0).
        let ptr = NonNull::new(vec.as_mut_ptr()).unwrap_or(NonNull::dangling());
        Self::new(ptr, len, Owner::Vec { capacity })
    }

    /// Takes ownership of a boxed slice (no copy).
    pub fn from_boxed(boxed: Box<[u8]>) -> Self {
        Self::from_vec(boxed.into_vec())
    }

    /// Takes ownership of a `BytesMut` (no copy); its length is the buffer's length.
    pub fn from_bytes_mut(mut bytes: BytesMut) -> Self {
        let len = bytes.len();
        let ptr = NonNull::new(bytes.as_mut_ptr()).unwrap_or(NonNull::dangling());
        Self::new(ptr, len, Owner::Bytes(bytes))
    }

    /// Takes ownership of a memory map (anonymous, or of a file: persistent memory on a
    /// DAX file system, a shared-memory segment). The mapping stays at its address while
    /// the buffer lives and is unmapped when it is dropped. Another process writing a
    /// shared file mapping concurrently is a race on values, as a NIC's writes are, never
    /// undefined behaviour: every access goes through this buffer's atomic accesses.
    ///
    /// [`MemoryBuffer::persist`] writes the map back with `msync`; whether that makes data
    /// durable depends on what backs the map, so the buffer is only
    /// [persistent](MemoryBuffer::is_persistent) when made by [`MemoryBuffer::map_file`].
    pub fn from_mmap(mut map: memmap2::MmapMut) -> Self {
        let len = map.len();
        let ptr = NonNull::new(map.as_mut_ptr()).unwrap_or(NonNull::dangling());
        // The mapping is valid for reads and writes of `len` bytes while `map` lives; `map`
        // moves into the buffer (moving an `MmapMut` does not move the mapping), so it lives
        // exactly as long, and no reference into it remains outside.
        Self::new(ptr, len, Owner::Mmap { map, file: false })
    }

    /// Maps `len` bytes of `file` from byte `offset` (shared, read-write), growing the file
    /// if it is shorter: a memory region whose contents live in the file — on persistent
    /// memory with a DAX file system, or on any file system through the page cache.
    /// [`MemoryBuffer::persist`] makes written ranges durable (`msync(MS_SYNC)`), which is
    /// what a persistent FLUSH from a peer does.
    ///
    /// Another process changing the file concurrently races on values, as a NIC does,
    /// never undefined behaviour (every access is atomic, see the module docs); truncating
    /// the file below the mapping while it is mapped makes later accesses fault (`SIGBUS`),
    /// as with any memory map: don't.
    pub fn map_file(file: &std::fs::File, offset: u64, len: usize) -> std::io::Result<Self> {
        if len == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "cannot map zero bytes",
            ));
        }
        let end = offset
            .checked_add(len as u64)
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "range wraps"))?;
        if file.metadata()?.len() < end {
            file.set_len(end)?;
        }
        // SAFETY: memmap2 marks mapping unsafe because the file may change underneath a
        // `&[u8]`/`&mut [u8]` made from it. This buffer never makes such references: every
        // access to the mapping goes through atomic loads and stores (module docs), so
        // concurrent changes by other processes are races on values, not undefined
        // behaviour. The file is at least `offset + len` bytes long (set above).
        let mut map = unsafe {
            memmap2::MmapOptions::new()
                .offset(offset)
                .len(len)
                .map_mut(file)?
        };
        let ptr = NonNull::new(map.as_mut_ptr()).unwrap_or(NonNull::dangling());
        Ok(Self::new(ptr, len, Owner::Mmap { map, file: true }))
    }

    /// Whether writes to this buffer can be made durable with
    /// [`MemoryBuffer::persist`]: true for buffers made by [`MemoryBuffer::map_file`].
    pub fn is_persistent(&self) -> bool {
        matches!(self.owner, Owner::Mmap { file: true, .. })
    }

    /// Makes `[offset, offset + len)` durable: for a file mapping, writes the dirty pages of
    /// the range back to the file and waits (`msync(MS_SYNC)`); other buffers have no
    /// backing store, so there is nothing to write and this only checks the range.
    pub fn persist(&self, offset: usize, len: usize) -> Result<(), MemError> {
        self.check(offset, len)?;
        if let Owner::Mmap { map, .. } = &self.owner
            && len > 0
        {
            map.flush_range(offset, len)
                .map_err(|e| MemError::Persist(e.kind()))?;
        }
        Ok(())
    }

    /// Wraps memory that `owner` keeps alive, e.g. a file mapping.
    ///
    /// # Safety
    ///
    /// `ptr` must be valid for reads and writes of `len` bytes for as long as `owner` lives,
    /// and while this buffer exists nothing else may access those bytes except through
    /// this buffer's methods (no references to them may exist or be created). Dropping the
    /// buffer drops `owner`.
    pub unsafe fn from_raw_parts(
        ptr: NonNull<u8>,
        len: usize,
        owner: Box<dyn Any + Send + Sync>,
    ) -> Self {
        Self::new(ptr, len, Owner::External(owner))
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The virtual address of the first byte: what `ibv_reg_mr` registers and what a peer
    /// uses as remote address.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as usize as u64
    }

    /// A raw pointer to the first byte, for FFI registration. Using it is `unsafe` and
    /// subject to the access model in the module docs.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Checks that `[offset, offset + len)` lies inside the buffer.
    pub fn check(&self, offset: usize, len: usize) -> Result<(), MemError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(MemError::OutOfBounds {
                offset: offset as u64,
                len: len as u64,
                size: self.len as u64,
            }),
        }
    }

    /// The word that holds byte `offset`, which must lie in the aligned-word area.
    fn word(&self, word_offset: usize) -> &AtomicU64 {
        debug_assert!((self.addr() as usize + word_offset).is_multiple_of(WORD));
        debug_assert!(word_offset >= self.words_start && word_offset + WORD <= self.words_end);
        // SAFETY: `word_offset` is the offset of a whole 8-byte aligned word inside the
        // allocation (callers only pass offsets in [words_start, words_end) on the word
        // grid), the allocation lives as long as `&self`, and all accesses to these bytes
        // are 8-byte atomics (module docs), so no non-atomic or mixed-size access races.
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(word_offset).cast::<u64>()) }
    }

    /// The byte at `offset`, which must be an edge byte outside the word area.
    fn byte(&self, offset: usize) -> &AtomicU8 {
        debug_assert!(offset < self.len);
        debug_assert!(offset < self.words_start || offset >= self.words_end);
        // SAFETY: `offset < len`, so the byte is inside the allocation, which lives as long
        // as `&self`; edge bytes are only ever accessed as single-byte atomics.
        unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().add(offset)) }
    }

    /// Offset of the aligned word that contains byte `offset` (in the word area).
    fn word_of(&self, offset: usize) -> usize {
        let base = self.addr() as usize;
        offset - (base + offset) % WORD
    }

    /// Copies `dst.len()` bytes starting at `offset` out of the buffer.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemError> {
        self.check(offset, dst.len())?;
        let base = self.addr() as usize;
        let mut i = 0;
        while i < dst.len() {
            let at = offset + i;
            if at < self.words_start || at >= self.words_end {
                dst[i] = self.byte(at).load(Relaxed);
                i += 1;
                continue;
            }
            // Whole aligned words: a tight loop of word loads.
            let words = if (base + at).is_multiple_of(WORD) {
                ((dst.len() - i) / WORD).min((self.words_end - at) / WORD)
            } else {
                0
            };
            if words > 0 {
                let run = &mut dst[i..i + words * WORD];
                for (k, chunk) in run.chunks_exact_mut(WORD).enumerate() {
                    chunk.copy_from_slice(&self.word(at + k * WORD).load(Relaxed).to_ne_bytes());
                }
                i += words * WORD;
                continue;
            }
            let w = self.word_of(at);
            let bytes = self.word(w).load(Relaxed).to_ne_bytes();
            let from = at - w;
            let n = (WORD - from).min(dst.len() - i);
            dst[i..i + n].copy_from_slice(&bytes[from..from + n]);
            i += n;
        }
        Ok(())
    }

    /// Copies `dst.len()` bytes starting at `offset` out of the buffer as
    /// [`MemoryBuffer::read`] does, but has the kernel make the copy (`process_vm_readv` on
    /// this very process), so that memory which is no longer mapped fails the copy with
    /// [`MemError::Unmapped`] instead of faulting the process.
    ///
    /// For the accesses a program cannot foresee, which may come after it let the memory
    /// go: a READ response replayed for a duplicate request may be built after the
    /// requester completed the READ and the program that owns the memory freed it — UCX
    /// unmaps a buffer before its registration cache deregisters it, which a NIC survives
    /// (the registration pins the pages) and a NIC in the process would not. A file mapping
    /// whose file was truncated fails the same way (`SIGBUS` for a plain access).
    ///
    /// The copy is outside Rust's memory model, as a NIC's DMA and the soft NIC's
    /// `sendmsg` from registered memory are (see [`MemoryBuffer::ptr_at`]): a concurrent
    /// writer is a race on values. Where the system call is refused (a seccomp filter
    /// without it, a kernel without it) this falls back to [`MemoryBuffer::read`].
    pub fn read_careful(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemError> {
        let src = self.ptr_at(offset, dst.len())?;
        let mut done = 0;
        while done < dst.len() {
            match careful_copy(src.wrapping_add(done), &mut dst[done..]) {
                Careful::Copied(n) => done += n,
                Careful::Unmapped => {
                    return Err(MemError::Unmapped {
                        offset: (offset + done) as u64,
                        len: (dst.len() - done) as u64,
                    });
                }
                Careful::Refused => return self.read(offset + done, &mut dst[done..]),
            }
        }
        Ok(())
    }

    /// Reads `[offset, offset + len)` in order, a chunk of at most `scratch.len()` bytes at a
    /// time (the caller's buffer, [`READ_CHUNK`] bytes recommended: nothing to zero per
    /// call), and hands each chunk to `f`: to compute something over memory — the ICRC of a
    /// packet's payload — without copying it out whole. Each chunk is read with this
    /// module's atomic loads into `scratch` (the same accesses as [`MemoryBuffer::read`]),
    /// so `f` sees bytes, never a reference into the buffer, and a concurrent writer is a
    /// race on values, never undefined behaviour. Nothing is read if the range is out of
    /// bounds, or if `scratch` is empty and `len` is not.
    pub fn read_chunks(
        &self,
        offset: usize,
        len: usize,
        scratch: &mut [u8],
        mut f: impl FnMut(&[u8]),
    ) -> Result<(), MemError> {
        self.check(offset, len)?;
        if scratch.is_empty() && len > 0 {
            return Err(MemError::OutOfBounds {
                offset: 0,
                len: len as u64,
                size: 0,
            });
        }
        let mut at = offset;
        let end = offset + len;
        while at < end {
            let n = (end - at).min(scratch.len());
            self.read(at, &mut scratch[..n])?;
            f(&scratch[..n]);
            at += n;
        }
        Ok(())
    }

    /// The address of byte `offset`, once `[offset, offset + len)` is checked to lie inside
    /// the buffer: for a copy made outside Rust's memory model, as a NIC's DMA is — the
    /// soft NIC hands it to the kernel in a `sendmsg` iovec, and the kernel copies the
    /// bytes into its socket buffer.
    ///
    /// Making the pointer is safe; using it is not, and must follow the access model in the
    /// module docs: never turn it into a reference (the memory may change at any time), and
    /// keep the buffer alive (hold its `Arc`) until the copy is done. Bytes that change while
    /// the kernel copies them arrive torn, as they would from a NIC reading memory the
    /// application is writing.
    pub fn ptr_at(&self, offset: usize, len: usize) -> Result<*const u8, MemError> {
        self.check(offset, len)?;
        // In bounds (checked above): the result points into the allocation or one past it.
        Ok(self.ptr.as_ptr().wrapping_add(offset).cast_const())
    }

    /// Copies `src` into the buffer starting at `offset`.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemError> {
        self.check(offset, src.len())?;
        let base = self.addr() as usize;
        let mut i = 0;
        while i < src.len() {
            let at = offset + i;
            if at < self.words_start || at >= self.words_end {
                self.byte(at).store(src[i], Relaxed);
                i += 1;
                continue;
            }
            // Whole aligned words: a tight loop of word stores.
            let words = if (base + at).is_multiple_of(WORD) {
                ((src.len() - i) / WORD).min((self.words_end - at) / WORD)
            } else {
                0
            };
            if words > 0 {
                let run = &src[i..i + words * WORD];
                for (k, chunk) in run.chunks_exact(WORD).enumerate() {
                    let mut bytes = [0u8; WORD];
                    bytes.copy_from_slice(chunk);
                    self.word(at + k * WORD)
                        .store(u64::from_ne_bytes(bytes), Relaxed);
                }
                i += words * WORD;
                continue;
            }
            let w = self.word_of(at);
            let from = at - w;
            let n = (WORD - from).min(src.len() - i);
            let word = self.word(w);
            if n == WORD {
                let mut bytes = [0u8; WORD];
                bytes.copy_from_slice(&src[i..i + WORD]);
                word.store(u64::from_ne_bytes(bytes), Relaxed);
            } else {
                let part = &src[i..i + n];
                let merge = |old: u64| {
                    let mut bytes = old.to_ne_bytes();
                    bytes[from..from + n].copy_from_slice(part);
                    Some(u64::from_ne_bytes(bytes))
                };
                // The closure always returns Some, so this cannot fail.
                let _ = word.fetch_update(Relaxed, Relaxed, merge);
            }
            i += n;
        }
        Ok(())
    }

    /// Copies `src` into the buffer at `offset` with plain stores (a `memcpy`): the copy
    /// [`MemoryBuffer::write`] makes word by word with atomic stores, at the speed of the
    /// widest stores the CPU has, for memory that nothing else touches meanwhile (a send
    /// buffer being filled before it is posted).
    ///
    /// # Safety
    ///
    /// Nothing may access `[offset, offset + src.len())` concurrently with this call —
    /// not this program, not a NIC, not a peer through a NIC: every access to those bytes
    /// before it must happen-before it, and it must happen-before every access after it.
    /// For registered memory that means: no work request that may read or write the range
    /// is in flight (it was never posted, or its completion was taken from its completion
    /// queue), and no registration of the range grants remote access (a peer's access
    /// needs no work request of this program). A post made after this call, and a
    /// completion taken before it, order the NIC's accesses so (the provider's post and
    /// poll synchronise).
    pub unsafe fn write_unshared(&self, offset: usize, src: &[u8]) -> Result<(), MemError> {
        self.check(offset, src.len())?;
        // SAFETY: `[offset, offset + len)` lies inside the allocation (checked above),
        // which lives as long as `&self`, and `src` is a distinct borrow (the buffer hands
        // out no references to its memory, so `src` cannot point into it). No access to
        // these bytes is concurrent with this one (the caller's contract): the plain stores
        // race with no atomic access of the module's grid.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len());
        }
        Ok(())
    }

    /// Sets `len` bytes starting at `offset` to `value`.
    pub fn fill(&self, offset: usize, len: usize, value: u8) -> Result<(), MemError> {
        self.check(offset, len)?;
        let pattern = u64::from_ne_bytes([value; WORD]);
        let (end, base) = (offset + len, self.addr() as usize);
        let words_end = end.min(self.words_end);
        let mut at = offset;
        while at < end {
            if at >= self.words_start && (base + at).is_multiple_of(WORD) && at + WORD <= words_end
            {
                // Whole aligned words: one store each.
                while at + WORD <= words_end {
                    self.word(at).store(pattern, Relaxed);
                    at += WORD;
                }
            } else {
                self.write(at, &[value])?;
                at += 1;
            }
        }
        Ok(())
    }

    /// Copies `len` bytes starting at `offset` into a new vector.
    pub fn to_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>, MemError> {
        self.check(offset, len)?;
        let mut v = vec![0; len];
        self.read(offset, &mut v)?;
        Ok(v)
    }

    /// The aligned word at `offset` for an 8-byte atomic, or why there is none.
    fn atomic_word(&self, offset: usize) -> Result<&AtomicU64, MemError> {
        self.check(offset, WORD)?;
        let addr = self.addr().wrapping_add(offset as u64);
        if !addr.is_multiple_of(WORD as u64) {
            return Err(MemError::Misaligned { addr });
        }
        // An aligned whole word inside the allocation is inside the word area.
        Ok(self.word(offset))
    }

    /// Atomically loads the native-endian u64 at `offset` (8-byte aligned address).
    pub fn load_u64(&self, offset: usize) -> Result<u64, MemError> {
        Ok(self.atomic_word(offset)?.load(Relaxed))
    }

    /// Atomically stores a native-endian u64 at `offset` (RDMA ATOMIC WRITE).
    pub fn store_u64(&self, offset: usize, value: u64) -> Result<(), MemError> {
        self.atomic_word(offset)?.store(value, Relaxed);
        Ok(())
    }

    /// Atomic compare-and-swap of the u64 at `offset`; returns the original value
    /// (`IBV_WR_ATOMIC_CMP_AND_SWP` semantics: the swap happens only if it equalled
    /// `compare`).
    pub fn compare_swap_u64(
        &self,
        offset: usize,
        compare: u64,
        swap: u64,
    ) -> Result<u64, MemError> {
        let word = self.atomic_word(offset)?;
        Ok(
            match word.compare_exchange(compare, swap, Relaxed, Relaxed) {
                Ok(v) | Err(v) => v,
            },
        )
    }

    /// Atomic wrapping fetch-and-add of the u64 at `offset`; returns the original value.
    pub fn fetch_add_u64(&self, offset: usize, add: u64) -> Result<u64, MemError> {
        Ok(self.atomic_word(offset)?.fetch_add(add, Relaxed))
    }

    /// Gives back the memory as a vector: without copying if the buffer was made from a
    /// `Vec<u8>` or `Box<[u8]>`, by copying otherwise.
    pub fn into_vec(self) -> Vec<u8> {
        let mut this = std::mem::ManuallyDrop::new(self);
        match std::mem::replace(&mut this.owner, Owner::Empty) {
            Owner::Vec { capacity } => {
                // SAFETY: ptr, len and capacity are exactly those taken from a Vec<u8> in
                // `from_vec`, and `self` is consumed, so nothing else accesses the memory.
                unsafe { Vec::from_raw_parts(this.ptr.as_ptr(), this.len, capacity) }
            }
            other => {
                let mut out = vec![0; this.len];
                // Reading in bounds cannot fail.
                let _ = this.read(0, &mut out);
                // Put the owner back and drop normally (frees the memory).
                this.owner = other;
                // SAFETY: `this` is a ManuallyDrop we own and do not use afterwards.
                unsafe { std::mem::ManuallyDrop::drop(&mut this) };
                out
            }
        }
    }
}

impl Drop for MemoryBuffer {
    fn drop(&mut self) {
        match std::mem::replace(&mut self.owner, Owner::Empty) {
            Owner::Alloc(layout) => {
                // SAFETY: allocated in `zeroed` with exactly this layout, freed only here.
                unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) }
            }
            Owner::Vec { capacity } => {
                // SAFETY: ptr, len and capacity came from a Vec<u8> in `from_vec`; the Vec
                // is rebuilt once, here, and dropped.
                drop(unsafe { Vec::from_raw_parts(self.ptr.as_ptr(), self.len, capacity) })
            }
            Owner::Bytes(_) | Owner::Mmap { .. } | Owner::External(_) | Owner::Empty => {}
        }
    }
}

/// A byte range of a [`MemoryBuffer`]: what a memory region registers (`addr`, `length` of
/// `ibv_reg_mr`). Cheap to clone; keeps the buffer alive.
///
/// A region has an address — the one work requests name it by, in local scatter/gather
/// entries and in a peer's RDMA and atomic operations. It is normally the virtual address of
/// its first byte; a region made by [`MemRegion::with_iova`] has an I/O virtual address of
/// the registrant's choosing instead (`ibv_reg_mr_iova2`).
#[derive(Clone, Debug)]
pub struct MemRegion {
    buf: Arc<MemoryBuffer>,
    offset: usize,
    len: usize,
    /// The address of the first byte as work requests name it.
    addr: u64,
}

impl MemRegion {
    /// The whole buffer.
    pub fn whole(buf: Arc<MemoryBuffer>) -> Self {
        let len = buf.len();
        let addr = buf.addr();
        MemRegion {
            buf,
            offset: 0,
            len,
            addr,
        }
    }

    /// A range of a buffer; out-of-bounds ranges are an error.
    pub fn new(buf: Arc<MemoryBuffer>, range: impl RangeBounds<usize>) -> Result<Self, MemError> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.checked_add(1).ok_or(MemError::OutOfBounds {
                offset: s as u64,
                len: 0,
                size: buf.len() as u64,
            })?,
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.checked_add(1).ok_or(MemError::OutOfBounds {
                offset: start as u64,
                len: u64::MAX,
                size: buf.len() as u64,
            })?,
            Bound::Excluded(&e) => e,
            Bound::Unbounded => buf.len(),
        };
        let len = end.checked_sub(start).ok_or(MemError::OutOfBounds {
            offset: start as u64,
            len: 0,
            size: buf.len() as u64,
        })?;
        buf.check(start, len)?;
        // Inside the buffer, which lies in the address space: no overflow.
        let addr = buf.addr() + start as u64;
        Ok(MemRegion {
            buf,
            offset: start,
            len,
            addr,
        })
    }

    /// A range of a buffer addressed as `[iova, iova + len)` rather than by its virtual
    /// address: what `ibv_reg_mr_iova2(pd, addr, length, iova, access)` registers. Work
    /// requests — local scatter/gather entries and a peer's RDMA READ, WRITE and atomic
    /// operations — then name the region's bytes by `iova`: address `iova + k` is byte `k`
    /// of the range. [`MemRegion::addr`] returns `iova`.
    ///
    /// Out-of-bounds ranges, and an `iova` whose end address `iova + len` does not fit in
    /// 64 bits, are [`MemError::OutOfBounds`].
    ///
    /// Atomic operations need the word aligned both as addressed (`iova + k`) and in
    /// memory: when `iova` and the buffer's address differ modulo 8, atomics on this region
    /// fail as misaligned (NICs usually require the same offset within a page).
    pub fn with_iova(
        buf: Arc<MemoryBuffer>,
        range: impl RangeBounds<usize>,
        iova: u64,
    ) -> Result<Self, MemError> {
        let mut region = Self::new(buf, range)?;
        if iova.checked_add(region.len as u64).is_none() {
            return Err(MemError::OutOfBounds {
                offset: iova,
                len: region.len as u64,
                size: u64::MAX,
            });
        }
        region.addr = iova;
        Ok(region)
    }

    /// The buffer this region is part of.
    pub fn buffer(&self) -> &Arc<MemoryBuffer> {
        &self.buf
    }

    /// Offset of the region in its buffer.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Address of the first byte as work requests name it: its virtual address, or the
    /// I/O virtual address of a region made by [`MemRegion::with_iova`].
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The offset inside this region of the address range `[addr, addr + len)` (addresses
    /// as [`MemRegion::addr`] gives them), if the range lies wholly inside the region
    /// (checked without overflow).
    pub fn offset_of(&self, addr: u64, len: u64) -> Result<usize, MemError> {
        let out = MemError::OutOfBounds {
            offset: addr.wrapping_sub(self.addr()),
            len,
            size: self.len as u64,
        };
        let off = addr.checked_sub(self.addr()).ok_or(out)?;
        match off.checked_add(len) {
            Some(end) if end <= self.len as u64 => usize::try_from(off).map_err(|_| out),
            _ => Err(out),
        }
    }

    fn check(&self, offset: usize, len: usize) -> Result<usize, MemError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.offset + offset),
            _ => Err(MemError::OutOfBounds {
                offset: offset as u64,
                len: len as u64,
                size: self.len as u64,
            }),
        }
    }

    /// Makes `[offset, offset + len)` of the region durable (see [`MemoryBuffer::persist`]).
    pub fn persist(&self, offset: usize, len: usize) -> Result<(), MemError> {
        let at = self.check(offset, len)?;
        self.buf.persist(at, len)
    }

    /// Copies out of the region (offset relative to the region).
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemError> {
        let at = self.check(offset, dst.len())?;
        self.buf.read(at, dst)
    }

    /// Copies out of the region through the kernel, failing on memory that is no longer
    /// mapped instead of faulting (see [`MemoryBuffer::read_careful`]).
    pub fn read_careful(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemError> {
        let at = self.check(offset, dst.len())?;
        self.buf.read_careful(at, dst)
    }

    /// Copies into the region (offset relative to the region).
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemError> {
        let at = self.check(offset, src.len())?;
        self.buf.write(at, src)
    }

    /// [`MemoryBuffer::write_unshared`] (offset relative to the region): a plain copy into
    /// memory nothing else touches meanwhile.
    ///
    /// # Safety
    ///
    /// As for [`MemoryBuffer::write_unshared`]: nothing accesses the bytes written
    /// concurrently with this call (no work request on them in flight, no remote access
    /// granted to them).
    pub unsafe fn write_unshared(&self, offset: usize, src: &[u8]) -> Result<(), MemError> {
        let at = self.check(offset, src.len())?;
        // SAFETY: the caller's contract is the buffer's, for the same bytes.
        unsafe { self.buf.write_unshared(at, src) }
    }

    /// Reads `len` bytes at `offset` (relative to the region) in chunks, see
    /// [`MemoryBuffer::read_chunks`].
    pub fn read_chunks(
        &self,
        offset: usize,
        len: usize,
        scratch: &mut [u8],
        f: impl FnMut(&[u8]),
    ) -> Result<(), MemError> {
        let at = self.check(offset, len)?;
        self.buf.read_chunks(at, len, scratch, f)
    }

    /// The address of byte `offset` of the region, `[offset, offset + len)` checked to lie
    /// inside it: see [`MemoryBuffer::ptr_at`] for what it may be used for.
    pub fn ptr_at(&self, offset: usize, len: usize) -> Result<*const u8, MemError> {
        let at = self.check(offset, len)?;
        self.buf.ptr_at(at, len)
    }

    /// Copies `len` bytes at `offset` into a new vector.
    pub fn to_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>, MemError> {
        let at = self.check(offset, len)?;
        self.buf.to_vec(at, len)
    }

    /// Atomic load of the u64 at `offset` (8-byte aligned address).
    pub fn load_u64(&self, offset: usize) -> Result<u64, MemError> {
        let at = self.check(offset, WORD)?;
        self.buf.load_u64(at)
    }

    /// Atomic store of the u64 at `offset` (8-byte aligned address).
    pub fn store_u64(&self, offset: usize, value: u64) -> Result<(), MemError> {
        let at = self.check(offset, WORD)?;
        self.buf.store_u64(at, value)
    }

    /// Atomic compare-and-swap at `offset`; returns the original value.
    pub fn compare_swap_u64(
        &self,
        offset: usize,
        compare: u64,
        swap: u64,
    ) -> Result<u64, MemError> {
        let at = self.check(offset, WORD)?;
        self.buf.compare_swap_u64(at, compare, swap)
    }

    /// Atomic fetch-and-add at `offset`; returns the original value.
    pub fn fetch_add_u64(&self, offset: usize, add: u64) -> Result<u64, MemError> {
        let at = self.check(offset, WORD)?;
        self.buf.fetch_add_u64(at, add)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + 3) as u8).collect()
    }

    /// An empty file of this test process in the temporary directory, open for reading and
    /// writing, and its path.
    fn scratch_file(tag: &str) -> (std::path::PathBuf, std::fs::File) {
        let path = std::env::temp_dir().join(format!("remem-verbs-{tag}-{}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        (path, file)
    }

    #[test]
    fn a_careful_read_is_the_atomic_reads_copy() {
        let buf = MemoryBuffer::from_vec(pattern(203));
        let region = MemRegion::new(Arc::new(buf), 3..200).unwrap();
        for (at, n) in [(0, 197), (1, 9), (5, 64), (190, 7), (100, 0)] {
            let mut careful = vec![0u8; n];
            let mut plain = vec![1u8; n];
            region.read_careful(at, &mut careful).unwrap();
            region.read(at, &mut plain).unwrap();
            assert_eq!(careful, plain, "[{at}, +{n})");
        }
        assert!(matches!(
            region.read_careful(190, &mut [0u8; 8]),
            Err(MemError::OutOfBounds { .. })
        ));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_careful_read_of_unmapped_memory_fails_instead_of_faulting() {
        // Two pages of someone else's memory; the second is unmapped while the buffer
        // still names it (as a program frees memory its registration cache has not
        // deregistered yet). A plain read of it would end the test with SIGSEGV.
        const PAGE: usize = 4096;
        // SAFETY: a fresh private anonymous mapping of two pages, no address hint.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED);
        let ptr = NonNull::new(map.cast::<u8>()).unwrap();
        // SAFETY: the mapping is ours and valid for 2 pages until unmapped below; nothing
        // else touches it. (Unmapping under the buffer breaks this contract on purpose:
        // only `read_careful`, which never faults, reads the unmapped page.)
        let buf = unsafe { MemoryBuffer::from_raw_parts(ptr, 2 * PAGE, Box::new(())) };
        buf.write(PAGE - 3, &[1, 2, 3, 4, 5, 6]).unwrap();
        // SAFETY: the second page of the mapping made above, unmapped once.
        let second = unsafe { libc::munmap(map.cast::<u8>().add(PAGE).cast(), PAGE) };
        assert_eq!(second, 0);
        let mut dst = [0u8; 3];
        buf.read_careful(PAGE - 3, &mut dst).unwrap();
        assert_eq!(dst, [1, 2, 3], "the mapped page reads");
        let mut dst = [0u8; 16];
        assert_eq!(
            buf.read_careful(PAGE - 8, &mut dst),
            Err(MemError::Unmapped {
                offset: PAGE as u64,
                len: 8
            }),
            "the copy stops at the unmapped page"
        );
        drop(buf);
        // SAFETY: the first page, still mapped; the buffer that named it is gone.
        let first = unsafe { libc::munmap(map, PAGE) };
        assert_eq!(first, 0);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_careful_read_of_a_truncated_file_mapping_fails_instead_of_faulting() {
        let (path, file) = scratch_file("careful");
        std::fs::remove_file(&path).unwrap(); // the open file is all the test needs
        let buf = MemoryBuffer::map_file(&file, 0, 8192).unwrap();
        buf.write(0, &[7; 16]).unwrap();
        let mut dst = [0u8; 16];
        buf.read_careful(0, &mut dst).unwrap();
        assert_eq!(dst, [7; 16]);
        // The file shrinks under the mapping: a plain read would end the test with SIGBUS.
        file.set_len(0).unwrap();
        assert!(matches!(
            buf.read_careful(0, &mut dst),
            Err(MemError::Unmapped { offset: 0, .. })
        ));
    }

    #[test]
    fn an_unshared_write_is_the_atomic_writes_copy() {
        // Unaligned ranges in a buffer with unaligned edges: every byte lands as
        // `write` puts it, and nothing outside the range changes.
        let buf = MemoryBuffer::from_vec(vec![0xee; 203]);
        let region = MemRegion::new(Arc::new(buf), 3..200).unwrap();
        let atomic = MemRegion::whole(Arc::new(MemoryBuffer::from_vec(vec![0xee; 197])));
        for (offset, len) in [(0, 197), (5, 64), (1, 1), (190, 7), (0, 0)] {
            let data = pattern(len);
            // SAFETY: this test alone holds the buffer; nothing else accesses it.
            unsafe { region.write_unshared(offset, &data) }.unwrap();
            atomic.write(offset, &data).unwrap();
            assert_eq!(
                region.to_vec(0, 197).unwrap(),
                atomic.to_vec(0, 197).unwrap()
            );
        }
        let whole = region.buffer().to_vec(0, 203).unwrap();
        assert_eq!(&whole[..3], &[0xee; 3]);
        assert_eq!(&whole[200..], &[0xee; 3]);
        // Out of bounds: an error, nothing written.
        // SAFETY: as above.
        let e = unsafe { region.write_unshared(190, &[1; 8]) };
        assert!(matches!(e, Err(MemError::OutOfBounds { .. })), "{e:?}");
        assert_eq!(
            region.to_vec(0, 197).unwrap(),
            atomic.to_vec(0, 197).unwrap()
        );
    }

    #[test]
    fn file_maps_are_persistent_buffers() {
        let (path, file) = scratch_file("map");
        // Maps at an offset, growing the file to hold it.
        let buf = MemoryBuffer::map_file(&file, 4096, 8192).unwrap();
        assert!(buf.is_persistent());
        assert_eq!(file.metadata().unwrap().len(), 4096 + 8192);
        buf.write(10, b"durable").unwrap();
        buf.persist(0, 100).unwrap();
        assert!(buf.persist(8000, 193).is_err(), "past the end");
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(&on_disk[4096 + 10..4096 + 17], b"durable");
        // Regions persist their own range.
        let buf = Arc::new(buf);
        let region = MemRegion::new(buf.clone(), 4096..8192).unwrap();
        region.write(0, b"again").unwrap();
        region.persist(0, 5).unwrap();
        assert!(region.persist(4000, 100).is_err());
        assert_eq!(&std::fs::read(&path).unwrap()[8192..8197], b"again");
        assert!(MemoryBuffer::map_file(&file, 0, 0).is_err());
        assert!(MemoryBuffer::map_file(&file, u64::MAX, 2).is_err());
        // Anonymous memory has nothing to persist to.
        assert!(!MemoryBuffer::zeroed(64).unwrap().is_persistent());
        let anon = MemoryBuffer::from_mmap(memmap2::MmapMut::map_anon(4096).unwrap());
        assert!(!anon.is_persistent());
        anon.persist(0, 4096).unwrap();
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn memory_maps_are_buffers() {
        let mut map = memmap2::MmapMut::map_anon(8192).unwrap();
        map[100] = 7;
        let buf = MemoryBuffer::from_mmap(map);
        assert_eq!(buf.len(), 8192);
        assert_eq!(buf.to_vec(100, 1).unwrap(), [7]);
        buf.store_u64(8, 42).unwrap();
        assert_eq!(buf.load_u64(8).unwrap(), 42);
    }

    #[test]
    fn fill_sets_exactly_the_range() {
        for (start, len) in [(0, 100), (3, 50), (7, 1), (8, 16), (13, 0), (95, 5)] {
            let buf = MemoryBuffer::from_vec(vec![1u8; 100]);
            buf.fill(start, len, 0xab).unwrap();
            let mut want = vec![1u8; 100];
            want[start..start + len].fill(0xab);
            assert_eq!(buf.to_vec(0, 100).unwrap(), want, "{start}+{len}");
        }
        let buf = MemoryBuffer::zeroed(16).unwrap();
        assert!(buf.fill(10, 7, 0).is_err());
    }

    #[test]
    fn zeroed_is_zero_and_page_aligned() {
        let b = MemoryBuffer::zeroed(10_000).unwrap();
        assert_eq!(b.addr() % ALLOC_ALIGN as u64, 0);
        assert_eq!(b.to_vec(0, 10_000).unwrap(), vec![0; 10_000]);
        let e = MemoryBuffer::zeroed(0).unwrap();
        assert!(e.is_empty());
        assert!(e.read(0, &mut []).is_ok());
        assert!(e.read(0, &mut [0]).is_err());
    }

    #[test]
    fn every_offset_and_length_round_trips() {
        // Unaligned buffers: take sub-slices of a vector at every misalignment.
        for misalign in 0..8 {
            let mut v = vec![0u8; 64 + misalign];
            v.drain(..misalign);
            let reference = std::cell::RefCell::new(vec![0u8; v.len()]);
            let b = MemoryBuffer::from_vec(v);
            for off in 0..b.len() {
                for len in 0..(b.len() - off).min(20) {
                    let data = pattern(len + off);
                    let src = &data[off..off + len];
                    b.write(off, src).unwrap();
                    reference.borrow_mut()[off..off + len].copy_from_slice(src);
                    let mut got = vec![0; len];
                    b.read(off, &mut got).unwrap();
                    assert_eq!(got, src, "misalign {misalign} off {off} len {len}");
                }
            }
            assert_eq!(b.to_vec(0, b.len()).unwrap(), *reference.borrow());
            assert_eq!(b.into_vec(), *reference.borrow());
        }
    }

    #[test]
    fn chunked_reads_see_exactly_the_range_in_order() {
        let size = 3 * READ_CHUNK + 100;
        for misalign in [0, 3, 7] {
            let mut v = pattern(size + misalign);
            v.drain(..misalign);
            let want = v.clone();
            let b = MemoryBuffer::from_vec(v);
            for (off, len) in [
                (0, 0),
                (0, size),
                (1, READ_CHUNK),
                (5, READ_CHUNK + 1),
                (size - 9, 9),
                (READ_CHUNK - 1, 2 * READ_CHUNK + 3),
            ] {
                let mut got = Vec::new();
                let mut chunks = 0;
                b.read_chunks(off, len, &mut [0; READ_CHUNK], |c| {
                    assert!(!c.is_empty() && c.len() <= READ_CHUNK);
                    got.extend_from_slice(c);
                    chunks += 1;
                })
                .unwrap();
                assert_eq!(
                    got,
                    &want[off..off + len],
                    "misalign {misalign} {off}+{len}"
                );
                assert_eq!(chunks, len.div_ceil(READ_CHUNK));
            }
            let mut called = false;
            let scratch = &mut [0; READ_CHUNK];
            assert!(
                b.read_chunks(size - 1, 2, scratch, |_| called = true)
                    .is_err()
            );
            assert!(
                b.read_chunks(usize::MAX, 1, scratch, |_| called = true)
                    .is_err()
            );
            assert!(b.read_chunks(0, 1, &mut [], |_| called = true).is_err());
            // A small scratch buffer: small chunks, same bytes.
            let mut got = Vec::new();
            b.read_chunks(3, 100, &mut [0; 7], |c| {
                assert!(c.len() <= 7);
                got.extend_from_slice(c);
            })
            .unwrap();
            assert_eq!(got, &want[3..103]);
            assert!(!called, "nothing read out of bounds");
        }
        // Through a region: relative to the region, bounded by it.
        let buf = Arc::new(MemoryBuffer::from_vec(pattern(100)));
        let r = MemRegion::new(buf, 10..20).unwrap();
        let mut got = Vec::new();
        r.read_chunks(2, 8, &mut [0; 16], |c| got.extend_from_slice(c))
            .unwrap();
        assert_eq!(got, &pattern(100)[12..20]);
        assert!(r.read_chunks(2, 9, &mut [0; 16], |_| ()).is_err());
    }

    #[test]
    fn raw_addresses_are_bounds_checked() {
        let buf = Arc::new(MemoryBuffer::zeroed(64).unwrap());
        assert_eq!(buf.ptr_at(0, 64).unwrap() as u64, buf.addr());
        assert_eq!(buf.ptr_at(64, 0).unwrap() as u64, buf.addr() + 64);
        assert!(buf.ptr_at(60, 5).is_err());
        assert!(buf.ptr_at(usize::MAX, 2).is_err());
        let r = MemRegion::new(buf.clone(), 8..24).unwrap();
        assert_eq!(r.ptr_at(4, 12).unwrap() as u64, buf.addr() + 12);
        assert!(r.ptr_at(4, 13).is_err());
    }

    #[test]
    fn out_of_bounds_is_an_error_and_changes_nothing() {
        let b = MemoryBuffer::from_vec(vec![1; 16]);
        assert!(b.write(10, &[9; 7]).is_err());
        assert!(b.write(usize::MAX, &[9]).is_err());
        assert!(b.read(16, &mut [0]).is_err());
        assert_eq!(b.to_vec(0, 16).unwrap(), vec![1; 16]);
        assert!(matches!(
            b.check(8, 9),
            Err(MemError::OutOfBounds {
                offset: 8,
                len: 9,
                size: 16
            })
        ));
    }

    #[test]
    fn atomics() {
        let b = MemoryBuffer::zeroed(64).unwrap();
        assert_eq!(b.fetch_add_u64(8, 5).unwrap(), 0);
        assert_eq!(b.fetch_add_u64(8, u64::MAX).unwrap(), 5); // wraps
        assert_eq!(b.load_u64(8).unwrap(), 4);
        assert_eq!(b.compare_swap_u64(8, 3, 100).unwrap(), 4); // no swap
        assert_eq!(b.load_u64(8).unwrap(), 4);
        assert_eq!(b.compare_swap_u64(8, 4, 100).unwrap(), 4); // swap
        assert_eq!(b.load_u64(8).unwrap(), 100);
        b.store_u64(16, 0x0102_0304_0506_0708).unwrap();
        let mut bytes = [0; 8];
        b.read(16, &mut bytes).unwrap();
        assert_eq!(u64::from_ne_bytes(bytes), 0x0102_0304_0506_0708);
        assert!(matches!(
            b.fetch_add_u64(4, 1),
            Err(MemError::Misaligned { .. })
        ));
        assert!(b.fetch_add_u64(64, 1).is_err());
        assert!(b.fetch_add_u64(60, 1).is_err());
    }

    #[test]
    fn vec_and_bytes_come_back_unchanged() {
        let v = pattern(1000);
        let b = MemoryBuffer::from_vec(v.clone());
        assert_eq!(b.to_vec(0, 1000).unwrap(), v);
        b.write(10, b"hello").unwrap();
        let mut expect = v.clone();
        expect[10..15].copy_from_slice(b"hello");
        assert_eq!(b.into_vec(), expect);

        let boxed: Box<[u8]> = v.clone().into_boxed_slice();
        assert_eq!(MemoryBuffer::from_boxed(boxed).into_vec(), v);

        let bm = BytesMut::from(&v[..]);
        let b = MemoryBuffer::from_bytes_mut(bm);
        assert_eq!(b.to_vec(0, 1000).unwrap(), v);
        assert_eq!(b.into_vec(), v);
    }

    #[test]
    fn concurrent_writers_and_readers_see_whole_words() {
        let b = Arc::new(MemoryBuffer::zeroed(4096).unwrap());
        let writer = {
            let b = b.clone();
            std::thread::spawn(move || {
                for round in 0..200u64 {
                    let word = round.to_ne_bytes();
                    for off in (0..4096).step_by(8) {
                        b.write(off, &word).unwrap();
                    }
                }
            })
        };
        for _ in 0..200 {
            let mut out = vec![0; 4096];
            b.read(0, &mut out).unwrap();
            for w in out.chunks_exact(8) {
                assert!(u64::from_ne_bytes(w.try_into().unwrap()) < 200);
            }
        }
        writer.join().unwrap();
        assert_eq!(b.load_u64(4088).unwrap(), 199);
    }

    #[test]
    fn regions_with_an_iova() {
        let buf = Arc::new(MemoryBuffer::zeroed(4096).unwrap());
        let r = MemRegion::with_iova(buf.clone(), 1024..2048, 0x10_0000).unwrap();
        assert_eq!((r.addr(), r.offset(), r.len()), (0x10_0000, 1024, 1024));
        // Addresses map through the iova, not the buffer's address.
        assert_eq!(r.offset_of(0x10_0000 + 16, 8).unwrap(), 16);
        assert_eq!(r.offset_of(0x10_0000 + 1024, 0).unwrap(), 1024);
        assert!(r.offset_of(0x10_0000 + 1020, 8).is_err(), "past the end");
        assert!(r.offset_of(0x10_0000 - 1, 1).is_err(), "before the start");
        assert!(
            r.offset_of(buf.addr() + 1024, 8).is_err(),
            "the virtual address is not the region's address"
        );
        r.write(16, b"iova").unwrap();
        assert_eq!(buf.to_vec(1024 + 16, 4).unwrap(), b"iova");
        r.fetch_add_u64(8, 5).unwrap();
        assert_eq!(buf.load_u64(1024 + 8).unwrap(), 5);
        // Iova zero, and the highest one: the end address `iova + len` is a u64.
        let zero = MemRegion::with_iova(buf.clone(), .., 0).unwrap();
        assert_eq!(zero.offset_of(100, 4).unwrap(), 100);
        let top = MemRegion::with_iova(buf.clone(), 0..16, u64::MAX - 16).unwrap();
        assert_eq!(top.offset_of(u64::MAX - 8, 8).unwrap(), 8);
        assert!(top.offset_of(u64::MAX - 1, 2).is_err());
        // A range reaching or wrapping past 2^64 is refused, as is one outside the buffer.
        assert!(matches!(
            MemRegion::with_iova(buf.clone(), 0..16, u64::MAX - 15),
            Err(MemError::OutOfBounds { .. })
        ));
        assert!(MemRegion::with_iova(buf.clone(), 4000..4097, 0).is_err());
        // Clones keep the iova.
        assert_eq!(r.clone().addr(), 0x10_0000);
        // An iova that differs from the buffer's address modulo 8: atomics need the word
        // aligned in memory too.
        let odd = MemRegion::with_iova(buf, 1..65, 0x2000).unwrap();
        assert!(matches!(
            odd.fetch_add_u64(0, 1),
            Err(MemError::Misaligned { .. })
        ));
        odd.write(0, &[1; 8]).unwrap();
    }

    #[test]
    fn regions() {
        let buf = Arc::new(MemoryBuffer::zeroed(100).unwrap());
        let r = MemRegion::new(buf.clone(), 10..20).unwrap();
        assert_eq!(r.len(), 10);
        assert_eq!(r.addr(), buf.addr() + 10);
        r.write(0, &[7; 10]).unwrap();
        assert!(r.write(1, &[7; 10]).is_err());
        assert_eq!(
            buf.to_vec(9, 12).unwrap(),
            [&[0][..], &[7; 10], &[0]].concat()
        );
        assert_eq!(r.offset_of(r.addr() + 2, 8).unwrap(), 2);
        assert!(r.offset_of(r.addr() + 2, 9).is_err());
        assert!(r.offset_of(r.addr() - 1, 1).is_err());
        assert!(r.offset_of(u64::MAX, 2).is_err());
        assert!(r.offset_of(r.addr(), u64::MAX).is_err());
        assert!(MemRegion::new(buf.clone(), 90..101).is_err());
        #[allow(clippy::reversed_empty_ranges)]
        let rev = MemRegion::new(buf.clone(), 20..10);
        assert!(rev.is_err());
        assert_eq!(MemRegion::new(buf.clone(), ..).unwrap().len(), 100);
        assert_eq!(MemRegion::new(buf, 5..=5).unwrap().len(), 1);
        // region atomics are relative to the region
        let buf = Arc::new(MemoryBuffer::zeroed(64).unwrap());
        let r = MemRegion::new(buf.clone(), 8..24).unwrap();
        r.fetch_add_u64(8, 3).unwrap();
        assert_eq!(buf.load_u64(16).unwrap(), 3);
        assert!(r.fetch_add_u64(16, 1).is_err());
    }
}
