//! `--verify`: the data of `write_bw` and `read_bw` checked.
//!
//! Each QP's two areas hold `-t` slots of the message size. Message `i` of QP `q` goes
//! from slot `i % t` to slot `i % t`, so a slot is reused only once the message before
//! it there has completed (no more than `-t` operations are in flight per QP). Its bytes
//! are a pattern of `q`, `i` and the offset: the first 8 bytes name `q` and `i`, each
//! further 8-byte word adds its index times an odd constant, so data placed at the wrong
//! offset, from the wrong message or from the wrong QP does not match.
//!
//! - WRITE: the client writes message `i`'s pattern into its source slot before posting
//!   it. The server zeroes its slots before the run and checks them after it: every
//!   slot holds, byte for byte, the last message that went there, and these last messages
//!   add up to the count the client completed.
//! - READ: the server's slot `j` holds the pattern of message `j`; message `i` reads slot
//!   `i % t` into the client's slot `i % t`, which the client checks once the READ has
//!   completed, then zeroes (a later READ that placed nothing there would not match).

use super::PerfError;
use super::raw::Side;

const TAG: u64 = 0x5245_4d45_4d00_0000;
const STEP: u64 = 0x9e37_79b9_7f4a_7c15;
/// Message numbers take the low 40 bits of the first word.
const I_BITS: u32 = 40;

fn head(q: usize, i: u64) -> u64 {
    TAG ^ ((q as u64) << I_BITS) ^ i
}

/// The pattern of message `i` on QP `q`, `len` bytes.
pub(super) fn pattern(q: usize, i: u64, len: usize) -> Vec<u8> {
    let h = head(q, i);
    let mut v = Vec::with_capacity(len.div_ceil(8) * 8);
    for n in 0..len.div_ceil(8) as u64 {
        v.extend_from_slice(&h.wrapping_add(n.wrapping_mul(STEP)).to_le_bytes());
    }
    v.truncate(len);
    v
}

/// The message number a slot's first word names for QP `q`, if it names one.
fn message_of(q: usize, got: &[u8]) -> Option<u64> {
    let w = u64::from_le_bytes(got.get(..8)?.try_into().ok()?);
    let i = w ^ TAG ^ ((q as u64) << I_BITS);
    (i < 1 << I_BITS).then_some(i)
}

/// Why `got` is not message `i` of QP `q`, if it is not.
fn mismatch(q: usize, i: u64, got: &[u8]) -> Option<String> {
    let want = pattern(q, i, got.len());
    let at = got.iter().zip(&want).position(|(a, b)| a != b)?;
    let bad = got[at..]
        .iter()
        .zip(&want[at..])
        .filter(|(a, b)| a != b)
        .count();
    Some(format!(
        "QP {q} message {i}: {bad} of {} bytes differ, the first at offset {at} ({:#04x}, \
         expected {:#04x})",
        got.len(),
        got[at],
        want[at]
    ))
}

fn slot(side: &Side, q: usize, j: u64, size: u64, recv: bool) -> usize {
    let area = if recv {
        side.recv_area(q)
    } else {
        side.src_area(q)
    };
    area + (j * size) as usize
}

fn read(side: &Side, at: usize, size: u64) -> Result<Vec<u8>, PerfError> {
    let mut got = vec![0u8; size as usize];
    side.buf.read(at, &mut got).map_err(|e| e.to_string())?;
    Ok(got)
}

/// Offsets (within the buffer, and from the peer's receive area) of message `i`'s slot.
pub(super) fn slot_offset(i: u64, size: u64, depth: u32) -> u64 {
    (i % u64::from(depth)) * size
}

/// The client before posting WRITE `i` on QP `q`: its pattern into the source slot.
pub(super) fn fill_source(
    side: &Side,
    q: usize,
    i: u64,
    size: u64,
    depth: u32,
) -> Result<(), PerfError> {
    let at = side.src_area(q) + slot_offset(i, size, depth) as usize;
    side.buf
        .write(at, &pattern(q, i, size as usize))
        .map_err(|e| e.to_string())
}

/// The server before a run: WRITE targets zeroed, READ targets patterned.
pub(super) fn prepare_server(
    side: &Side,
    write: bool,
    size: u64,
    depth: u32,
) -> Result<(), PerfError> {
    for q in 0..side.qps.len() {
        for j in 0..u64::from(depth) {
            let at = slot(side, q, j, size, true);
            let r = if write {
                side.buf.fill(at, size as usize, 0)
            } else {
                side.buf.write(at, &pattern(q, j, size as usize))
            };
            r.map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// The client once READ `i` of QP `q` has completed: its slot holds the server's slot
/// `i % depth`; zeroed for the next READ into it.
pub(super) fn check_read(
    side: &Side,
    q: usize,
    i: u64,
    size: u64,
    depth: u32,
) -> Result<(), PerfError> {
    let j = i % u64::from(depth);
    let at = slot(side, q, j, size, true);
    let got = read(side, at, size)?;
    if let Some(why) = mismatch(q, j, &got) {
        return Err(format!("--verify: READ {i}: {why}"));
    }
    side.buf
        .fill(at, size as usize, 0)
        .map_err(|e| e.to_string())
}

/// The server after a WRITE run of `count` messages (all QPs): each slot holds the last
/// message sent to it, and the last messages of the QPs add up to `count`.
pub(super) fn check_writes(
    side: &Side,
    size: u64,
    depth: u32,
    count: u64,
) -> Result<(), PerfError> {
    let depth = u64::from(depth);
    let mut total = 0u64;
    for q in 0..side.qps.len() {
        // Per slot: the message found there (None: the slot is untouched).
        let mut found = Vec::with_capacity(depth as usize);
        for j in 0..depth {
            let got = read(side, slot(side, q, j, size, true), size)?;
            if got.iter().all(|&b| b == 0) {
                found.push(None);
                continue;
            }
            let i = message_of(q, &got)
                .filter(|i| i % depth == j)
                .ok_or_else(|| {
                    format!("--verify: QP {q} slot {j}: its first bytes name no message of it")
                })?;
            if let Some(why) = mismatch(q, i, &got) {
                return Err(format!("--verify: WRITE into slot {j}: {why}"));
            }
            found.push(Some(i));
        }
        let Some(last) = found.iter().flatten().copied().max() else {
            continue;
        };
        for (j, f) in found.iter().enumerate() {
            let j = j as u64;
            // The last message to slot j: the largest i <= last with i % depth == j.
            let want = (j <= last).then(|| last - (last - j) % depth);
            if *f != want {
                return Err(format!(
                    "--verify: QP {q} slot {j} holds {}, expected {} (the last message \
                     completed on the QP is {last})",
                    f.map_or("nothing".into(), |i| format!("message {i}")),
                    want.map_or("nothing".into(), |i| format!("message {i}"))
                ));
            }
        }
        total += last + 1;
    }
    if total != count {
        return Err(format!(
            "--verify: the client completed {count} WRITEs; the last ones found here add up \
             to {total}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_differ_by_qp_message_and_offset() {
        let a = pattern(0, 0, 64);
        assert_eq!(message_of(0, &a), Some(0));
        assert_eq!(mismatch(0, 0, &a), None);
        assert!(mismatch(0, 1, &a).is_some());
        assert!(mismatch(1, 0, &a).is_some());
        assert_eq!(message_of(3, &pattern(3, 77, 8)), Some(77));
        // Shifted by a word: every word is wrong.
        let shifted = [&a[8..], &a[..8]].concat();
        assert!(
            mismatch(0, 0, &shifted)
                .unwrap()
                .starts_with("QP 0 message 0: 64 of 64")
        );
        // One byte wrong, anywhere.
        for at in [0, 9, 63] {
            let mut b = a.clone();
            b[at] ^= 1;
            assert!(
                mismatch(0, 0, &b)
                    .unwrap()
                    .contains(&format!("offset {at} "))
            );
        }
        // A tail that is not a whole word.
        assert_eq!(pattern(2, 5, 13).len(), 13);
        assert_eq!(&pattern(2, 5, 13)[..], &pattern(2, 5, 16)[..13]);
    }

    /// A side on a soft device of its own (nothing connected): 2 QPs of 4 slots of 64 B.
    fn side() -> Side {
        let dev = super::super::open_device(&super::super::DeviceChoice {
            name: Some("soft@127.0.0.1:0".into()),
            gid_index: None,
            soft_inline: true,
            soft_busy_poll: false,
            soft_defer_responses: false,
        })
        .unwrap();
        let s = super::super::Settings {
            test: super::super::Test::WriteBw,
            api: false,
            atomic: super::super::AtomicType::FetchAndAdd,
            qps: 2,
            tx_depth: DEPTH,
            inline_size: 0,
            iters: 10,
            duration: None,
            sizes: vec![SIZE],
            bidir: false,
            conn: super::super::Conn::Rc,
            cm: None,
            verify: true,
        };
        Side::new(&s, &dev, 0).unwrap()
    }
    const DEPTH: u32 = 4;
    const SIZE: u64 = 64;

    /// What the WRITEs `0..n` of QP `q` leave in the server's slots.
    fn land(side: &Side, q: usize, n: u64) {
        for i in 0..n {
            let at = slot(side, q, i % u64::from(DEPTH), SIZE, true);
            side.buf.write(at, &pattern(q, i, SIZE as usize)).unwrap();
        }
    }

    #[test]
    fn the_write_check_accepts_the_last_messages_and_nothing_else() {
        let side = side();
        prepare_server(&side, true, SIZE, DEPTH).unwrap();
        // Nothing written, nothing claimed.
        check_writes(&side, SIZE, DEPTH, 0).unwrap();
        land(&side, 0, 10);
        land(&side, 1, 3);
        check_writes(&side, SIZE, DEPTH, 13).unwrap();
        // The client claims one more than arrived.
        let e = check_writes(&side, SIZE, DEPTH, 14).unwrap_err();
        assert!(e.contains("add up to 13"), "{e}");
        // One byte of a last message lost.
        let at = slot(&side, 0, 1, SIZE, true) + 40;
        side.buf.fill(at, 1, 0).unwrap();
        let e = check_writes(&side, SIZE, DEPTH, 13).unwrap_err();
        assert!(
            e.contains("QP 0 message 9: 1 of 64 bytes differ, the first at offset 40"),
            "{e}"
        );
        // A slot still holding an older message (the one after it never placed).
        land(&side, 0, 10);
        let old = slot(&side, 0, 0, SIZE, true);
        side.buf.write(old, &pattern(0, 4, SIZE as usize)).unwrap();
        let e = check_writes(&side, SIZE, DEPTH, 13).unwrap_err();
        assert!(
            e.contains("slot 0 holds message 4, expected message 8"),
            "{e}"
        );
        // Another QP's data.
        land(&side, 0, 10);
        let at = slot(&side, 1, 2, SIZE, true);
        side.buf.write(at, &pattern(0, 2, SIZE as usize)).unwrap();
        assert!(check_writes(&side, SIZE, DEPTH, 13).is_err());
    }

    #[test]
    fn the_read_check_takes_the_servers_slot_and_clears_it() {
        let side = side();
        // The server's targets as the client's slots would receive them.
        prepare_server(&side, false, SIZE, DEPTH).unwrap();
        for i in 0..u64::from(DEPTH) {
            check_read(&side, 1, i, SIZE, DEPTH).unwrap();
        }
        // Cleared: the same READ again finds zeros there (the pattern's own zero bytes match).
        let e = check_read(&side, 1, 2, SIZE, DEPTH).unwrap_err();
        assert!(
            e.contains("READ 2: QP 1 message 2: 62 of 64 bytes differ, the first at offset 0"),
            "{e}"
        );
    }
}
