//! Runs the `remem` binary as a user would.

use std::process::Command;

fn remem(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_remem"))
        .args(args)
        .env_remove("REMEM_DEVICE")
        .output()
        .expect("run remem");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn devices_lists_the_loopback_soft_device_with_its_gid() {
    let (ok, stdout, stderr) = remem(&["devices"]);
    assert!(ok, "remem devices failed: {stderr}");
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("soft-lo"))
        .unwrap_or_else(|| panic!("no soft-lo in:\n{stdout}"));
    assert!(line.contains("soft"), "{line}");
    assert!(
        stdout.contains("0000:0000:0000:0000:0000:ffff:7f00:0001  127.0.0.1"),
        "no IPv4-mapped loopback GID in:\n{stdout}"
    );
    assert!(stdout.contains("RoCE v2"));
    // Without -v only RoCE v2 entries are shown.
    assert!(!stdout.contains("RoCE v1"));
}

#[test]
fn devices_verbose_shows_the_table_and_port() {
    let (ok, stdout, _) = remem(&["devices", "--verbose"]);
    assert!(ok);
    // A soft device's table is rxe's: RoCE v2 only, the link-local default GID at 0 (lo's
    // all-zero MAC, with 127.0.0.1's last three bytes), the IPv4 address at 1.
    assert!(!stdout.contains("RoCE v1"), "{stdout}");
    assert!(
        stdout.contains("GID[  0]: fe80:0000:0000:0000:0200:00ff:fe00:0001"),
        "{stdout}"
    );
    assert!(
        stdout.contains("GID[  1]: 0000:0000:0000:0000:0000:ffff:7f00:0001"),
        "{stdout}"
    );
    assert!(stdout.contains("UDP port: 4791"));
}

#[test]
fn help_and_unknown_command() {
    let (ok, stdout, _) = remem(&["--help"]);
    assert!(ok);
    assert!(stdout.contains("devices"));
    let (ok, _, stderr) = remem(&["no-such-command"]);
    assert!(!ok);
    assert!(stderr.contains("unrecognized subcommand"), "{stderr}");
}
