//! Cases across two processes. This process plays A; a child process it spawns plays B,
//! each on its own device. The link is a Unix socket pair whose child end is the child's
//! standard input, so either process sees the end of the link (EOF) as soon as the other
//! exits, and a child whose parent went away stops by itself.
//!
//! The parent names each case before both run it ([`drive`]); an empty name ends the
//! session ([`serve`] returns).

use crate::link::{CLOSED, Link, StreamLink};
use crate::side::{LINK_WAIT_FACTOR, Role, run_side, run_side_with};
use crate::{Case, CaseResult};
use remem_verbs::Context;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

/// Runs `cases` as A on `ctx`, one after the other, against a peer serving B at the other
/// end of `link`; returns each case's name and result. Ends the session afterwards.
pub fn drive(
    ctx: &Arc<dyn Context>,
    link: &mut dyn Link,
    cases: &[&'static Case],
    timeout: Duration,
) -> Vec<(&'static str, CaseResult)> {
    let mut results: Vec<_> = cases
        .iter()
        .map(|case| {
            let result = link
                .send(case.name.as_bytes())
                .and_then(|()| run_side(case, Role::A, ctx.clone(), link, timeout));
            (case.name, result)
        })
        .collect();
    if let Err(e) = link.send(b"") {
        results.push(("(end of session)", Err(e)));
    }
    results
}

/// Serves B on `ctx` for the cases the peer at the other end of `link` names, until it ends
/// the session; returns how many cases were run. Fails if the link breaks (the peer went
/// away) or stays silent too long.
pub fn serve(
    ctx: &Arc<dyn Context>,
    link: &mut dyn Link,
    timeout: Duration,
) -> Result<usize, String> {
    let mut served = 0;
    loop {
        let name = link.recv(timeout * LINK_WAIT_FACTOR)?;
        if name.is_empty() {
            return Ok(served);
        }
        served += 1;
        let name = String::from_utf8_lossy(&name).into_owned();
        // A failure belongs to the case (the peer reports it), not to the session.
        let _ = match Case::named(&name) {
            Some(case) => run_side(case, Role::B, ctx.clone(), link, timeout),
            None => run_side_with(
                |_| Err(format!("no case {name:?}")),
                Role::B,
                ctx.clone(),
                link,
                timeout,
            ),
        };
    }
}

/// Spawns `child` — a program that calls [`serve_parent`] — and runs `cases` against it
/// with [`drive`], A on `ctx`; then waits (bounded) for the child to exit. Returns each
/// case's name and result (and a failed `"(child process)"` entry if the child did not
/// exit successfully), or why the child could not be spawned.
pub fn run_with_child(
    ctx: &Arc<dyn Context>,
    mut child: Command,
    cases: &[&'static Case],
    timeout: Duration,
) -> Result<Vec<(&'static str, CaseResult)>, String> {
    let (mine, theirs) = UnixStream::pair().map_err(|e| format!("socketpair: {e}"))?;
    let mut process = child
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .spawn()
        .map_err(|e| format!("spawning the child: {e}"))?;
    // `child` holds the socket's other end: drop it so that the child's exit is seen.
    drop(child);
    let mut link = StreamLink::new(mine);
    let mut results = drive(ctx, &mut link, cases, timeout);
    // The child closes the link by exiting; kill it if it does not.
    let closed = link
        .recv(timeout * LINK_WAIT_FACTOR)
        .is_err_and(|e| e == CLOSED);
    if !closed {
        let _ = process.kill();
    }
    match process.wait() {
        Ok(status) if status.success() => {}
        Ok(status) => results.push(("(child process)", Err(format!("exit: {status}")))),
        Err(e) => results.push(("(child process)", Err(format!("wait: {e}")))),
    }
    Ok(results)
}

/// In a child spawned by [`run_with_child`]: serves B on `ctx` over the link on standard
/// input until the parent ends the session or goes away. Returns how many cases were run.
pub fn serve_parent(ctx: &Arc<dyn Context>, timeout: Duration) -> Result<usize, String> {
    let fd = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| format!("standard input: {e}"))?;
    serve(ctx, &mut StreamLink::new(UnixStream::from(fd)), timeout)
}
