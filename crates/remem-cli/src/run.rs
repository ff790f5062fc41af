//! `remem run`: run an unmodified program on remem's drop-in libibverbs.
//!
//! The drop-in is `libremem_ibv.so` (the `remem-ibv` crate: its soname is
//! `libibverbs.so.1`, and it carries librdmacm's symbols too). A program finds it through a
//! *drop-in directory* holding `libibverbs.so.1 -> <the library>` and
//! `librdmacm.so.1 -> <the same library>` (the loader maps the file once for both names),
//! put first on `LD_LIBRARY_PATH`; then the program is `exec`ed, so its exit status and
//! signals are its own.
//!
//! Where the library is looked for, in order: `$REMEM_IBV_LIB` (a file), the directory of
//! the `remem` executable (cargo puts both in `target/<profile>/`), `<that directory>/../lib`
//! (an installed layout). The drop-in directory is `<directory of the library>/remem-ibv/`,
//! or, where that cannot be made or updated (a read-only install), `$XDG_RUNTIME_DIR/remem-ibv/`
//! or `/tmp/remem-ibv-<uid>/` (made private to the user, and refused if someone else owns
//! it or can write to it). Links are replaced atomically (a new link renamed over the old),
//! so runs that start at the same time never see a missing link.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use crate::{devtree, namespace};
use remem_soft::dropin;

/// The drop-in library's file name.
pub const LIB_NAME: &str = "libremem_ibv.so";
/// The names the drop-in directory gives the library: the libraries it replaces.
pub const LINK_NAMES: [&str; 2] = ["libibverbs.so.1", "librdmacm.so.1"];
/// The environment variable naming the library's path.
pub const LIB_ENV: &str = "REMEM_IBV_LIB";
/// The environment variable that turns the private mount namespace off (`0`).
pub const NAMESPACE_ENV: &str = "REMEM_RUN_NAMESPACE";
/// Exit status of `remem run` when it fails before running the program (as `env`'s).
const EXIT_OWN_FAILURE: u8 = 125;

/// `remem run` options.
#[derive(clap::Args, Debug)]
#[command(
    override_usage = "remem run [--] PROGRAM [ARGS]...\n       remem run --lib-dir",
    after_help = "\
Examples:
  remem run -- ib_write_bw -d rxe0            # serve on the drop-in
  remem run -- ib_write_bw -d rxe0 127.0.0.1  # ... and connect, in another shell
  remem run -- rping -s -a 127.0.0.1 -v       # RDMA CM programs too (librdmacm)
  LD_LIBRARY_PATH=$(remem run --lib-dir) ibv_devinfo

The library is looked for at $REMEM_IBV_LIB, beside the remem executable, then in
<executable dir>/../lib; build it with `cargo build --release -p remem-ibv`.
The library is both libibverbs.so.1 and librdmacm.so.1. Programs that ignore
LD_LIBRARY_PATH (setuid programs, an RPATH naming libibverbs) do not load the drop-in.

The program runs in a private mount namespace where /dev/infiniband/uverbsN and
/sys/class/infiniband/DEV (node type and GUID, port state, GIDs with their types
and interfaces) describe the soft devices, as for a kernel device (UCX lists a
device only when /dev/infiniband has it); the rest of /dev and /sys/class stays.
As root: a mount namespace. As another user, where the kernel allows unprivileged
user namespaces: a user namespace mapping the user to themselves (the program
keeps its uid and gid and has no privilege; root's files show as nobody's).
Otherwise one line on stderr says so and the program runs without them. The
default devices (REMEM_IBV_DEVICES unset) are the host's, shared by every
process: rxe0 on 127.0.0.1, then one per interface with an IPv4 address. A
`private` device's own address (its GID, the node GUID) is left out.
--no-namespace or REMEM_RUN_NAMESPACE=0 turns the namespace off.

Exit status: the program's; 125 if remem run itself failed, 126 if the
program could not be run, 127 if it was not found."
)]
pub struct RunArgs {
    /// Run the program as it is, without the private mount namespace that shows the
    /// soft devices in /dev/infiniband and /sys/class/infiniband (as REMEM_RUN_NAMESPACE=0).
    #[arg(long)]
    pub no_namespace: bool,
    /// Print the drop-in directory (made if needed) and exit, for
    /// `LD_LIBRARY_PATH=$(remem run --lib-dir) PROGRAM`.
    #[arg(long, conflicts_with = "program")]
    pub lib_dir: bool,
    /// The program to run and its arguments (after `--`).
    #[arg(
        value_name = "PROGRAM",
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required_unless_present = "lib_dir"
    )]
    pub program: Vec<OsString>,
}

/// Runs `remem run`: returns only when the program could not be started (or for
/// `--lib-dir`).
pub fn run(args: &RunArgs) -> ExitCode {
    let dir = match find_library().and_then(|lib| drop_in_dir(&lib)) {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("remem run: {e}");
            return ExitCode::from(EXIT_OWN_FAILURE);
        }
    };
    if args.lib_dir {
        // The path's bytes as they are (a path need not be UTF-8).
        let mut line = dir.into_os_string().into_vec();
        line.push(b'\n');
        return match io::Write::write_all(&mut io::stdout().lock(), &line) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("remem run: cannot print the drop-in directory: {e}");
                ExitCode::from(EXIT_OWN_FAILURE)
            }
        };
    }
    let Some((program, rest)) = args.program.split_first() else {
        // clap requires PROGRAM without --lib-dir.
        eprintln!("remem run: no program to run");
        return ExitCode::from(2);
    };
    if !args.no_namespace && namespace_wanted(std::env::var_os(NAMESPACE_ENV).as_deref()) {
        show_devices();
    }
    let path = prepend_path(&dir, std::env::var_os("LD_LIBRARY_PATH").as_deref());
    let err = Command::new(program)
        .args(rest)
        .env("LD_LIBRARY_PATH", path)
        .exec();
    eprintln!(
        "remem run: cannot run {}: {err}",
        Path::new(program).display()
    );
    ExitCode::from(if err.kind() == io::ErrorKind::NotFound {
        127
    } else {
        126
    })
}

/// Whether `REMEM_RUN_NAMESPACE`'s value asks for the namespace: anything but `0`, `no`,
/// `off`, `false` (unset too).
pub fn namespace_wanted(value: Option<&OsStr>) -> bool {
    !value.is_some_and(|v| {
        ["0", "no", "off", "false"]
            .iter()
            .any(|n| v.eq_ignore_ascii_case(n))
    })
}

/// Moves this process into a private mount namespace showing the drop-in's devices in
/// `/dev/infiniband` and `/sys/class` (see [`crate::devtree`], [`crate::namespace`]); says
/// on stderr, in one line, what programs will not see if it cannot.
fn show_devices() {
    let value = std::env::var(dropin::DEVICES_ENV).ok();
    let configs = match dropin::parse_devices(value.as_deref()) {
        Ok(c) if c.is_empty() => return,
        Ok(c) => c,
        Err(why) => {
            // The drop-in refuses the list too (EINVAL, and a line of its own).
            eprintln!(
                "remem run: {}: {why}; no device is shown in /dev/infiniband or /sys/class",
                dropin::DEVICES_ENV
            );
            return;
        }
    };
    let names: Vec<String> = configs.iter().map(|c| c.name.clone()).collect();
    let unseen = |places: &str, why: &str| {
        eprintln!("{}", namespace::unseen_message(places, why, &names));
    };
    let tree = match devtree::facts(&configs) {
        Ok(facts) => devtree::tree(&facts),
        Err(why) => return unseen(namespace::ALL_PLACES, &why),
    };
    if let Err(why) = namespace::enter() {
        return unseen(namespace::ALL_PLACES, &why);
    }
    if let Err((places, why)) = namespace::show(&tree) {
        unseen(&places, &why);
    }
}

/// `dir` first, then the entries of `old` (no empty entry, which would mean the current
/// directory).
pub fn prepend_path(dir: &Path, old: Option<&OsStr>) -> OsString {
    let mut out = OsString::from(dir);
    if let Some(old) = old.filter(|o| !o.is_empty()) {
        out.push(":");
        out.push(old);
    }
    out
}

/// Where the library is: `$REMEM_IBV_LIB`, else beside the executable, else in
/// `<exe dir>/../lib`; an error naming every place looked at.
pub fn find_library() -> Result<PathBuf, String> {
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf));
    locate(std::env::var_os(LIB_ENV).as_deref(), exe_dir.as_deref())
}

fn locate(env: Option<&OsStr>, exe_dir: Option<&Path>) -> Result<PathBuf, String> {
    const HOW: &str = "build it with `cargo build --release -p remem-ibv` (it lands beside \
                       target/release/remem), or set REMEM_IBV_LIB to its path";
    if let Some(env) = env.filter(|e| !e.is_empty()) {
        let path = PathBuf::from(env);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "{LIB_ENV}={} is not a file; unset it to look beside the remem executable, \
                 or {HOW}",
                path.display()
            ))
        };
    }
    let mut looked = vec![format!("${LIB_ENV} (not set)")];
    if let Some(dir) = exe_dir {
        for cand in [
            dir.join(LIB_NAME),
            dir.join("..").join("lib").join(LIB_NAME),
        ] {
            if cand.is_file() {
                return Ok(cand);
            }
            looked.push(cand.display().to_string());
        }
    } else {
        looked.push("(the remem executable's directory is unknown)".into());
    }
    Err(format!(
        "cannot find the drop-in libibverbs ({LIB_NAME}); looked at: {}; {HOW}",
        looked.join(", ")
    ))
}

/// The drop-in directory for `lib` (made or brought up to date): beside the library, else
/// the per-user fallback.
pub fn drop_in_dir(lib: &Path) -> Result<PathBuf, String> {
    let lib = fs::canonicalize(lib).map_err(|e| format!("{}: {e}", lib.display()))?;
    let lib_dir = lib
        .parent()
        .ok_or_else(|| format!("{}: no parent directory", lib.display()))?;
    let beside = lib_dir.join("remem-ibv");
    let first = match populate(&beside, &lib, false) {
        Ok(()) => return Ok(beside),
        Err(e) => e,
    };
    let fallback = fallback_dir();
    populate(&fallback, &lib, true)
        .map(|()| fallback.clone())
        .map_err(|e| {
            format!(
                "cannot make the drop-in directory {} ({first}) nor {} ({e})",
                beside.display(),
                fallback.display()
            )
        })
}

/// `$XDG_RUNTIME_DIR/remem-ibv` (when set to an absolute path), else `/tmp/remem-ibv-<uid>`.
fn fallback_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        Some(run) if run.is_absolute() => run.join("remem-ibv"),
        _ => std::env::temp_dir().join(format!("remem-ibv-{}", rustix::process::getuid().as_raw())),
    }
}

/// Makes `dir` hold the links the drop-in needs: `libibverbs.so.1 -> lib` and
/// `librdmacm.so.1 -> lib`. Links already right are left alone, so a directory someone
/// else prepared (a read-only install) is used as it is. `private`: the directory must be
/// the user's own and writable by nobody else (a shared place such as /tmp).
fn populate(dir: &Path, lib: &Path, private: bool) -> io::Result<()> {
    // Beside the library, as any directory (other users may use it); a shared place's
    // directory private to the user.
    let mode = if private { 0o700 } else { 0o777 };
    match fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(io::Error::other("exists and is not a directory"));
    }
    if private && (meta.uid() != rustix::process::getuid().as_raw() || meta.mode() & 0o022 != 0) {
        return Err(io::Error::other(
            "owned by another user or writable by others: not used",
        ));
    }
    for name in LINK_NAMES {
        set_link(dir, name, lib)?;
    }
    Ok(())
}

/// Makes `dir/name` a symbolic link to `target`, unless it already is exactly that.
fn set_link(dir: &Path, name: &str, target: &Path) -> io::Result<()> {
    let path = dir.join(name);
    if fs::read_link(&path).ok().as_deref() == Some(target) {
        return Ok(());
    }
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)?;
    fs::rename(&tmp, &path).inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("remem-run-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        fs::canonicalize(d).unwrap()
    }

    #[test]
    fn path_is_prepended_without_empty_entries() {
        let d = Path::new("/x/remem-ibv");
        assert_eq!(prepend_path(d, None), "/x/remem-ibv");
        assert_eq!(prepend_path(d, Some(OsStr::new(""))), "/x/remem-ibv");
        assert_eq!(
            prepend_path(d, Some(OsStr::new("/a:/b"))),
            "/x/remem-ibv:/a:/b"
        );
    }

    #[test]
    fn the_namespace_is_on_unless_turned_off() {
        assert!(namespace_wanted(None));
        for on in ["1", "yes", "", "on"] {
            assert!(namespace_wanted(Some(OsStr::new(on))), "{on}");
        }
        for off in ["0", "no", "off", "false", "OFF", "False"] {
            assert!(!namespace_wanted(Some(OsStr::new(off))), "{off}");
        }
    }

    #[test]
    fn search_order() {
        let root = scratch("search");
        let bin = root.join("bin");
        fs::create_dir_all(&bin).unwrap();
        let err = locate(None, Some(&bin)).unwrap_err();
        assert!(err.contains("REMEM_IBV_LIB (not set)"), "{err}");
        assert!(
            err.contains(&bin.join(LIB_NAME).display().to_string()),
            "{err}"
        );
        assert!(err.contains("cargo build --release -p remem-ibv"), "{err}");
        // <exe dir>/../lib
        fs::create_dir_all(root.join("lib")).unwrap();
        fs::write(root.join("lib").join(LIB_NAME), b"").unwrap();
        assert_eq!(
            locate(None, Some(&bin)).unwrap(),
            bin.join("..").join("lib").join(LIB_NAME)
        );
        // beside the executable wins
        fs::write(bin.join(LIB_NAME), b"").unwrap();
        assert_eq!(locate(None, Some(&bin)).unwrap(), bin.join(LIB_NAME));
        // $REMEM_IBV_LIB wins, and is not second-guessed when wrong
        let named = root.join("other.so");
        fs::write(&named, b"").unwrap();
        assert_eq!(locate(Some(named.as_os_str()), Some(&bin)).unwrap(), named);
        let err = locate(Some(OsStr::new("/no/such.so")), Some(&bin)).unwrap_err();
        assert!(
            err.contains("REMEM_IBV_LIB=/no/such.so is not a file"),
            "{err}"
        );
        // An empty variable counts as unset.
        assert_eq!(
            locate(Some(OsStr::new("")), Some(&bin)).unwrap(),
            bin.join(LIB_NAME)
        );
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn links_are_made_replaced_and_removed() {
        let root = scratch("links");
        let lib = root.join(LIB_NAME);
        fs::write(&lib, b"").unwrap();
        let dir = drop_in_dir(&lib).unwrap();
        assert_eq!(dir, root.join("remem-ibv"));
        // Both libraries are the one file.
        assert_eq!(fs::read_link(dir.join("libibverbs.so.1")).unwrap(), lib);
        assert_eq!(fs::read_link(dir.join("librdmacm.so.1")).unwrap(), lib);
        // Stale links (an earlier separate librdmacm drop-in, a moved library) are
        // replaced; no temporary is left behind.
        for name in LINK_NAMES {
            fs::remove_file(dir.join(name)).unwrap();
            std::os::unix::fs::symlink("/elsewhere.so", dir.join(name)).unwrap();
        }
        drop_in_dir(&lib).unwrap();
        for name in LINK_NAMES {
            assert_eq!(fs::read_link(dir.join(name)).unwrap(), lib);
        }
        let mut names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["libibverbs.so.1", "librdmacm.so.1"]);
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn a_shared_fallback_must_be_private() {
        let root = scratch("private");
        let lib = root.join(LIB_NAME);
        fs::write(&lib, b"").unwrap();
        let open = root.join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        let err = populate(&open, &lib, true).unwrap_err();
        assert!(err.to_string().contains("writable by others"), "{err}");
        let mine = root.join("mine");
        populate(&mine, &lib, true).unwrap();
        assert_eq!(
            fs::metadata(&mine).unwrap().permissions().mode() & 0o777,
            0o700
        );
        fs::remove_dir_all(root).unwrap();
    }
}
