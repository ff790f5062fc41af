//! The `kv_cache` example between two processes: this test is the client (three
//! connections, four tasks on each); it starts this test binary again as the example's
//! server (`child_server`), which prints where it listens. The client verifies every slot
//! and counter of the server's table; the server must exit cleanly once the client's
//! connections have closed.
//!
//! The example's code is compiled into this test (`#[path]`), so `cargo test --test
//! api kv_cache` runs it without building the example first. The child's standard input is a
//! pipe the parent holds: when the parent goes away, the child sees its end and exits.

#[allow(dead_code)]
#[path = "../../examples/kv_cache.rs"]
mod example;

use example::Args;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Carries the server's command line to the child.
const ARGS_ENV: &str = "REMEM_KV_CACHE_SERVER_ARGS";
/// The longest the client runs.
const LIMIT: Duration = Duration::from_secs(60);

fn args(line: &str) -> Args {
    Args(line.split(' ').map(String::from).collect())
}

/// The example's server; runs only as the child process of the test below.
#[test]
#[ignore = "runs in the child process of kv_cache_between_two_processes"]
fn child_server() {
    let Ok(line) = std::env::var(ARGS_ENV) else {
        eprintln!("child_server only runs as the child of kv_cache_between_two_processes");
        return;
    };
    std::thread::spawn(|| {
        // The parent writes nothing: end of file (or an error) means it is gone.
        let _ = std::io::stdin().read(&mut [0]);
        eprintln!("child: the parent went away");
        std::process::exit(3);
    });
    example::main_with(args(&line)).expect("the server");
}

/// Kills the child if the test ends before it exits.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn kv_cache_between_two_processes() {
    let mut cmd = Command::new(std::env::current_exe().expect("own path"));
    cmd.args([
        "--exact",
        "kv_cache::child_server",
        "--ignored",
        "--nocapture",
    ])
    .env(ARGS_ENV, "server --connections 3 --device soft@127.0.0.1:0")
    .stdin(Stdio::piped());
    let (child, addr) = example::spawn_server(cmd).expect("the server listens");
    let mut server = Server(child);
    // Held until the child has exited (waiting would close it first).
    let _stdin = server.0.stdin.take();

    let client = args(&format!(
        "client --connect {addr} --device soft@127.0.0.2:0 \
         --connections 3 --tasks 4 --ops 300"
    ));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let summary = runtime
        .block_on(async { tokio::time::timeout(LIMIT, example::client(&client)).await })
        .expect("the client's time limit")
        .expect("the client found no wrong value");
    let [
        gets,
        _torn,
        rpc_puts,
        cas_puts,
        _busy,
        faas,
        slots,
        counters,
    ] = summary.n;
    assert!(
        gets > 0 && rpc_puts > 0 && cas_puts > 0 && faas > 0,
        "{summary:?}"
    );
    assert_eq!(
        (slots, counters),
        (64, 8),
        "every slot and counter verified"
    );
    assert_eq!(
        gets + rpc_puts + cas_puts + faas,
        3 * 4 * 300,
        "every operation"
    );

    let status = server.0.wait().expect("waiting for the server");
    assert!(status.success(), "the server: {status}");
}
