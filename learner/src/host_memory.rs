//! This process's peak resident memory, as the kernel counts it (`VmHWM` in
//! `/proc/self/status`): what the learner reports as `peak_rss_mib` and the benchmarks print.
//!
//! Invariant RSS-1: the value only grows over a process's life (the kernel's high-water mark);
//! where the kernel does not report it (not Linux) there is none, never a made-up number.

/// Peak resident memory of this process in MiB; `None` where the kernel does not report it.
pub fn peak_rss_mib() -> Option<f64> {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map(|kib| kib / 1024.0)
}

#[cfg(test)]
mod tests {
    /// RSS-1: the peak covers memory this process touched.
    #[test]
    fn rss1_the_peak_grows_with_what_the_process_touched() {
        let before = super::peak_rss_mib().expect("Linux reports VmHWM");
        assert!(before > 1.0, "{before}");
        let block = vec![1u8; 64 << 20];
        std::hint::black_box(&block);
        let after = super::peak_rss_mib().expect("Linux reports VmHWM");
        assert!(after >= before + 60.0, "{before} -> {after} MiB");
    }
}
