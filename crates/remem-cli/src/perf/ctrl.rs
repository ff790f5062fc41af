//! The control connection between a `remem perf` client and server (TCP): settings,
//! endpoint information, and the start and end of each size's run. Frames are a tag byte,
//! a 4-byte big-endian length and the payload.

use super::{AtomicType, PerfError, Settings, Test};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Frame tags.
pub(crate) const SETTINGS: u8 = 1;
pub(crate) const ENDPOINTS: u8 = 2;
pub(crate) const START: u8 = 3;
pub(crate) const DONE: u8 = 4;
pub(crate) const READY: u8 = 5;
pub(crate) const ERROR: u8 = 6;

const MAGIC: &[u8; 4] = b"RMP1";
/// Largest frame accepted (endpoint lists of 1024 QPs fit easily).
const MAX_FRAME: usize = 1 << 20;

/// One side's control connection.
pub(crate) struct Ctrl {
    stream: TcpStream,
    /// Bytes of a frame read so far by [`Ctrl::try_recv`].
    partial: Vec<u8>,
}

impl Ctrl {
    pub(crate) fn new(stream: TcpStream) -> Result<Ctrl, PerfError> {
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        Ok(Ctrl {
            stream,
            partial: Vec::new(),
        })
    }

    /// A second handle on the same connection (for a thread that waits on it). Only
    /// while no frame is partly read.
    pub(crate) fn try_clone(&self) -> Result<Ctrl, PerfError> {
        if !self.partial.is_empty() {
            return Err("control: cannot share a connection mid-frame".into());
        }
        Ok(Ctrl {
            stream: self.stream.try_clone().map_err(|e| e.to_string())?,
            partial: Vec::new(),
        })
    }

    pub(crate) fn send(&mut self, tag: u8, payload: &[u8]) -> Result<(), PerfError> {
        let mut frame = Vec::with_capacity(5 + payload.len());
        frame.push(tag);
        frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        frame.extend_from_slice(payload);
        self.stream
            .write_all(&frame)
            .map_err(|e| format!("control connection: {e}"))
    }

    /// The next frame (blocking).
    pub(crate) fn recv(&mut self) -> Result<(u8, Vec<u8>), PerfError> {
        self.stream
            .set_nonblocking(false)
            .map_err(|e| e.to_string())?;
        loop {
            if let Some(frame) = self.take_frame()? {
                return Ok(frame);
            }
            let mut buf = [0u8; 4096];
            match self.stream.read(&mut buf) {
                Ok(0) => return Err("the peer closed the control connection".into()),
                Ok(n) => self.partial.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("control connection: {e}")),
            }
        }
    }

    /// The next frame if one has arrived (never blocks).
    pub(crate) fn try_recv(&mut self) -> Result<Option<(u8, Vec<u8>)>, PerfError> {
        if let Some(frame) = self.take_frame()? {
            return Ok(Some(frame));
        }
        self.stream
            .set_nonblocking(true)
            .map_err(|e| e.to_string())?;
        let mut buf = [0u8; 4096];
        let got = self.stream.read(&mut buf);
        self.stream
            .set_nonblocking(false)
            .map_err(|e| e.to_string())?;
        match got {
            Ok(0) => Err("the peer closed the control connection".into()),
            Ok(n) => {
                self.partial.extend_from_slice(&buf[..n]);
                self.take_frame()
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {
                Ok(None)
            }
            Err(e) => Err(format!("control connection: {e}")),
        }
    }

    fn take_frame(&mut self) -> Result<Option<(u8, Vec<u8>)>, PerfError> {
        if self.partial.len() < 5 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([
            self.partial[1],
            self.partial[2],
            self.partial[3],
            self.partial[4],
        ]) as usize;
        if len > MAX_FRAME {
            return Err(format!("control frame of {len} bytes is too large"));
        }
        if self.partial.len() < 5 + len {
            return Ok(None);
        }
        let tag = self.partial[0];
        let payload = self.partial[5..5 + len].to_vec();
        self.partial.drain(..5 + len);
        if tag == ERROR {
            return Err(format!("peer: {}", String::from_utf8_lossy(&payload)));
        }
        Ok(Some((tag, payload)))
    }

    /// The next frame, which must carry `tag`.
    pub(crate) fn expect(&mut self, tag: u8) -> Result<Vec<u8>, PerfError> {
        let (got, payload) = self.recv()?;
        if got != tag {
            return Err(format!("control: expected frame {tag}, got {got}"));
        }
        Ok(payload)
    }

    /// Tells the peer why this side gives up (best effort).
    pub(crate) fn fail(&mut self, why: &str) {
        let _ = self.send(ERROR, why.as_bytes());
    }

    pub(crate) fn send_settings(&mut self, s: &Settings) -> Result<(), PerfError> {
        self.send(SETTINGS, &encode_settings(s))
    }

    pub(crate) fn recv_settings(&mut self) -> Result<Settings, PerfError> {
        let b = self.expect(SETTINGS)?;
        decode_settings(&b).ok_or_else(|| "malformed settings from the client".to_string())
    }
}

pub(crate) fn encode_settings(s: &Settings) -> Vec<u8> {
    let mut b = MAGIC.to_vec();
    b.push(s.test.code());
    b.push(u8::from(s.api));
    b.push(match s.atomic {
        AtomicType::FetchAndAdd => 0,
        AtomicType::CmpAndSwap => 1,
    });
    b.extend_from_slice(&s.qps.to_be_bytes());
    b.extend_from_slice(&s.tx_depth.to_be_bytes());
    b.extend_from_slice(&s.inline_size.to_be_bytes());
    b.extend_from_slice(&s.iters.to_be_bytes());
    let ms = s.duration.map_or(0, |d| d.as_millis() as u64);
    b.extend_from_slice(&ms.to_be_bytes());
    b.extend_from_slice(&(s.sizes.len() as u32).to_be_bytes());
    for size in &s.sizes {
        b.extend_from_slice(&size.to_be_bytes());
    }
    b
}

/// A reader over a byte slice that fails instead of panicking.
pub(crate) struct Cursor<'a>(pub &'a [u8]);

impl Cursor<'_> {
    pub(crate) fn bytes(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }
    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.bytes(1).map(|b| b[0])
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.bytes(4)?.try_into().ok().map(u32::from_be_bytes)
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.bytes(8)?.try_into().ok().map(u64::from_be_bytes)
    }
}

pub(crate) fn decode_settings(b: &[u8]) -> Option<Settings> {
    let mut c = Cursor(b);
    if c.bytes(4)? != MAGIC {
        return None;
    }
    let test = Test::from_code(c.u8()?)?;
    let api = c.u8()? != 0;
    let atomic = match c.u8()? {
        0 => AtomicType::FetchAndAdd,
        1 => AtomicType::CmpAndSwap,
        _ => return None,
    };
    let qps = c.u32()?;
    let tx_depth = c.u32()?;
    let inline_size = c.u32()?;
    let iters = c.u64()?;
    let ms = c.u64()?;
    let n = c.u32()? as usize;
    if n == 0 || n > 64 || qps == 0 || qps > 1024 || tx_depth == 0 || tx_depth > 8192 {
        return None;
    }
    let mut sizes = Vec::with_capacity(n);
    for _ in 0..n {
        let s = c.u64()?;
        if s == 0 || s > super::MAX_SIZE {
            return None;
        }
        sizes.push(s);
    }
    Some(Settings {
        test,
        api,
        atomic,
        qps,
        tx_depth,
        inline_size,
        iters,
        duration: (ms > 0).then(|| Duration::from_millis(ms)),
        sizes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_round_trip_and_garbage_is_refused() {
        let s = Settings {
            test: Test::AtomicBw,
            api: true,
            atomic: AtomicType::CmpAndSwap,
            qps: 3,
            tx_depth: 17,
            inline_size: 64,
            iters: 1234,
            duration: Some(Duration::from_secs(2)),
            sizes: vec![8],
        };
        let b = encode_settings(&s);
        assert_eq!(decode_settings(&b), Some(s));
        for cut in 0..b.len() {
            assert_eq!(decode_settings(&b[..cut]), None);
        }
        let mut bad = b.clone();
        bad[4] = 200;
        assert_eq!(decode_settings(&bad), None);
    }
}
