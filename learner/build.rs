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
/// the gloo headers the wheel lacks from csrc/gloo.
fn compile_c10d_shim() {
    println!("cargo:rerun-if-changed=csrc");
    let Some(lib) = torch_lib_dir() else {
        panic!("keel-learner: libtorch not found (set LIBTORCH, or LIBTORCH_USE_PYTORCH=1 with torch installed)");
    };
    let include = std::path::Path::new(&lib).join("../include");
    cc::Build::new()
        .cpp(true)
        .file("csrc/c10d_shim.cpp")
        .include("csrc")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .define("USE_C10D_GLOO", None)
        .warnings(false)
        .compile("keel_c10d_shim");
}
