include!("../build/torch_link.rs");

fn main() {
    emit_torch_rpath();
    compile_c10d_shim();
    // keel-bench-model must see CUDA on GPU machines: Rust links with --as-needed, which drops
    // libtorch_cuda.so (tch never names a symbol from it). Binaries only; tests are CPU.
    println!("cargo:rustc-link-arg-bins=-Wl,--no-as-needed");
    println!("cargo:rustc-link-arg-bins=-ltorch_cuda");
    println!("cargo:rustc-link-arg-bins=-ltorch");
    println!("cargo:rustc-link-arg-bins=-Wl,--as-needed");
}

/// The c10d shim (csrc/README.md): compiled against the headers of the libtorch tch links, with
/// the gloo headers the wheel lacks from csrc/gloo; with NCCL when [`nccl_includes`] finds a
/// CUDA libtorch and the headers NCCL's process group needs.
fn compile_c10d_shim() {
    println!("cargo:rerun-if-changed=csrc");
    let Some(lib) = torch_lib_dir() else {
        panic!("keel-learner: libtorch not found (set LIBTORCH, or LIBTORCH_USE_PYTORCH=1 with torch installed)");
    };
    let lib = std::path::Path::new(&lib);
    let include = lib.join("../include");
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .file("csrc/c10d_shim.cpp")
        .include("csrc")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .define("USE_C10D_GLOO", None)
        .warnings(false);
    match nccl_includes(lib) {
        Ok(dirs) => {
            build
                .define("USE_C10D_NCCL", None)
                .define("KEEL_C10D_NCCL", None);
            for dir in dirs {
                build.include(dir);
            }
            // ProcessGroupNCCL lives in libtorch_cuda; the shim names it, so --as-needed keeps it.
            println!("cargo:rustc-link-lib=dylib=torch_cuda");
        }
        Err(why) => println!("cargo:warning=keel-learner: learner ranks without NCCL ({why})"),
    }
    build.compile("keel_c10d_shim");
}

/// The include folders ProcessGroupNCCL.hpp needs, from the pip packages a CUDA torch wheel
/// brings (`nvidia/cu*/include`: the CUDA runtime; `nvidia/nccl/include`), plus the CUDA
/// compiler's `crt/` and CCCL's `nv/` headers (`nvidia-cuda-crt`, `nvidia-cuda-cccl`, installed
/// by scripts/setup.sh); why not when the libtorch has no CUDA or a header is missing.
fn nccl_includes(lib: &std::path::Path) -> Result<Vec<std::path::PathBuf>, String> {
    if !lib.join("libtorch_cuda.so").exists() {
        return Err(format!("{} has no libtorch_cuda.so", lib.display()));
    }
    let nvidia = lib.join("../../nvidia");
    let cuda = std::fs::read_dir(&nvidia)
        .map_err(|e| format!("{}: {e}", nvidia.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path().join("include"))
        .find(|inc| inc.join("cuda_runtime_api.h").exists())
        .ok_or_else(|| format!("no CUDA runtime headers under {}", nvidia.display()))?;
    let nccl = nvidia.join("nccl/include");
    for (dir, header, package) in [
        (&nccl, "nccl.h", "nvidia-nccl"),
        (&cuda, "crt/host_config.h", "nvidia-cuda-crt"),
        (&cuda, "nv/target", "nvidia-cuda-cccl"),
    ] {
        if !dir.join(header).exists() {
            return Err(format!(
                "{header} missing from {} ({package})",
                dir.display()
            ));
        }
    }
    Ok(vec![cuda, nccl])
}
