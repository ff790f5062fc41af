//! `SoftOptions::cpu` pins the device's progress thread to one CPU.

use remem_soft::{SoftContext, SoftOptions};

/// The CPUs the thread named `name` (as in /proc: at most 15 bytes) may run on.
fn allowed_cpus(name: &str) -> Option<String> {
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = task.ok()?.path();
        let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
        if comm.trim_end() == name {
            let status = std::fs::read_to_string(dir.join("status")).ok()?;
            return status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(|v| v.trim().to_string());
        }
    }
    None
}

#[test]
fn progress_thread_is_pinned() {
    let opts = SoftOptions {
        cpu: Some(0),
        ..SoftOptions::default()
    };
    let ctx = SoftContext::bind_with("127.0.8.1:0".parse().unwrap(), &opts).unwrap();
    let name: String = format!("remem-soft {}", ctx.local_addr())
        .chars()
        .take(15)
        .collect();
    // The thread pins itself as it starts: wait (bounded) until it has.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let cpus = allowed_cpus(&name);
        if cpus.as_deref() == Some("0") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "thread {name}: {cpus:?}"
        );
        std::thread::yield_now();
    }
}
