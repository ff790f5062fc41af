//! The private mount namespace `remem run` gives a program, in which the drop-in's devices
//! are where programs look for them (`/dev/infiniband`, `/sys/class/infiniband`; see
//! [`crate::devtree`]).
//!
//! - As root: `unshare(CLONE_NEWNS)`, every mount made private (so nothing done here
//!   reaches the rest of the system).
//! - Otherwise (or where that is refused): `unshare(CLONE_NEWUSER | CLONE_NEWNS)` with the
//!   user's own uid and gid mapped to themselves (`setgroups` denied, as the kernel asks
//!   of an unprivileged map), where the kernel allows unprivileged user namespaces. The
//!   program keeps its uid and gid; it has no capability outside the namespace, and none
//!   inside once it is `exec`ed (a non-zero uid loses them at `execve`). Files of users
//!   outside the map (root's, other users') show as owned by the overflow uid (`nobody`),
//!   its supplementary groups as `nogroup`, and set-user-ID programs (`sudo`) do not
//!   change user.
//!
//! Then a tmpfs goes over `/dev` and one over `/sys/class`, each holding every entry that
//! was there (directories and files are bind mounts of the originals, with what is
//! mounted below them; symbolic links are copied), except the classes the tree replaces
//! (`/dev/infiniband`, `/sys/class/infiniband`, `/sys/class/infiniband_verbs`: a program
//! on the drop-in sees the drop-in's devices only, whatever the host has), and then the
//! tree. Each tmpfs is made read-only. Entries that appear in the real `/dev` or
//! `/sys/class` after the start (a device plugged in) are not seen by the program.
//!
//! The process must have no other thread (`unshare(CLONE_NEWUSER)` requires it):
//! `remem run` starts none before it `exec`s the program.

#![allow(unsafe_code)]

use crate::devtree::{DEV_OWN, Node, SYS_OWN, Tree};
use rustix::fs::{Mode, OFlags};
use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};
use rustix::thread::UnshareFlags;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// How the namespace was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Made {
    /// As root: a mount namespace.
    Root,
    /// A user namespace mapping the user to themselves, with a mount namespace.
    User,
}

/// Moves this process into a private mount namespace (see the module documentation).
/// `Err` says why not (`cannot …`); the process is then where it was, or in a user namespace whose
/// mounts are still private (nothing done afterwards leaves it).
pub fn enter() -> Result<Made, String> {
    let uid = rustix::process::geteuid();
    let gid = rustix::process::getegid();
    let mut as_root = None;
    if uid.is_root() {
        // SAFETY: CLONE_NEWNS only, not CLONE_FILES: no file descriptor table is split
        // between threads (and this process has one thread).
        match unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWNS) } {
            Ok(()) => {
                make_private()?;
                return Ok(Made::Root);
            }
            Err(e) => as_root = Some(e),
        }
    }
    let both = UnshareFlags::NEWUSER | UnshareFlags::NEWNS;
    // SAFETY: as above: CLONE_NEWUSER | CLONE_NEWNS, not CLONE_FILES.
    let entered = unsafe { rustix::thread::unshare_unsafe(both) };
    if let Err(e) = entered {
        let root = as_root.map_or(String::new(), |r| format!("a mount namespace: {r}; "));
        return Err(format!(
            "cannot make {root}a user namespace: {e}{}",
            if e == rustix::io::Errno::PERM || e == rustix::io::Errno::NOSPC {
                " (unprivileged user namespaces are off or used up here)"
            } else {
                ""
            }
        ));
    }
    // An unprivileged process may map its own ids only, and a gid map only once setgroups
    // is denied (files missing on kernels older than 3.19 need no such step).
    match fs::write("/proc/self/setgroups", "deny") {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(format!("cannot deny setgroups in the user namespace: {e}"));
        }
        _ => {}
    }
    let (uid, gid) = (uid.as_raw(), gid.as_raw());
    fs::write("/proc/self/uid_map", format!("{uid} {uid} 1\n"))
        .map_err(|e| format!("cannot map uid {uid} in the user namespace: {e}"))?;
    fs::write("/proc/self/gid_map", format!("{gid} {gid} 1\n"))
        .map_err(|e| format!("cannot map gid {gid} in the user namespace: {e}"))?;
    make_private()?;
    Ok(Made::User)
}

/// Makes every mount private: nothing mounted here propagates out.
fn make_private() -> Result<(), String> {
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )
    .map_err(|e| format!("cannot make the mounts private: {e}"))
}

/// Shows `tree` under `/dev` and `/sys/class` (in the namespace [`enter`] made). Each of the
/// two is done whole or not at all; `Err` says which could not be done (as
/// [`unseen_message`]'s `places`) and why.
pub fn show(tree: &Tree) -> Result<(), (String, String)> {
    let mut places = Vec::new();
    let mut whys = Vec::new();
    for (dir, own, entries, place) in [
        ("/dev", DEV_OWN, &tree.dev, "/dev/infiniband"),
        ("/sys/class", SYS_OWN, &tree.sys, "/sys/class/infiniband"),
    ] {
        if let Err(e) = cover(Path::new(dir), own, entries) {
            places.push(place);
            whys.push(format!("{dir}: {e}"));
        }
    }
    if places.is_empty() {
        Ok(())
    } else {
        Err((places.join(" and "), whys.join("; ")))
    }
}

/// Puts a tmpfs over `dir` holding `dir`'s entries but `own`, then `entries`; read-only.
/// On failure the tmpfs is taken away again.
fn cover(dir: &Path, own: &[&str], entries: &[(PathBuf, Node)]) -> Result<(), String> {
    // The directory under the tmpfs stays reachable through this descriptor.
    let old = rustix::fs::open(
        dir,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("cannot open it: {e}"))?;
    let old_dir = PathBuf::from(format!("/proc/self/fd/{}", old.as_raw_fd()));
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| format!("cannot list it: {e}"))? {
        let name = entry
            .map_err(|e| format!("cannot list it: {e}"))?
            .file_name();
        if !own.iter().any(|o| name == *o) {
            names.push(name);
        }
    }
    let flags = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
    rustix::mount::mount("tmpfs", dir, "tmpfs", flags, Some(c"mode=755"))
        .map_err(|e| format!("cannot mount a tmpfs over it: {e}"))?;
    let filled = (|| {
        for name in &names {
            keep(&old_dir.join(name), &dir.join(name))?;
        }
        for (path, node) in entries {
            make(path, node)?;
        }
        rustix::mount::mount_remount(dir, MountFlags::BIND | MountFlags::RDONLY | flags, "")
            .map_err(|e| format!("cannot make it read-only: {e}"))
    })();
    if filled.is_err() {
        // Everything mounted in it goes with it.
        let _ = rustix::mount::unmount(dir, UnmountFlags::DETACH);
    }
    filled
}

/// Makes `new` show what `old` is: a bind mount of a directory (with what is mounted
/// below it) or of a file, a copy of a symbolic link.
fn keep(old: &Path, new: &Path) -> Result<(), String> {
    let what = |e: &dyn std::fmt::Display| format!("{}: {e}", new.display());
    let meta = fs::symlink_metadata(old).map_err(|e| what(&e))?;
    if meta.file_type().is_symlink() {
        let target = fs::read_link(old).map_err(|e| what(&e))?;
        std::os::unix::fs::symlink(target, new).map_err(|e| what(&e))
    } else if meta.is_dir() {
        fs::create_dir(new).map_err(|e| what(&e))?;
        rustix::mount::mount_bind_recursive(old, new).map_err(|e| what(&e))
    } else {
        fs::File::create(new).map_err(|e| what(&e))?;
        rustix::mount::mount_bind(old, new).map_err(|e| what(&e))
    }
}

/// Makes one entry of the tree.
fn make(path: &Path, node: &Node) -> Result<(), String> {
    let what = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    match node {
        Node::Dir => {
            fs::create_dir(path).map_err(|e| what(&e))?;
            fs::set_permissions(path, fs::Permissions::from_mode(0o755)).map_err(|e| what(&e))
        }
        Node::File(text) => {
            fs::write(path, text).map_err(|e| what(&e))?;
            fs::set_permissions(path, fs::Permissions::from_mode(0o444)).map_err(|e| what(&e))
        }
        Node::CharDev => {
            let null = Path::new("/dev/null");
            let ok = fs::metadata(null).is_ok_and(|m| m.file_type().is_char_device());
            if !ok {
                return Err(what(&"/dev/null is not a character device"));
            }
            fs::File::create(path).map_err(|e| what(&e))?;
            rustix::mount::mount_bind(null, path).map_err(|e| what(&e))
        }
    }
}

/// Where the devices are shown: both places.
pub const ALL_PLACES: &str = "/dev/infiniband and /sys/class/infiniband";

/// The one line `remem run` writes when programs will not see the devices (named `names`)
/// in `places`: why, what misses them, and that the program runs anyway.
pub fn unseen_message(places: &str, why: &str, names: &[String]) -> String {
    let dev = names.first().map_or("rxe0", String::as_str);
    format!(
        "remem run: programs will not see the soft devices in {places} ({why}): UCX (and \
         Open MPI's pml ucx) lists a device only if /dev/infiniband has it, other tools read \
         /sys/class/infiniband/{dev}; running anyway (--no-namespace or REMEM_RUN_NAMESPACE=0 \
         runs without trying)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_is_one_line_naming_the_cause_and_the_way_out() {
        let m = unseen_message(
            ALL_PLACES,
            "a user namespace: Operation not permitted",
            &["rxe0".into()],
        );
        assert!(!m.contains('\n'));
        assert!(m.starts_with("remem run: "), "{m}");
        assert!(
            m.contains("(a user namespace: Operation not permitted)"),
            "{m}"
        );
        assert!(m.contains("/sys/class/infiniband/rxe0"), "{m}");
        assert!(
            m.contains("not see the soft devices in /dev/infiniband and /sys/class/infiniband"),
            "{m}"
        );
        assert!(m.contains("UCX"), "{m}");
        assert!(m.contains("running anyway"), "{m}");
        assert!(m.contains("REMEM_RUN_NAMESPACE=0"), "{m}");
        let sys = unseen_message("/sys/class/infiniband", "x", &["a".into(), "b".into()]);
        assert!(
            sys.contains("devices in /sys/class/infiniband (x)"),
            "{sys}"
        );
        assert!(sys.contains("/sys/class/infiniband/a;"), "{sys}");
    }
}
