include!("../build/torch_link.rs");

fn main() {
    emit_torch_rpath();
    // keel-bench-model must see CUDA on GPU machines: Rust links with --as-needed, which drops
    // libtorch_cuda.so (tch never names a symbol from it). Binaries only; tests are CPU.
    println!("cargo:rustc-link-arg-bins=-Wl,--no-as-needed");
    println!("cargo:rustc-link-arg-bins=-ltorch_cuda");
    println!("cargo:rustc-link-arg-bins=-ltorch");
    println!("cargo:rustc-link-arg-bins=-Wl,--as-needed");
}
