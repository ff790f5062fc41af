//! `remem run` shows the drop-in's devices where programs look for them: the private mount
//! namespace with `/dev/infiniband` and `/sys/class/infiniband`, as root and as an
//! unprivileged user, the opt-out, the line on stderr when the namespace cannot be made,
//! and UCX listing the device. Tests that need a tool (setpriv, unshare, ucx_info) or a
//! privilege the machine lacks say so and pass.

use remem_soft::dropin;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A directory every user can read holding a copy of `remem` and a stand-in
/// `libremem_ibv.so` (the tests here look at files, not at the library); removed on drop.
struct Lab {
    dir: PathBuf,
}

impl Lab {
    fn new(name: &str) -> Lab {
        let dir = std::env::temp_dir().join(format!("remem-cli-ns-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        // A link where the file system allows it, else a copy (readable by all either way).
        if fs::hard_link(env!("CARGO_BIN_EXE_remem"), dir.join("remem")).is_err() {
            fs::copy(env!("CARGO_BIN_EXE_remem"), dir.join("remem")).unwrap();
        }
        fs::write(dir.join("libremem_ibv.so"), b"a stand-in").unwrap();
        fs::set_permissions(
            dir.join("libremem_ibv.so"),
            fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        // The drop-in directory, made now so that another user finds it ready. A copy's
        // first exec may find it busy (ETXTBSY): a child another test thread forked while
        // the copy was open for writing holds it until that child execs.
        let mut lib_dir = Command::new(dir.join("remem"));
        lib_dir
            .args(["run", "--lib-dir"])
            .env("REMEM_IBV_LIB", dir.join("libremem_ibv.so"));
        let busy = rustix::io::Errno::TXTBSY.raw_os_error();
        let out = loop {
            match lib_dir.output() {
                Err(e) if e.raw_os_error() == Some(busy) => std::thread::yield_now(),
                other => break other.unwrap(),
            }
        };
        assert!(out.status.success(), "{}", text(&out.stderr));
        Lab { dir }
    }

    /// `remem run` (under `wrapper`, e.g. `setpriv …`) with `REMEM_IBV_DEVICES` = `devices`
    /// (unset for `None`) and `extra` arguments before `--`, running `sh -c script`.
    fn run(&self, wrapper: &[&str], devices: Option<&str>, extra: &[&str], script: &str) -> Output {
        let remem = self.dir.join("remem");
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&remem);
                c
            }
            None => Command::new(&remem),
        };
        cmd.arg("run")
            .args(extra)
            .args(["--", "sh", "-c", script])
            .env("REMEM_IBV_LIB", self.dir.join("libremem_ibv.so"))
            .env_remove("REMEM_RUN_NAMESPACE");
        match devices {
            Some(d) => cmd.env(dropin::DEVICES_ENV, d),
            None => cmd.env_remove(dropin::DEVICES_ENV),
        };
        cmd.output().expect("run remem")
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

fn have(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

/// `setpriv` as `nobody` when the tests run as root; nothing otherwise (the tests' own
/// user is unprivileged already). `None` (and a line saying so) when that cannot be done.
fn unprivileged() -> Option<Vec<&'static str>> {
    if !is_root() {
        return Some(Vec::new());
    }
    if !have("setpriv") {
        eprintln!("skipped: running as root, and setpriv (util-linux) is not installed");
        return None;
    }
    Some(vec![
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
    ])
}

/// The script's check of the two devices `rxe0=soft@127.0.0.9,rxe1=soft@127.0.0.10`: the
/// character devices UCX wants, then the sysfs files of the IPv4 GID of rxe0, printed.
fn two_devices_script(k: u32) -> String {
    format!(
        "for d in uverbs0 uverbs1 rdma_cm; do \
           f=/dev/infiniband/$d; test -c $f && test -r $f && test -w $f || {{ echo no $f; exit 3; }}; \
         done; \
         p=/sys/class/infiniband/rxe0/ports/1; \
         cat $p/gids/{k} $p/gid_attrs/types/{k} $p/state $p/link_layer \
             /sys/class/infiniband/rxe0/node_type /sys/class/infiniband/rxe0/node_guid \
             /sys/class/infiniband_verbs/uverbs1/ibdev; \
         id -u"
    )
}

/// What [`two_devices_script`] prints, for the user `uid`; the index of rxe0's IPv4 GID.
fn two_devices_expected(uid: u32) -> (u32, String) {
    let ip: IpAddr = "127.0.0.9".parse().unwrap();
    let table = dropin::program_gid_table(ip);
    let e = table
        .iter()
        .find(|e| e.gid.to_ip() == ip)
        .expect("the table has the address's GID");
    (
        e.index,
        format!(
            "0000:0000:0000:0000:0000:ffff:7f00:0009\nRoCE v2\n4: ACTIVE\nEthernet\n1: CA\n\
             0200:12b7:7f00:0009\nrxe1\n{uid}\n"
        ),
    )
}

const TWO: &str = "rxe0=soft@127.0.0.9,rxe1=soft@127.0.0.10";

#[test]
fn root_sees_the_devices_in_dev_and_sys() {
    if !is_root() {
        eprintln!("skipped: not root (the unprivileged test covers this user)");
        return;
    }
    let lab = Lab::new("root");
    let (k, expected) = two_devices_expected(0);
    let out = lab.run(&[], Some(TWO), &[], &two_devices_script(k));
    let err = text(&out.stderr);
    if err.contains("(cannot make") {
        eprintln!("skipped: root here cannot make a mount namespace (a container?): {err}");
        return;
    }
    assert_eq!(err, "");
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        text(&out.stdout)
    );
    assert_eq!(text(&out.stdout), expected);
    // Everything /dev and /sys/class held is still there.
    let out = lab.run(
        &[],
        Some(TWO),
        &[],
        "ls -A /dev; echo --; ls -A /sys/class; echo --; echo x > /dev/null && echo written",
    );
    let seen = text(&out.stdout);
    let parts: Vec<&str> = seen.split("--\n").collect();
    let [dev, class, written] = parts[..] else {
        panic!("{seen}");
    };
    assert_eq!(written, "written\n");
    for (dir, listing) in [("/dev", dev), ("/sys/class", class)] {
        for name in fs::read_dir(dir).unwrap() {
            let name = name.unwrap().file_name().into_string().unwrap();
            assert!(
                listing.lines().any(|l| l == name),
                "{dir}/{name} is gone: {listing}"
            );
        }
    }
}

#[test]
fn an_unprivileged_user_sees_the_devices_and_keeps_its_uid() {
    let Some(wrapper) = unprivileged() else {
        return;
    };
    let uid = if is_root() {
        65534
    } else {
        rustix::process::geteuid().as_raw()
    };
    let lab = Lab::new("user");
    let (k, expected) = two_devices_expected(uid);
    let out = lab.run(&wrapper, Some(TWO), &[], &two_devices_script(k));
    let err = text(&out.stderr);
    if err.contains("(cannot make") {
        eprintln!("skipped: this kernel refuses unprivileged user namespaces: {err}");
        return;
    }
    assert_eq!(err, "");
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        text(&out.stdout)
    );
    assert_eq!(text(&out.stdout), expected);
}

#[test]
fn the_default_device_is_the_hosts_on_127_0_0_1() {
    let lab = Lab::new("default");
    let p = "/sys/class/infiniband/rxe0/ports/1";
    let out = lab.run(
        &[],
        None,
        &[],
        &format!(
            "test -c /dev/infiniband/uverbs0 || exit 3; cat {p}/gid_attrs/types/0 {p}/state; \
             ls /sys/class/infiniband; test -e /sys/class/infiniband/rxe0/node_guid && echo guid; \
             for g in {p}/gids/*; do test -e $g && cat $g; done; true"
        ),
    );
    let err = text(&out.stderr);
    if err.contains("(cannot make") {
        eprintln!("skipped: no namespace can be made here: {err}");
        return;
    }
    assert!(out.status.success(), "{:?}: {err}", out.status);
    let seen = text(&out.stdout);
    assert!(seen.starts_with("RoCE v2\n4: ACTIVE\nrxe0\n"), "{seen}");
    // Every process shares the device: its node GUID and 127.0.0.1's GID are there.
    assert!(seen.contains("guid"), "{seen}");
    assert!(
        seen.contains("0000:0000:0000:0000:0000:ffff:7f00:0001"),
        "{seen}"
    );
}

#[test]
fn the_namespace_can_be_turned_off() {
    let lab = Lab::new("off");
    let ns = |out: &Output| text(&out.stdout);
    let own = fs::read_link("/proc/self/ns/mnt").unwrap();
    let script = "readlink /proc/self/ns/mnt";
    let on = lab.run(&[], Some(TWO), &[], script);
    let err = text(&on.stderr);
    if err.contains("(cannot make") {
        eprintln!("skipped: no namespace can be made here: {err}");
        return;
    }
    assert_ne!(ns(&on).trim(), own.to_str().unwrap(), "{err}");
    let flag = lab.run(&[], Some(TWO), &["--no-namespace"], script);
    assert_eq!(ns(&flag).trim(), own.to_str().unwrap());
    assert_eq!(text(&flag.stderr), "");
    for value in ["0", "off", "no"] {
        let mut cmd = Command::new(lab.dir.join("remem"));
        let out = cmd
            .args(["run", "--", "sh", "-c", script])
            .env("REMEM_IBV_LIB", lab.dir.join("libremem_ibv.so"))
            .env("REMEM_RUN_NAMESPACE", value)
            .output()
            .unwrap();
        assert_eq!(ns(&out).trim(), own.to_str().unwrap(), "{value}");
        assert_eq!(text(&out.stderr), "", "{value}");
    }
    // A refused configuration: the drop-in will refuse it too; no namespace.
    let bad = lab.run(&[], Some("nonsense"), &[], script);
    assert_eq!(ns(&bad).trim(), own.to_str().unwrap());
    assert!(
        text(&bad.stderr).starts_with("remem run: REMEM_IBV_DEVICES: "),
        "{}",
        text(&bad.stderr)
    );
}

#[test]
fn without_user_namespaces_one_line_says_so_and_the_program_runs() {
    // A kernel that refuses user namespaces, made for this test alone: a user namespace
    // (mapping root and nobody) whose limit of user namespaces is 0, in which remem runs
    // as nobody.
    if !is_root() {
        eprintln!("skipped: making a user namespace with a limit of 0 needs root");
        return;
    }
    if !have("unshare") || !have("setpriv") {
        eprintln!("skipped: unshare and setpriv (util-linux) are not both installed");
        return;
    }
    let lab = Lab::new("nouserns");
    let remem = lab.dir.join("remem");
    // The inner shell is exec'ed after the maps are written, so that it has the
    // namespace's capabilities (needed to set the limit).
    let inner = format!(
        "echo 0 > /proc/sys/user/max_user_namespaces && \
         exec setpriv --reuid=65534 --regid=65534 --clear-groups {} run -- \
         sh -c 'test -e /dev/infiniband/uverbs0 && echo seen; echo ran'",
        remem.display()
    );
    let mut child = Command::new("unshare")
        .args(["--user", "--", "sh", "-c"])
        .arg(format!("echo ready; read go; exec sh -c \"{inner}\""))
        .env("REMEM_IBV_LIB", lab.dir.join("libremem_ibv.so"))
        .env_remove("REMEM_RUN_NAMESPACE")
        .env_remove(dropin::DEVICES_ENV)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    if line != "ready\n" {
        let out = child.wait_with_output().unwrap();
        eprintln!(
            "skipped: unshare --user did not start: {}",
            text(&out.stderr)
        );
        return;
    }
    let pid = child.id();
    for map in ["uid_map", "gid_map"] {
        fs::write(format!("/proc/{pid}/{map}"), "0 0 1\n65534 65534 1\n").unwrap();
    }
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert!(out.status.success(), "{:?}: {err}", out.status);
    assert_eq!(rest, "ran\n", "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(
            "remem run: programs will not see the soft devices in /dev/infiniband and \
             /sys/class/infiniband (cannot make a user namespace: "
        ),
        "{err}"
    );
    assert!(err.contains("running anyway"), "{err}");
}

#[test]
fn ucx_lists_the_device_with_rc_and_ud_verbs() {
    if !have("ucx_info") {
        eprintln!("skipped: ucx_info (Debian ucx-utils) is not installed");
        return;
    }
    // The real drop-in, where cargo builds it (beside the remem executable).
    let exe_dir = Path::new(env!("CARGO_BIN_EXE_remem")).parent().unwrap();
    let lib = exe_dir.join("libremem_ibv.so");
    if !lib.is_file() {
        eprintln!(
            "skipped: {} is not built (cargo build -p remem-ibv)",
            lib.display()
        );
        return;
    }
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_remem"))
            .arg("run")
            .args(extra)
            .args(["--", "ucx_info", "-d"])
            .env("REMEM_IBV_LIB", &lib)
            .env(dropin::DEVICES_ENV, "rxe0=soft@127.0.0.9")
            .env_remove("REMEM_RUN_NAMESPACE")
            .env_remove("UCX_TLS")
            .env_remove("UCX_NET_DEVICES")
            .output()
            .unwrap()
    };
    let out = run(&[]);
    let err = text(&out.stderr);
    if err.contains("(cannot make") {
        eprintln!("skipped: no namespace can be made here: {err}");
        return;
    }
    assert!(out.status.success(), "{:?}: {err}", out.status);
    let seen = text(&out.stdout);
    // The rxe0 memory domain, and in it both transports on rxe0:1.
    let domain = seen
        .split("# Memory domain: ")
        .find(|d| d.starts_with("rxe0\n"))
        .unwrap_or_else(|| panic!("no rxe0 memory domain in: {seen}"));
    for tl in ["rc_verbs", "ud_verbs"] {
        let at = domain
            .find(&format!("Transport: {tl}\n"))
            .unwrap_or_else(|| panic!("no {tl} in: {domain}"));
        assert!(domain[at..].contains("Device: rxe0:1\n"), "{tl}: {domain}");
    }
    // Without the namespace UCX does not list it.
    let off = run(&["--no-namespace"]);
    assert!(!text(&off.stdout).contains("Memory domain: rxe0"));
}

/// rxe's GID table layout through sysfs: index 0 the interface's IPv6 link-local GID,
/// index 1 the IPv4-mapped address, both RoCE v2, both on `lo` for a loopback address.
#[test]
fn sysfs_shows_rxe_s_gid_layout() {
    let lab = Lab::new("layout");
    let p = "/sys/class/infiniband/rxe0/ports/1";
    let out = lab.run(
        &[],
        Some("rxe0=soft@127.0.0.9"),
        &[],
        &format!(
            "cat {p}/gid_attrs/types/0 {p}/gid_attrs/types/1 {p}/gid_attrs/ndevs/0 \
             {p}/gid_attrs/ndevs/1 {p}/gids/1 {p}/gids/0"
        ),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let seen = text(&out.stdout);
    assert!(
        seen.starts_with(
            "RoCE v2\nRoCE v2\nlo\nlo\n0000:0000:0000:0000:0000:ffff:7f00:0009\n\
             fe80:0000:0000:0000:"
        ),
        "{seen}"
    );
}
