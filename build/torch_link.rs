// Shared by the build scripts of every crate whose binaries or tests link libtorch.
// It embeds an RPATH to PyTorch's lib folder so test and CLI binaries start without
// LD_LIBRARY_PATH. The folder comes from $LIBTORCH, else from the python3 that tch's
// build (LIBTORCH_USE_PYTORCH=1) uses.
fn torch_lib_dir() -> Option<String> {
    if let Ok(dir) = std::env::var("LIBTORCH") {
        return Some(format!("{dir}/lib"));
    }
    let python = std::env::var("PYTHON_SYS_EXECUTABLE").unwrap_or_else(|_| "python3".into());
    let out = std::process::Command::new(python)
        .args(["-c", "import torch, os; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn emit_torch_rpath() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=LIBTORCH_USE_PYTORCH");
    if let Some(dir) = torch_lib_dir() {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
