//! What the librpma scenario examples share: two soft devices (any UDP ports), a
//! connection between them, and temporary files for persistent regions.

#![allow(dead_code)]

use remem::{AccessFlags, ConnectOptions, Connection, Error, Listener, Rdma, RdmaBuilder};

/// The rights of a persistent target region.
pub const PMEM: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::FLUSH_GLOBAL)
    .union(AccessFlags::FLUSH_PERSISTENT);

/// A server and a client device: `127.0.0.2` and `127.0.0.1`, each on a free UDP port
/// (remem's handshake tells each the other's).
pub fn devices() -> Result<(Rdma, Rdma), Error> {
    let server = RdmaBuilder::new().device("soft@127.0.0.2:0").build()?;
    let client = RdmaBuilder::new().device("soft@127.0.0.1:0").build()?;
    Ok((server, client))
}

/// The server's listener on a free TCP port of 127.0.0.1.
pub async fn listen(server: &Rdma) -> Result<Listener, Error> {
    server.listen("127.0.0.1:0").await
}

/// Connects `client` to `listener` with the options of each side; returns (client side,
/// server side).
pub async fn connect(
    client: &Rdma,
    listener: &Listener,
    client_opts: &ConnectOptions,
    server_opts: &ConnectOptions,
) -> Result<(Connection, Connection), Error> {
    let addr = listener.local_addr()?;
    let accept = async { listener.next_request().await?.accept(server_opts).await };
    let (c, s) = tokio::join!(client.connect_with(addr, client_opts), accept);
    Ok((c?, s?))
}

/// A temporary file, removed when dropped.
pub struct TempFile {
    /// Its path.
    pub path: std::path::PathBuf,
    /// It, open for reading and writing.
    pub file: std::fs::File,
}

impl TempFile {
    /// A new empty file named after `tag` in the temporary directory.
    pub fn new(tag: &str) -> std::io::Result<TempFile> {
        let path = std::env::temp_dir().join(format!("remem-{tag}-{}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        Ok(TempFile { path, file })
    }

    /// Its bytes as they are on disk now.
    pub fn contents(&self) -> std::io::Result<Vec<u8>> {
        std::fs::read(&self.path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Fails the example with a message unless `cond` holds.
pub fn check(cond: bool, what: &str) -> Result<(), Error> {
    if cond {
        println!("checked: {what}");
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!("check failed: {what}")))
    }
}

/// Distinct bytes.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(37) ^ seed)
        .collect()
}
