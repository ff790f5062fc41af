//! The control connection between a `remem perf` client and server (TCP): settings,
//! endpoint information, and the start and end of each size's run. Frames are a tag byte,
//! a 4-byte big-endian length and the payload.
//!
//! Who is on the other end is checked before anything else: a server takes a client's
//! first frame only if it is a settings frame with this version's magic, and a client
//! takes the server's first frame only if it is a hello with the magic (or an error).
//! Anything else is "not a remem perf peer", said at once; a peer that says nothing is
//! given up on after the control timeout. Waits for an answer the peer gives at once are
//! bounded by that timeout; waits that span a run (the server waiting for the client's
//! end of a size) are bounded by the run's duration where it has one, and otherwise end
//! when the connection closes.

use super::{AtomicType, Conn, PerfError, Settings, Test};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Frame tags.
pub(crate) const SETTINGS: u8 = 1;
pub(crate) const ENDPOINTS: u8 = 2;
pub(crate) const START: u8 = 3;
pub(crate) const DONE: u8 = 4;
pub(crate) const READY: u8 = 5;
pub(crate) const ERROR: u8 = 6;
/// The server's first frame: the magic and its device's name.
pub(crate) const HELLO: u8 = 7;
/// The server's account of a size: what it received (and sent, and measured when both
/// sides ran), after the client's DONE.
pub(crate) const RESULT: u8 = 8;
const MAX_TAG: u8 = RESULT;

/// This version of the exchange (the first three bytes name remem perf, the fourth the
/// version).
pub(crate) const MAGIC: &[u8; 4] = b"RMP2";
/// Largest frame accepted (endpoint lists of 1024 QPs fit easily).
const MAX_FRAME: usize = 1 << 20;

fn tag_name(tag: u8) -> &'static str {
    match tag {
        SETTINGS => "the settings",
        ENDPOINTS => "the endpoints",
        START => "the start of a size",
        DONE => "the end of a size",
        READY => "ready",
        ERROR => "an error",
        HELLO => "the server's hello",
        RESULT => "the server's result",
        _ => "a frame",
    }
}

/// The first bytes a peer sent, as text for an error message.
fn shown(bytes: &[u8]) -> String {
    let head = &bytes[..bytes.len().min(16)];
    format!("{:?}", String::from_utf8_lossy(head))
}

/// One side's control connection.
pub(crate) struct Ctrl {
    stream: TcpStream,
    /// Bytes of a frame read so far.
    partial: Vec<u8>,
    /// How long an answer may take.
    timeout: Duration,
    /// Whether the peer has shown it speaks this exchange (its first frame was good).
    identified: bool,
}

impl Ctrl {
    pub(crate) fn new(stream: TcpStream, timeout: Duration) -> Result<Ctrl, PerfError> {
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        stream
            .set_write_timeout(Some(timeout))
            .map_err(|e| e.to_string())?;
        Ok(Ctrl {
            stream,
            partial: Vec::new(),
            timeout,
            identified: false,
        })
    }

    /// How long an answer may take.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
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
            timeout: self.timeout,
            identified: self.identified,
        })
    }

    pub(crate) fn send(&mut self, tag: u8, payload: &[u8]) -> Result<(), PerfError> {
        let mut frame = Vec::with_capacity(5 + payload.len());
        frame.push(tag);
        frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        frame.extend_from_slice(payload);
        self.stream.write_all(&frame).map_err(|e| match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => format!(
                "control connection: the peer took nothing for {:.1} s",
                self.timeout.as_secs_f64()
            ),
            _ => format!("control connection: {e}"),
        })
    }

    /// The next frame, waiting at most the control timeout for it.
    pub(crate) fn recv(&mut self) -> Result<(u8, Vec<u8>), PerfError> {
        self.recv_within(Some(self.timeout))
    }

    /// The next frame, waiting at most `limit` (`None`: until it comes or the connection
    /// closes).
    pub(crate) fn recv_within(
        &mut self,
        limit: Option<Duration>,
    ) -> Result<(u8, Vec<u8>), PerfError> {
        self.stream
            .set_nonblocking(false)
            .map_err(|e| e.to_string())?;
        let deadline = limit.map(|l| Instant::now() + l);
        loop {
            if let Some(frame) = self.take_frame()? {
                return Ok(frame);
            }
            let wait = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(self.silent(limit.unwrap_or_default()));
                    }
                    Some(left)
                }
                None => None,
            };
            self.stream
                .set_read_timeout(wait)
                .map_err(|e| e.to_string())?;
            let mut buf = [0u8; 4096];
            match self.stream.read(&mut buf) {
                Ok(0) => return Err(self.closed()),
                Ok(n) => self.partial.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
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
            Ok(0) => Err(self.closed()),
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

    /// The error of a peer that said nothing for `waited`.
    pub(crate) fn silent(&self, waited: Duration) -> PerfError {
        if self.identified {
            format!(
                "the peer sent nothing on the control connection for {:.1} s",
                waited.as_secs_f64()
            )
        } else {
            format!(
                "the peer accepted the connection but said nothing for {:.1} s: not a remem perf \
                 peer (or a remem perf of another version)",
                waited.as_secs_f64()
            )
        }
    }

    fn closed(&self) -> PerfError {
        if self.identified {
            "the peer closed the control connection".into()
        } else {
            "the peer closed the connection without a word: not a remem perf peer".into()
        }
    }

    fn not_a_peer(&self) -> PerfError {
        if self.partial.len() >= 4 && self.partial[0].is_ascii_digit() {
            return format!(
                "the peer speaks perftest's exchange (it sent {}): run remem perf with \
                 --perftest against perftest's ib_* tools",
                shown(&self.partial)
            );
        }
        format!("not a remem perf peer: it sent {}", shown(&self.partial))
    }

    fn take_frame(&mut self) -> Result<Option<(u8, Vec<u8>)>, PerfError> {
        let Some(&tag) = self.partial.first() else {
            return Ok(None);
        };
        if tag == 0 || tag > MAX_TAG {
            return Err(if self.identified {
                format!("control: malformed frame (tag {tag})")
            } else {
                self.not_a_peer()
            });
        }
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
            return Err(if self.identified {
                format!("control: a frame of {len} bytes (at most {MAX_FRAME})")
            } else {
                self.not_a_peer()
            });
        }
        if self.partial.len() < 5 + len {
            return Ok(None);
        }
        let payload = self.partial[5..5 + len].to_vec();
        if tag == ERROR {
            return Err(format!("peer: {}", String::from_utf8_lossy(&payload)));
        }
        if !self.identified {
            // The first frame each way carries the magic.
            let magic_ok = matches!(tag, SETTINGS | HELLO) && payload.starts_with(MAGIC);
            if !magic_ok {
                return Err(
                    if matches!(tag, SETTINGS | HELLO) && payload.starts_with(&MAGIC[..3]) {
                        format!(
                            "the peer is a remem perf of another version (exchange {}, this \
                             side speaks {}): run the same version on both sides",
                            shown(&payload[..4.min(payload.len())]),
                            shown(MAGIC)
                        )
                    } else {
                        self.not_a_peer()
                    },
                );
            }
            self.identified = true;
        }
        self.partial.drain(..5 + len);
        Ok(Some((tag, payload)))
    }

    /// The next frame, which must carry `tag`, within the control timeout.
    pub(crate) fn expect(&mut self, tag: u8) -> Result<Vec<u8>, PerfError> {
        let (got, payload) = self.recv()?;
        check_tag(got, tag)?;
        Ok(payload)
    }

    /// Tells the peer why this side gives up (best effort).
    pub(crate) fn fail(&mut self, why: &str) {
        let _ = self.send(ERROR, why.as_bytes());
    }

    pub(crate) fn send_settings(&mut self, s: &Settings) -> Result<(), PerfError> {
        self.send(SETTINGS, &encode_settings(s))
    }

    /// A server's first step: the client's settings.
    pub(crate) fn recv_settings(&mut self) -> Result<Settings, PerfError> {
        let b = self.expect(SETTINGS)?;
        decode_settings(&b).ok_or_else(|| "malformed settings from the client".to_string())
    }

    /// A server's hello: the magic and its device's name.
    pub(crate) fn send_hello(&mut self, device: &str) -> Result<(), PerfError> {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(device.as_bytes());
        self.send(HELLO, &b)
    }

    /// A client's first step: the server's hello; returns the server's device name.
    pub(crate) fn recv_hello(&mut self) -> Result<String, PerfError> {
        let b = self.expect(HELLO).map_err(|e| {
            if e.starts_with("the peer accepted the connection but said nothing") {
                format!("{e} (is it a remem perf server?)")
            } else {
                e
            }
        })?;
        Ok(String::from_utf8_lossy(&b[MAGIC.len()..]).into_owned())
    }
}

pub(crate) fn check_tag(got: u8, want: u8) -> Result<(), PerfError> {
    if got != want {
        return Err(format!(
            "control: expected {} (frame {want}), got {} (frame {got})",
            tag_name(want),
            tag_name(got)
        ));
    }
    Ok(())
}

pub(crate) fn encode_settings(s: &Settings) -> Vec<u8> {
    let mut b = MAGIC.to_vec();
    b.push(s.test.code());
    b.push(u8::from(s.api));
    b.push(match s.atomic {
        AtomicType::FetchAndAdd => 0,
        AtomicType::CmpAndSwap => 1,
    });
    b.push(u8::from(s.bidir));
    b.push(match s.conn {
        Conn::Rc => 0,
        Conn::Uc => 1,
        Conn::Ud => 2,
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
    // Since -R: the CM port (absent: no CM).
    if let Some(port) = s.cm {
        b.push(1);
        b.extend_from_slice(&port.to_be_bytes());
    }
    // Since --verify: a section of its own (absent: not verified).
    if s.verify {
        b.push(2);
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
    pub(crate) fn f64(&mut self) -> Option<f64> {
        self.u64().map(f64::from_bits)
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
    let bidir = match c.u8()? {
        0 => false,
        1 => true,
        _ => return None,
    };
    let conn = match c.u8()? {
        0 => Conn::Rc,
        1 => Conn::Uc,
        2 => Conn::Ud,
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
    // Optional sections, each at most once, in this order: 1 (the CM port), 2 (verify).
    let mut cm = None;
    let mut verify = false;
    let mut last = 0;
    while let Some(tag) = c.u8() {
        if tag <= last {
            return None;
        }
        last = tag;
        match tag {
            1 => cm = Some(u16::from_be_bytes(c.bytes(2)?.try_into().ok()?)),
            2 => verify = true,
            _ => return None,
        }
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
        bidir,
        conn,
        cm,
        verify,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn settings() -> Settings {
        Settings {
            test: Test::AtomicBw,
            api: true,
            atomic: AtomicType::CmpAndSwap,
            qps: 3,
            tx_depth: 17,
            inline_size: 64,
            iters: 1234,
            duration: Some(Duration::from_secs(2)),
            sizes: vec![8],
            bidir: true,
            conn: Conn::Rc,
            cm: None,
            verify: false,
        }
    }

    #[test]
    fn settings_round_trip_and_garbage_is_refused() {
        let s = settings();
        let b = encode_settings(&s);
        assert_eq!(decode_settings(&b), Some(s.clone()));
        let ud = Settings {
            conn: Conn::Ud,
            bidir: false,
            ..s.clone()
        };
        assert_eq!(decode_settings(&encode_settings(&ud)), Some(ud));
        let cm = Settings {
            cm: Some(18515),
            ..s.clone()
        };
        let with_cm = encode_settings(&cm);
        assert_eq!(decode_settings(&with_cm), Some(cm.clone()));
        assert_eq!(decode_settings(&with_cm[..with_cm.len() - 1]), None);
        let verified = Settings {
            verify: true,
            ..cm.clone()
        };
        let with_verify = encode_settings(&verified);
        assert_eq!(decode_settings(&with_verify), Some(verified.clone()));
        let only_verify = Settings {
            verify: true,
            ..s.clone()
        };
        assert_eq!(
            decode_settings(&encode_settings(&only_verify)),
            Some(only_verify)
        );
        // A section twice, or out of order, is garbage.
        let mut twice = with_verify.clone();
        twice.push(2);
        assert_eq!(decode_settings(&twice), None);
        let mut swapped = encode_settings(&Settings {
            cm: None,
            ..verified
        });
        swapped.extend_from_slice(&[1, 0x48, 0x53]);
        assert_eq!(decode_settings(&swapped), None);
        for cut in 0..b.len() {
            assert_eq!(decode_settings(&b[..cut]), None);
        }
        let mut bad = b.clone();
        bad[4] = 200;
        assert_eq!(decode_settings(&bad), None);
        let mut long = b.clone();
        long.push(0);
        assert_eq!(decode_settings(&long), None);
    }

    /// A connected pair: (this side's `Ctrl`, the peer's raw socket).
    fn pair(timeout: Duration) -> (Ctrl, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mine, _) = l.accept().unwrap();
        (Ctrl::new(mine, timeout).unwrap(), peer)
    }

    #[test]
    fn a_silent_peer_is_given_up_on() {
        let (mut c, _peer) = pair(Duration::from_millis(200));
        let t0 = Instant::now();
        let err = c.recv_settings().unwrap_err();
        assert!(err.contains("said nothing for 0.2 s"), "{err}");
        assert!(err.contains("not a remem perf peer"), "{err}");
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn an_http_peer_is_not_a_remem_perf_peer() {
        for (greeting, want) in [
            (
                &b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..],
                "not a remem perf peer",
            ),
            (
                &b"HTTP/1.1 400 Bad Request\r\n\r\n"[..],
                "not a remem perf peer",
            ),
            (&b"\x01\x00\x00\x00\x04RMP1"[..], "another version"),
            (&b"6.06\0\0\0\0\0\0\0\0\0\0\0\0"[..], "--perftest"),
            (&b"\x02\x00\x00\x00\x00"[..], "not a remem perf peer"),
        ] {
            let (mut c, mut peer) = pair(Duration::from_secs(5));
            peer.write_all(greeting).unwrap();
            let err = c.recv_settings().unwrap_err();
            assert!(err.contains(want), "{greeting:?}: {err}");
            assert!(!err.contains("too large"), "{err}");
        }
    }

    #[test]
    fn a_peer_that_closes_at_once_is_named() {
        let (mut c, peer) = pair(Duration::from_secs(5));
        drop(peer);
        let err = c.recv_hello().unwrap_err();
        assert!(err.contains("without a word"), "{err}");
    }

    #[test]
    fn hello_and_settings_identify_the_peer() {
        let (mut server, peer) = pair(Duration::from_secs(5));
        let mut client = Ctrl::new(peer, Duration::from_secs(5)).unwrap();
        client.send_settings(&settings()).unwrap();
        assert_eq!(server.recv_settings().unwrap(), settings());
        server.send_hello("soft@127.0.0.1:4791").unwrap();
        assert_eq!(client.recv_hello().unwrap(), "soft@127.0.0.1:4791");
        // Identified: a later wait that times out says so plainly.
        let err = client
            .recv_within(Some(Duration::from_millis(50)))
            .unwrap_err();
        assert!(err.contains("sent nothing"), "{err}");
    }
}
